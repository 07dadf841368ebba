"""`sentinel dashboards push`: put Sentinel's Grafana dashboards into a folder of a running Grafana."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sentinel.console import table
from sentinel.grafana.push import GrafanaPushError, push


def resolve_grafana_token(args: argparse.Namespace) -> str:
    """--token, then --token-file, then $GRAFANA_TOKEN; a file keeps the secret out of `ps`."""
    if args.token:
        return str(args.token)
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise GrafanaPushError(f"cannot read the token file {args.token_file}: {exc.strerror}") from exc
    return os.environ.get("GRAFANA_TOKEN", "")


def cmd_push(args: argparse.Namespace) -> int:
    url = args.grafana_url or os.environ.get("GRAFANA_URL", "")
    try:
        if not url:
            raise GrafanaPushError("a Grafana URL is needed (--grafana-url or GRAFANA_URL)")
        results = push(url, resolve_grafana_token(args), folder_uid=args.folder_uid, folder_title=args.folder_title,
                       directory=Path(args.dir) if args.dir else None, timeout=args.timeout)
    except GrafanaPushError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table(["UID", "TITLE", "RESULT", "VERSION"],
                [(r.uid, r.title, r.result, r.version) for r in results]))
    counts = {k: sum(r.result == k for r in results) for k in ("created", "updated", "unchanged")}
    print(f"\n{counts['created']} created, {counts['updated']} updated, {counts['unchanged']} unchanged "
          f"in folder {args.folder_uid!r} at {url}")
    return 0


def add_parser(sub: Any, remote: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Register `sentinel dashboards push`. `remote` (the Sentinel server flags) is accepted for symmetry with the
    other command groups and not used: this talks to Grafana, and its --token is Grafana's."""
    p = sub.add_parser("dashboards", help="Grafana dashboards")
    actions = p.add_subparsers(dest="dashboards_command", required=True)
    q = actions.add_parser("push", help="create or update Sentinel's dashboards in a Grafana folder (idempotent)")
    q.add_argument("--grafana-url", default=None, help="Grafana base URL (default $GRAFANA_URL)")
    q.add_argument("--token", default=None, help="Grafana service-account token (default $GRAFANA_TOKEN)")
    q.add_argument("--token-file", default=None, help="file holding the Grafana token")
    q.add_argument("--folder-uid", default="sentinel", help="folder uid (default: sentinel)")
    q.add_argument("--folder-title", default="Sentinel", help="folder title (default: Sentinel)")
    q.add_argument("--dir", default=None, help="directory of dashboard JSON (default: the repo's dashboards/grafana)")
    q.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each Grafana request")
    q.set_defaults(fn=cmd_push)
