"""Push `dashboards/grafana/*.json` into one Grafana folder; a second run with nothing changed writes nothing.

Dashboards are matched by their stable `uid`. Before writing, the dashboard Grafana holds is compared with the
file, ignoring the fields Grafana manages (`id`, `version`), so an unchanged dashboard keeps its version history.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import niquests.exceptions
from grafana_client import GrafanaApi, TokenAuth
from grafana_client.client import GrafanaException, GrafanaTimeoutError

import sentinel

log = logging.getLogger("sentinel.grafana")

# Fields Grafana sets on save (and the frontend's save counter): never part of what we compare.
SERVER_MANAGED_FIELDS = frozenset({"id", "version", "iteration"})
PACKAGE_DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards" / "grafana"

Outcome = Literal["created", "updated", "unchanged"]


class GrafanaPushError(Exception):
    """A push that cannot go on; the message is one line an operator can act on."""


@dataclass(frozen=True)
class PushResult:
    uid: str
    title: str
    result: Outcome
    version: int | None
    url: str | None


@dataclass(frozen=True)
class DashboardFile:
    path: Path
    model: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.model["uid"])

    @property
    def title(self) -> str:
        return str(self.model["title"])


def default_directory() -> Path:
    """The repo's `dashboards/grafana`; an installed package has none, so the caller must pass one."""
    if PACKAGE_DASHBOARDS.is_dir():
        return PACKAGE_DASHBOARDS
    raise GrafanaPushError(f"no dashboards directory at {PACKAGE_DASHBOARDS} (installed package?): pass --dir")


def load_dashboards(directory: Path) -> list[DashboardFile]:
    if not directory.is_dir():
        raise GrafanaPushError(f"dashboards directory {directory} does not exist")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise GrafanaPushError(f"no dashboard JSON files in {directory}")
    dashboards: list[DashboardFile] = []
    seen: dict[str, Path] = {}
    for path in files:
        try:
            model = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise GrafanaPushError(f"cannot read dashboard {path}: {_one_line(exc)}") from exc
        if not isinstance(model, dict) or not model.get("uid") or not model.get("title"):
            raise GrafanaPushError(f"dashboard {path} is not a dashboard object with a uid and a title")
        if model["uid"] in seen:
            raise GrafanaPushError(f"dashboards {seen[model['uid']]} and {path} share the uid {model['uid']!r}")
        seen[model["uid"]] = path
        dashboards.append(DashboardFile(path, model))
    return dashboards


def comparable(model: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in model.items() if k not in SERVER_MANAGED_FIELDS}


def push(grafana_url: str, token: str, *, folder_uid: str = "sentinel", folder_title: str = "Sentinel",
         directory: Path | None = None, timeout: float = 10.0) -> list[PushResult]:
    """Create or update the folder, then every dashboard whose content differs from Grafana's; `timeout` in seconds."""
    dashboards = load_dashboards(directory if directory is not None else default_directory())
    api = connect(grafana_url, token, timeout=timeout)
    try:
        with grafana_errors(grafana_url, "reading Grafana's build info", timeout):
            info = api.health.check() or {}
        log.info("Grafana %s at %s", info.get("version", "(unknown version)"), grafana_url)
        ensure_folder(api, grafana_url, uid=folder_uid, title=folder_title, timeout=timeout)
        return [push_dashboard(api, grafana_url, d, folder_uid=folder_uid, timeout=timeout) for d in dashboards]
    finally:
        api.client.s.close()


def connect(grafana_url: str, token: str, *, timeout: float) -> GrafanaApi:
    url = urlparse(grafana_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise GrafanaPushError(f"Grafana URL {grafana_url!r} is not an http(s)://host[:port][/path] URL")
    if not token:
        raise GrafanaPushError("a Grafana service-account token is needed (--token, --token-file or GRAFANA_TOKEN)")
    try:
        port = url.port
    except ValueError as exc:
        raise GrafanaPushError(f"Grafana URL {grafana_url!r} has a bad port") from exc
    # grafana-client joins the prefix and "api" with no separator of its own: "grafana" must become "grafana/"
    prefix = url.path.strip("/")
    return GrafanaApi(auth=TokenAuth(token), host=url.hostname, port=port, protocol=url.scheme,
                      url_path_prefix=f"{prefix}/" if prefix else "", timeout=timeout,
                      user_agent=f"sentinel/{sentinel.__version__}")


def ensure_folder(api: GrafanaApi, grafana_url: str, *, uid: str, title: str, timeout: float) -> Outcome:
    folder = _get_or_none(api.folder.get_folder, uid, grafana_url, f"reading folder {uid!r}", timeout)
    if folder is None:
        with grafana_errors(grafana_url, f"creating folder {uid!r}", timeout):
            api.folder.create_folder(title, uid=uid)
        log.info("created Grafana folder %s (%s)", uid, title)
        return "created"
    if folder.get("title") == title:
        return "unchanged"
    with grafana_errors(grafana_url, f"renaming folder {uid!r}", timeout):
        api.folder.update_folder(uid, title=title, version=folder.get("version"), overwrite=True)
    log.info("renamed Grafana folder %s to %s", uid, title)
    return "updated"


def push_dashboard(api: GrafanaApi, grafana_url: str, dashboard: DashboardFile, *, folder_uid: str,
                   timeout: float) -> PushResult:
    current = _get_or_none(api.dashboard.get_dashboard, dashboard.uid, grafana_url,
                           f"reading dashboard {dashboard.uid!r}", timeout)
    if current is not None:
        meta = current.get("meta", {})
        held = current.get("dashboard", {})
        if comparable(held) == comparable(dashboard.model) and meta.get("folderUid") == folder_uid:
            return PushResult(dashboard.uid, dashboard.title, "unchanged", held.get("version"), meta.get("url"))
    # id null: Grafana finds the dashboard by uid, never by a numeric id that differs between instances
    body = {"dashboard": {**comparable(dashboard.model), "id": None}, "folderUid": folder_uid, "overwrite": True,
            "message": f"Sentinel {sentinel.__version__}: {dashboard.path.name} pushed by `sentinel dashboards push`"}
    with grafana_errors(grafana_url, f"saving dashboard {dashboard.uid!r} ({dashboard.path.name})", timeout):
        saved = api.dashboard.update_dashboard(body) or {}
    outcome: Outcome = "created" if current is None else "updated"
    log.info("%s dashboard %s (%s) version %s", outcome, dashboard.uid, dashboard.title, saved.get("version"))
    return PushResult(dashboard.uid, dashboard.title, outcome, saved.get("version"), saved.get("url"))


def _get_or_none(getter: Any, uid: str, grafana_url: str, action: str, timeout: float) -> dict[str, Any] | None:
    try:
        with grafana_errors(grafana_url, action, timeout, not_found_ok=True):
            found = getter(uid)
    except _NotFound:
        return None
    return found if isinstance(found, dict) else None


class _NotFound(Exception):
    pass


@contextlib.contextmanager
def grafana_errors(grafana_url: str, action: str, timeout: float, *, not_found_ok: bool = False) -> Iterator[None]:
    """Turn grafana-client's and niquests' exceptions into one line that says what failed and what to check."""
    try:
        yield
    except GrafanaTimeoutError as exc:
        raise GrafanaPushError(f"Grafana at {grafana_url} did not answer within {timeout:g}s while {action}") from exc
    except GrafanaException as exc:
        status = exc.status_code
        if status == 404 and not_found_ok:
            raise _NotFound() from exc
        raise GrafanaPushError(_describe(grafana_url, action, status, exc.response, exc.message)) from exc
    except niquests.exceptions.RequestException as exc:
        raise GrafanaPushError(f"cannot reach Grafana at {grafana_url} while {action}: {_reason(exc)}") from exc


def _describe(grafana_url: str, action: str, status: int, response: Any, message: str) -> str:
    detail = response.get("message", "") if isinstance(response, dict) else str(response or "")
    if status == 0:
        return f"cannot reach Grafana at {grafana_url} while {action}: {_one_line(message)}"
    if status == 401:
        return (f"Grafana at {grafana_url} rejected the token (401 Unauthorized) while {action}: "
                "check --token, --token-file or GRAFANA_TOKEN")
    if status == 403:
        return (f"the token may not do this (403 Forbidden) while {action}: give its service account "
                f"the Editor role (Admin to create folders); Grafana said: {_one_line(detail) or 'forbidden'}")
    if status == 412:
        kind = response.get("status", "precondition failed") if isinstance(response, dict) else "precondition failed"
        return f"Grafana refused {action} (412 {kind}): {_one_line(detail) or 'no detail'}"
    return f"Grafana answered {status} while {action}: {_one_line(detail or message) or 'no detail'}"


def _reason(exc: BaseException) -> str:
    """The innermost cause, e.g. "Connection refused", rather than the whole urllib3 chain."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = _one_line(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _one_line(value: object) -> str:
    return " ".join(str(value).split())
