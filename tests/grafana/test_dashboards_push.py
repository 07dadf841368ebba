"""`sentinel dashboards push` against FakeGrafana: a Grafana-shaped HTTP server on loopback.

No Grafana can run here, and grafana-client speaks niquests (which request-mocking libraries do not intercept),
so the client talks real HTTP to a test double that checks each request the way Grafana's API does.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import sentinel
from sentinel.grafana.cli import add_parser, cmd_push
from sentinel.grafana.push import PACKAGE_DASHBOARDS, GrafanaPushError, push

TOKEN = "glsa_test_token"


class FakeGrafana:
    """Test double for Grafana's HTTP API: folders and dashboards by uid, bearer tokens, versions, 401/412."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}  # uid -> {"dashboard", "folderUid", "message"}
        self.faults: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
        self.next_id = 1
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def fail_next(self, method: str, path: str, status: int, body: dict[str, Any]) -> None:
        """Fault injection: the next `method path` answers `status` with `body`."""
        self.faults[(method, path)] = (status, body)

    def calls(self, method: str, prefix: str = "") -> list[str]:
        with self.lock:
            return [p for m, p in self.requests if m == method and p.startswith(prefix)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def _serve(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with fake.lock:
                    fake.requests.append((method, path))
                    status, body = fake.answer(method, path, dict(self.headers.items()), raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        if (method, path) in self.faults:
            return self.faults.pop((method, path))
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"message": "invalid API key"}
        body: Any = None
        if method in ("POST", "PUT"):
            if not headers.get("Content-Type", "").startswith("application/json"):
                return 400, {"message": "bad request data: content type must be application/json"}
            try:
                body = json.loads(raw)
            except ValueError:
                return 400, {"message": "bad request data"}
            if not isinstance(body, dict):
                return 400, {"message": "bad request data"}
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/api/frontend/settings":
            return 200, {"buildInfo": {"version": "11.3.0", "edition": "Open Source", "env": "production"}}
        if parts[:2] == ["api", "folders"]:
            return self._folders(method, parts[2:], body)
        if method == "GET" and parts[:3] == ["api", "dashboards", "uid"] and len(parts) == 4:
            return self._get_dashboard(parts[3])
        if method == "POST" and path == "/api/dashboards/db":
            return self._save_dashboard(body)
        return 404, {"message": "Not found"}

    def _folders(self, method: str, rest: list[str], body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET" and len(rest) == 1:
            folder = self.folders.get(rest[0])
            return (200, folder) if folder else (404, {"message": "folder not found", "status": "not-found"})
        if method == "POST" and not rest:
            if not isinstance(body.get("title"), str) or not body["title"]:
                return 400, {"message": "folder title cannot be empty"}
            uid = body.get("uid") or f"f{self.next_id}"
            if uid in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            self.folders[uid] = {"id": self.next_id, "uid": uid, "title": body["title"], "url": f"/dashboards/f/{uid}/",
                                 "version": 1}
            self.next_id += 1
            return 200, self.folders[uid]
        if method == "PUT" and len(rest) == 1 and rest[0] in self.folders:
            folder = self.folders[rest[0]]
            if not body.get("overwrite") and body.get("version") != folder["version"]:
                return 412, {"message": "the folder has been changed by someone else", "status": "version-mismatch"}
            folder.update(title=body.get("title", folder["title"]), version=folder["version"] + 1)
            return 200, folder
        return 404, {"message": "folder not found"}

    def _get_dashboard(self, uid: str) -> tuple[int, dict[str, Any]]:
        held = self.dashboards.get(uid)
        if held is None:
            return 404, {"message": "Dashboard not found"}
        folder = self.folders[held["folderUid"]]
        meta = {"type": "db", "slug": uid, "url": f"/d/{uid}/{uid}", "version": held["dashboard"]["version"],
                "folderUid": folder["uid"], "folderTitle": folder["title"], "folderId": folder["id"],
                "canSave": True, "provisioned": False}
        return 200, {"dashboard": held["dashboard"], "meta": meta}

    def _save_dashboard(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        model = body.get("dashboard")
        if not isinstance(model, dict):
            return 400, {"message": "bad request data: dashboard is required"}
        if not isinstance(body.get("folderUid"), str):
            return 400, {"message": "folderUid is required by this fake (Sentinel always names its folder)"}
        if body["folderUid"] not in self.folders:
            return 400, {"message": "folder not found"}
        if not isinstance(body.get("overwrite"), bool):
            return 400, {"message": "overwrite must be a boolean"}
        for field, kind in (("uid", str), ("title", str), ("panels", list), ("schemaVersion", int)):
            if not isinstance(model.get(field), kind) or (kind is str and not model[field]):
                return 400, {"message": f"dashboard {field} is missing or not a {kind.__name__}"}
        uid = model["uid"]
        held = self.dashboards.get(uid)
        if model.get("id") is not None and (held is None or held["dashboard"]["id"] != model["id"]):
            return 404, {"message": "Dashboard not found", "status": "not-found"}
        if held is not None and not body["overwrite"] and model.get("version") != held["dashboard"]["version"]:
            return 412, {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"}
        if held is None:
            dashboard_id, version = self.next_id, 1
            self.next_id += 1
        else:
            dashboard_id, version = held["dashboard"]["id"], held["dashboard"]["version"] + 1
        stored = {**model, "id": dashboard_id, "uid": uid, "version": version}
        self.dashboards[uid] = {"dashboard": stored, "folderUid": body["folderUid"], "message": body.get("message")}
        return 200, {"id": dashboard_id, "uid": uid, "url": f"/d/{uid}/{uid}", "status": "success",
                     "version": version, "slug": uid, "folderUid": body["folderUid"]}

    def __enter__(self) -> FakeGrafana:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def dashboard_model(uid: str, title: str, expr: str) -> dict[str, Any]:
    panel = {"id": 1, "type": "timeseries", "title": "Series", "gridPos": {"h": 8, "w": 12, "x": 0, "y": 0},
             "targets": [{"expr": expr, "refId": "A"}]}
    return {"id": None, "uid": uid, "title": title, "schemaVersion": 39, "tags": ["sentinel"],
            "time": {"from": "now-1h", "to": "now"}, "panels": [panel]}


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    with FakeGrafana() as fake:
        yield fake


@pytest.fixture
def dashboards_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "dashboards"
    directory.mkdir()
    for uid, title, expr in (("sentinel-fleet", "Sentinel / Fleet", "sentinel_nodes"),
                             ("sentinel-jobs", "Sentinel / Jobs", "sentinel_jobs")):
        (directory / f"{uid}.json").write_text(json.dumps(dashboard_model(uid, title, expr), indent=2))
    return directory


def test_first_push_creates_the_folder_and_every_dashboard(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    results = push(grafana.url, TOKEN, directory=dashboards_dir)

    assert [(r.uid, r.result, r.version) for r in results] == [("sentinel-fleet", "created", 1),
                                                                ("sentinel-jobs", "created", 1)]
    assert grafana.folders["sentinel"]["title"] == "Sentinel"
    for uid in ("sentinel-fleet", "sentinel-jobs"):
        held = grafana.dashboards[uid]
        assert held["folderUid"] == "sentinel"
        assert f"Sentinel {sentinel.__version__}" in held["message"]
    assert grafana.calls("GET", "/api/frontend/settings")


def test_second_push_is_unchanged_and_writes_nothing(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    push(grafana.url, TOKEN, directory=dashboards_dir)
    writes_before = len(grafana.calls("POST")) + len(grafana.calls("PUT"))

    results = push(grafana.url, TOKEN, directory=dashboards_dir)

    assert [r.result for r in results] == ["unchanged", "unchanged"]
    assert [r.version for r in results] == [1, 1]
    assert len(grafana.calls("POST")) + len(grafana.calls("PUT")) == writes_before
    assert grafana.calls("POST", "/api/dashboards/db") == ["/api/dashboards/db"] * 2  # the first push's only


def test_a_changed_file_is_updated_and_the_rest_left_alone(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    push(grafana.url, TOKEN, directory=dashboards_dir)
    jobs_id = grafana.dashboards["sentinel-jobs"]["dashboard"]["id"]
    path = dashboards_dir / "sentinel-jobs.json"
    model = json.loads(path.read_text())
    model["panels"][0]["title"] = "Jobs by state"
    path.write_text(json.dumps(model))

    results = {r.uid: r for r in push(grafana.url, TOKEN, directory=dashboards_dir)}

    assert (results["sentinel-jobs"].result, results["sentinel-jobs"].version) == ("updated", 2)
    assert results["sentinel-fleet"].result == "unchanged"
    assert grafana.dashboards["sentinel-jobs"]["dashboard"]["panels"][0]["title"] == "Jobs by state"
    assert grafana.dashboards["sentinel-jobs"]["dashboard"]["id"] == jobs_id  # same dashboard, not a new one


def test_a_dashboard_in_another_folder_is_moved_back(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    push(grafana.url, TOKEN, directory=dashboards_dir)
    grafana.folders["elsewhere"] = {"id": 99, "uid": "elsewhere", "title": "Elsewhere", "version": 1}
    grafana.dashboards["sentinel-fleet"]["folderUid"] = "elsewhere"

    results = {r.uid: r.result for r in push(grafana.url, TOKEN, directory=dashboards_dir)}

    assert results == {"sentinel-fleet": "updated", "sentinel-jobs": "unchanged"}
    assert grafana.dashboards["sentinel-fleet"]["folderUid"] == "sentinel"


def test_a_renamed_folder_gets_its_title_back(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    push(grafana.url, TOKEN, directory=dashboards_dir)
    grafana.folders["sentinel"]["title"] = "Someone renamed it"

    push(grafana.url, TOKEN, directory=dashboards_dir)

    assert grafana.folders["sentinel"]["title"] == "Sentinel"
    assert grafana.calls("PUT") == ["/api/folders/sentinel"]


def test_a_bad_token_is_a_clear_error(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    with pytest.raises(GrafanaPushError) as caught:
        push(grafana.url, "wrong-token", directory=dashboards_dir)

    message = str(caught.value)
    assert "401" in message and "token" in message and grafana.url in message
    assert "\n" not in message
    assert not grafana.calls("POST")


def test_a_forbidden_token_is_a_clear_error(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    grafana.fail_next("POST", "/api/folders", 403, {"message": "You'll need additional permissions"})

    with pytest.raises(GrafanaPushError, match=r"403 Forbidden.*creating folder 'sentinel'.*additional permissions"):
        push(grafana.url, TOKEN, directory=dashboards_dir)


def test_a_version_mismatch_is_a_clear_error(grafana: FakeGrafana, dashboards_dir: Path) -> None:
    grafana.fail_next("POST", "/api/dashboards/db", 412,
                      {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"})

    with pytest.raises(GrafanaPushError) as caught:
        push(grafana.url, TOKEN, directory=dashboards_dir)

    message = str(caught.value)
    assert "412 version-mismatch" in message and "sentinel-fleet" in message and "changed by someone else" in message
    assert "\n" not in message


def test_an_unreachable_grafana_is_a_clear_error(dashboards_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the push: nothing listens there

    with pytest.raises(GrafanaPushError) as caught:
        push(f"http://127.0.0.1:{port}", TOKEN, directory=dashboards_dir, timeout=2.0)

    message = str(caught.value)
    assert message.startswith(f"cannot reach Grafana at http://127.0.0.1:{port}")
    assert "\n" not in message


def test_bad_inputs_are_clear_errors(grafana: FakeGrafana, tmp_path: Path, dashboards_dir: Path) -> None:
    with pytest.raises(GrafanaPushError, match="does not exist"):
        push(grafana.url, TOKEN, directory=tmp_path / "missing")
    (dashboards_dir / "broken.json").write_text("{not json")
    with pytest.raises(GrafanaPushError, match=r"broken\.json"):
        push(grafana.url, TOKEN, directory=dashboards_dir)
    (dashboards_dir / "broken.json").unlink()
    with pytest.raises(GrafanaPushError, match="not an http"):
        push("grafana:3000", TOKEN, directory=dashboards_dir)
    with pytest.raises(GrafanaPushError, match="token is needed"):
        push(grafana.url, "", directory=dashboards_dir)
    assert grafana.requests == []


def test_an_installed_package_without_dashboards_asks_for_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sentinel.grafana.push.PACKAGE_DASHBOARDS", tmp_path / "site-packages" / "dashboards")

    with pytest.raises(GrafanaPushError, match="pass --dir"):
        push("http://127.0.0.1:1", TOKEN)


def test_a_url_with_a_path_prefix_reaches_the_api_under_it(dashboards_dir: Path) -> None:
    with FakeGrafana() as fake, pytest.raises(GrafanaPushError, match="404"):
        push(f"{fake.url}/grafana", TOKEN, directory=dashboards_dir)
    assert fake.requests[0] == ("GET", "/grafana/api/frontend/settings")


def _cli_args(url: str, directory: Path, **overrides: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sentinel")
    add_parser(parser.add_subparsers(dest="command", required=True), None)
    args = parser.parse_args(["dashboards", "push", "--grafana-url", url, "--dir", str(directory)])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_cli_prints_a_table_and_reads_the_token_from_the_environment(
        grafana: FakeGrafana, dashboards_dir: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    args = _cli_args(grafana.url, dashboards_dir)
    assert args.fn is cmd_push

    assert cmd_push(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["UID", "TITLE", "RESULT", "VERSION"]
    assert lines[2].split() == ["sentinel-fleet", "Sentinel", "/", "Fleet", "created", "1"]
    assert lines[3].split() == ["sentinel-jobs", "Sentinel", "/", "Jobs", "created", "1"]
    assert "2 created, 0 updated, 0 unchanged in folder 'sentinel'" in lines[-1]

    assert cmd_push(args) == 0
    assert capsys.readouterr().out.count("unchanged") == 3  # two rows and the summary


def test_cli_token_file_and_errors(grafana: FakeGrafana, dashboards_dir: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert cmd_push(_cli_args(grafana.url, dashboards_dir, token_file=str(token_file))) == 0
    capsys.readouterr()

    assert cmd_push(_cli_args(grafana.url, dashboards_dir, token="bad")) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: Grafana at") and "401" in captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.skipif(not sorted(PACKAGE_DASHBOARDS.glob("*.json")), reason="dashboards/grafana has no JSON yet")
def test_the_real_dashboards_push_and_stay_unchanged(grafana: FakeGrafana) -> None:
    files = sorted(PACKAGE_DASHBOARDS.glob("*.json"))

    first = push(grafana.url, TOKEN)  # the default directory: the repo's dashboards/grafana

    assert len(first) == len(files)
    assert {r.result for r in first} == {"created"}
    assert all(r.uid.startswith("sentinel-") for r in first)
    assert {r.result for r in push(grafana.url, TOKEN)} == {"unchanged"}
