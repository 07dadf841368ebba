"""`sentinel token create|list|revoke` (on the database, like `db upgrade`) and `sentinel audit` (over REST)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.orm import Session

from sentinel.auth.models import ROLES
from sentinel.client import SentinelClient, resolve_token
from sentinel.config import load_settings
from sentinel.console import table


@contextmanager
def _session(args: argparse.Namespace) -> Iterator[Session]:
    from sentinel.db import make_engine, make_sessionmaker, transaction, upgrade

    url = load_settings(args.config).effective_database_url
    upgrade(url)
    engine = make_engine(url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            yield session
    finally:
        engine.dispose()


def _cli_actor() -> str:
    return f"cli:{os.environ.get('USER', 'unknown')}"


def cmd_token_create(args: argparse.Namespace) -> int:
    from sentinel.audit.service import record
    from sentinel.auth.service import issue_token

    try:
        with _session(args) as session:
            token, secret = issue_token(session, name=args.name, role=args.role, node=args.node,
                                        rate_limit_per_second=args.rate_limit)
            record(session, actor=_cli_actor(), action="token.create", subject=f"token/{args.name}",
                   detail={"id": token.id, "role": args.role, "node": args.node,
                           "rate_limit_per_second": args.rate_limit})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bound = f" for node {args.node!r}" if args.node else " (bound to the first node it registers)" \
        if args.role == "agent" else ""
    print(f"created {args.role} token {args.name!r}{bound}; it is shown once, store it now:", file=sys.stderr)
    print(secret)
    return 0


def _stamp(value: Any) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def cmd_token_list(args: argparse.Namespace) -> int:
    from sentinel.auth.service import list_tokens

    with _session(args) as session:
        rows = [(t.id, t.name, t.role, t.node or "-", "-" if t.rate_limit_per_second is None
                 else f"{t.rate_limit_per_second:g}/s", t.prefix + "…", _stamp(t.created_at), _stamp(t.expires_at),
                 _stamp(t.revoked_at)) for t in list_tokens(session, include_revoked=args.all)]
    print(table(["ID", "NAME", "ROLE", "NODE", "RATE", "PREFIX", "CREATED", "EXPIRES", "REVOKED"], rows))
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from sentinel.audit.service import record
    from sentinel.auth.service import TokenNotFound, find_token, revoke_token

    try:
        with _session(args) as session:
            token = find_token(session, id_or_name=args.token)
            changed = revoke_token(session, token=token)
            if changed:
                record(session, actor=_cli_actor(), action="token.revoke", subject=f"token/{token.name}",
                       detail={"id": token.id, "role": token.role})
            label = f"{token.role} token {token.name!r} (id {token.id})"
    except TokenNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"revoked {label}; servers stop accepting it within 5 s" if changed else f"{label} was already revoked")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    client = SentinelClient(args.server, resolve_token(args.token))
    entries = client.get("/audit", subject=args.subject, actor=args.actor, action=args.action, limit=args.limit)
    print(table(["AT", "ACTOR", "ACTION", "SUBJECT", "REASON / STATUS"],
                [(e["at"][:19], e["actor"], e["action"], e["subject"],
                  e["reason"] or str(e["detail"].get("status", ""))) for e in entries]))
    return 0


def add_parsers(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    tok = sub.add_parser("token", help="API tokens").add_subparsers(dest="token_command", required=True)
    p = tok.add_parser("create", help="create a token; prints it alone on the last line")
    p.add_argument("--role", required=True, choices=list(ROLES))
    p.add_argument("--name", required=True)
    p.add_argument("--node", default=None,
                   help="agent tokens: the node (name or glob like 'sim-*') it may act for; default: the first "
                        "node it registers")
    p.add_argument("--rate-limit", type=float, default=None, metavar="PER_SECOND",
                   help="requests per second for this token (0: unlimited; default: the server's)")
    p.set_defaults(fn=cmd_token_create)
    p = tok.add_parser("list", help="tokens as a table (never their secrets)")
    p.add_argument("--all", action="store_true", help="include revoked tokens")
    p.set_defaults(fn=cmd_token_list)
    p = tok.add_parser("revoke", help="revoke a token by id or name")
    p.add_argument("token", metavar="ID_OR_NAME")
    p.set_defaults(fn=cmd_token_revoke)

    p = sub.add_parser("audit", help="the audit log: who changed what, newest first")
    remote(p)
    p.add_argument("--subject", default=None, help="e.g. node/gpu-7, token/agents")
    p.add_argument("--actor", default=None, help="e.g. operator:alice")
    p.add_argument("--action", default=None, help="e.g. node.cordon, token.revoke, http.post")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(fn=cmd_audit)
