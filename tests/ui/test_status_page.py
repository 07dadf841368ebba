"""The status page at /ui through the real app, on SQLite and PostgreSQL: login by cookie or bearer, what the
page shows (fleet grid, incidents in their one text, job signals, breaker), escaping; and once in Chromium."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sentinel.config import Settings
from sentinel.incidents import render as incident_text
from sentinel.incidents.findings import Finding, Subject
from sentinel.incidents.service import list_incidents
from sentinel.runtime import Runtime
from sentinel.ui.api import COOKIE
from sentinel.ui.render import gib, pct
from tests.conftest import bearer
from tests.factories import registration, report

HOSTILE = "<script>alert('x')</script>"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    # remediation off: a hand-made quarantine is the only health change, nothing moves under the test
    return Settings(data_dir=tmp_path / "data", database_url=database_url, remediation_enabled=False)


@pytest.fixture
def ui(client: TestClient) -> TestClient:
    return client


def rt(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def xid(code: int, uuid: str, message: str = "", at: float = 1.8e9) -> dict[str, Any]:
    return {"kind": "xid", "accelerator_uuid": uuid, "xid": code, "message": message or f"XID {code}",
            "observed_at": at}


@pytest.fixture
def fleet(ui: TestClient, make_token) -> dict[str, Any]:
    """Two nodes (one with a hostile label and one accelerator gone), samples, a hand quarantine, an XID
    incident, an incident with a hostile title, and a two-rank job with signals and one failure."""
    agent, launcher = bearer(make_token("agent")), bearer(make_token("launcher"))
    node_a = registration("node-a", 2)
    node_a["labels"] = {"rack": HOSTILE}
    for acc in node_a["accelerators"]:
        acc["peak_flops"] = 2e11
    assert ui.post("/api/v1/nodes/register", json=node_a, headers=agent).status_code == 200
    assert ui.post("/api/v1/nodes/register", json=registration("node-b", 2), headers=agent).status_code == 200
    assert ui.post("/api/v1/nodes/register", json=registration("node-b", 1), headers=agent).status_code == 200

    job_id = ui.post("/api/v1/jobs", json={"name": "llm-pretrain", "world_size": 2}, headers=launcher).json()["id"]
    for rank in range(2):
        body = {"rank": rank, "node": "node-a", "accelerators": [f"SIM-node-a-{rank}"], "pid": 1000 + rank}
        assert ui.post(f"/api/v1/jobs/{job_id}/tasks", json=body, headers=launcher).status_code == 201
    body = report("node-a", seq=1, events=[xid(48, "SIM-node-a-0", message=f"driver said {HOSTILE}")])
    body["tasks"] = [{"job_id": job_id, "rank": r, "pid": 1000 + r, "steps": 10, "last_step": 10,
                      "step_seconds": [0.2] * 10, "tokens": 10_000, "busy_seconds": 2.0, "collective_seconds": 0.5,
                      "memory_peak_bytes": 3 * 2**30, "model": {"flops_per_token": 1e9}} for r in range(2)]
    body["task_exits"] = [{"job_id": job_id, "rank": 1, "pid": 1001, "signal": 9, "observed_at": 1.8e9}]
    assert ui.post("/api/v1/nodes/node-a/reports", json=body, headers=agent).status_code == 200
    assert ui.post("/api/v1/nodes/node-b/reports", json=report("node-b", seq=1, accelerators=1),
                   headers=agent).status_code == 200
    assert rt(ui).detection.drain()
    rt(ui).incidents.record([Finding(detector="custom", key="hostile", severity="warning", title=f"odd {HOSTILE}",
                                     layer="software", subject=Subject(node="node-b"), seen="something odd",
                                     next_steps=["look at node-b"])], repeat=False)
    operator = bearer(make_token("operator"))
    assert ui.post("/api/v1/accelerators/SIM-node-a-1/quarantine", json={"reason": "bad", "move_work": False},
                   headers=operator).status_code == 200
    return {"job_id": job_id}


def login(client: TestClient, token: str) -> httpx.Response:
    return client.post("/ui/login", data={"token": token}, follow_redirects=False)


def cell(page: str, uuid: str) -> str:
    found = re.search(rf'<td class="acc (\w+)" data-uuid="{re.escape(uuid)}" data-health="\w+" title="([^"]*)">',
                      page)
    assert found, f"no cell for {uuid}"
    return found.group(1)


def test_without_a_session_the_page_is_only_a_login_form(ui, fleet):
    response = ui.get("/ui")
    assert response.status_code == 200 and 'name="token"' in response.text
    assert "node-a" not in response.text and "llm-pretrain" not in response.text
    assert "script-src" not in response.headers["content-security-policy"], "no script may run at all"
    assert response.headers["cache-control"] == "no-store"


def test_a_bad_token_shows_the_form_again_with_401_and_sets_nothing(ui, fleet, make_token):
    response = login(ui, "snt_not-a-real-token")
    assert response.status_code == 401 and 'name="token"' in response.text
    assert "unknown, revoked or expired" in response.text and "node-a" not in response.text
    assert "set-cookie" not in response.headers
    agent = login(ui, make_token("agent"))
    assert agent.status_code == 403 and "may not read" in agent.text and "set-cookie" not in agent.headers
    assert login(ui, "  ").status_code == 400
    ui.cookies.set(COOKIE, "snt_stale")
    stale = ui.get("/ui")
    assert stale.status_code == 401 and "Your session ended" in stale.text
    assert f'{COOKIE}=""' in stale.headers["set-cookie"] and "Max-Age=0" in stale.headers["set-cookie"]


def test_a_viewer_signs_in_by_cookie_and_sees_the_fleet_incidents_jobs_and_breaker(ui, fleet, make_token,
                                                                                  admin_token):
    response = login(ui, make_token("viewer", "alice"))
    assert response.status_code == 303 and response.headers["location"] == "/ui"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=snt_") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/ui" in cookie and "Secure" not in cookie, "plain http: a Secure cookie would never come back"

    page = ui.get("/ui")
    assert page.status_code == 200 and 'name="token"' not in page.text
    text = page.text
    assert "viewer:alice" in text and 'http-equiv="refresh"' in text
    assert '<tr data-node="node-a">' in text and '<tr data-node="node-b">' in text
    assert cell(text, "SIM-node-a-1") == "quarantined" and cell(text, "SIM-node-a-0") == "healthy"
    assert cell(text, "SIM-node-b-1") == "absent" and cell(text, "SIM-node-b-0") == "healthy"
    assert "50.0 % · 55 °C" in text and "utilization 50.0 %, temperature 55 °C" in text
    assert 'id="breaker" data-open="false"' in text

    with rt(ui).factory() as session:
        incidents, total = list_incidents(session, states=("open", "acknowledged"))
        assert total == 3
        ids = [int(i) for i in re.findall(r'data-incident="(\d+)"', text)]
        assert ids == [i.id for i in incidents] and ids == sorted(ids, reverse=True), "newest first"
        hardware = next(i for i in incidents if i.detector == "hardware")
        headings = [h for h, _ in incident_text.sections(hardware)]
        for heading in ("What was seen", "Compared with", "What Sentinel did", "What to check next"):
            assert heading in headings
        article = text.split(f'data-incident="{hardware.id}"', 1)[1].split("</article>", 1)[0]
        assert html.escape(hardware.title) in article and html.escape(incident_text.subject(hardware)) in article
        for heading, body in incident_text.sections(hardware):
            assert f"<h4>{html.escape(heading)}</h4><pre>{html.escape(body)}</pre>" in article

    m = ui.get(f"/api/v1/jobs/{fleet['job_id']}/metrics", headers=bearer(admin_token)).json()
    row = text.split(f'<tr data-job="{fleet["job_id"]}">', 1)[1].split("</tr>", 1)[0]
    assert "llm-pretrain" in row and m["mfu_ratio"] is not None
    assert f'<td class="num mfu">{pct(m["mfu_ratio"])}</td>' in row
    assert f'<td class="num allreduce">{pct(m["allreduce_time_ratio"])}' in row
    assert f"{gib(m['memory_peak_bytes'])} of {gib(m['memory_capacity_bytes'])}" in row
    assert 'title="signal:SIGKILL: 1">1 (' in row and '<td class="num step">200 ms</td>' in row

    out = ui.post("/ui/logout", follow_redirects=False)
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert 'name="token"' in ui.get("/ui").text


def test_hostile_labels_messages_and_titles_are_escaped(ui, fleet, make_token):
    login(ui, make_token("viewer"))
    text = ui.get("/ui").text
    assert "<script" not in text.lower(), "nothing on the page may be a script"
    assert html.escape(f"rack={HOSTILE}") in text
    assert html.escape(f"odd {HOSTILE}") in text and html.escape(f"driver said {HOSTILE}") in text


def test_a_bearer_header_works_for_curl(ui, fleet, make_token):
    page = ui.get("/ui", headers=bearer(make_token("operator")))
    assert page.status_code == 200 and '<tr data-node="node-a">' in page.text
    assert ui.get("/ui", headers=bearer("snt_nope")).status_code == 401
    assert ui.get("/ui", headers=bearer(make_token("agent"))).status_code == 403


def test_an_open_breaker_is_shown(ui, fleet, make_token):
    rt(ui).remediation.breaker.open = True
    text = ui.get("/ui", headers=bearer(make_token("viewer"))).text
    assert 'id="breaker" data-open="true"' in text and "Circuit breaker OPEN" in text


# --- in a real browser ---------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI: apt-get install -y chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


@pytest.fixture
def sign_in_page() -> Iterator[Callable[[str, str], str]]:
    """A loopback page that posts a token to the server's login form as soon as it loads."""
    pages: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def make(server_url: str, token: str) -> str:
        pages["/"] = (f'<!doctype html><form id="f" method="post" action="{html.escape(server_url)}/ui/login">'
                      f'<input type="hidden" name="token" value="{html.escape(token)}"></form>'
                      "<script>document.getElementById('f').submit()</script>").encode()
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield make
    server.shutdown()


@pytest.mark.slow
def test_the_page_in_headless_chromium(tmp_path: Path, sign_in_page, monkeypatch) -> None:
    """A real server, a node and an XID incident posted over REST with an agent token, then Chromium.

    How Chromium signs in: it cannot be handed a cookie or a header on the command line, and /ui takes no token
    in the URL (URLs leak into logs). So the test serves a one-line page on loopback that submits the login form
    (`POST /ui/login`, field `token`) on load; the server answers 303 with the session cookie and the browser
    follows it to /ui, exactly as a person signing in would. Both are on 127.0.0.1 (ports do not make sites
    differ), so the SameSite=Strict cookie is sent on the redirected GET.
    """
    browser = chromium()
    import tests.live as live

    server = live.LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'sentinel.db'}",
                             extra_env={"SENTINEL_REMEDIATION_ENABLED": "false"})
    server.start()
    try:
        agent = {"authorization": f"Bearer {server.token('agent', 'ui-agent')}"}
        viewer = server.token("viewer", "ui-viewer")
        with httpx.Client(base_url=server.url + "/api/v1", headers=agent, timeout=10) as api:
            assert api.post("/nodes/register", json=registration("gpu-node-7", 4)).status_code == 200
            body = report("gpu-node-7", seq=1, accelerators=4, events=[xid(79, "SIM-gpu-node-7-2", at=time.time())])
            assert api.post("/nodes/gpu-node-7/reports", json=body).status_code == 200
        with server.api() as admin:
            live.wait_for(lambda: admin.get("/incidents").json()["incidents"], what="the XID incident")
            assert admin.post("/accelerators/SIM-gpu-node-7-2/quarantine",
                              json={"reason": "XID 79", "move_work": False}).status_code == 200
        start = sign_in_page(server.url, viewer)

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
            return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                   "--virtual-time-budget=5000", *args, start],
                                  capture_output=True, text=True, timeout=90, check=False)

        dom = run("--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert '<tr data-node="gpu-node-7">' in dom.stdout, dom.stdout[-2000:] + dom.stderr[-2000:]
        assert 'name="token"' not in dom.stdout, "signed in: no login form"
        health = dict(re.findall(r'<td class="acc \w+" data-uuid="(SIM-gpu-node-7-\d)" data-health="(\w+)"',
                                 dom.stdout))
        assert health == {"SIM-gpu-node-7-0": "healthy", "SIM-gpu-node-7-1": "healthy",
                          "SIM-gpu-node-7-2": "quarantined", "SIM-gpu-node-7-3": "healthy"}
        assert "XID 79" in dom.stdout and "What was seen" in dom.stdout and "What to check next" in dom.stdout

        picture = tmp_path / "ui.png"
        shot = run(f"--screenshot={picture}", "--window-size=1280,1024")
        assert shot.returncode == 0 and picture.exists(), shot.stderr[-2000:]
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
        if os.environ.get("SENTINEL_TEST_ARTIFACTS"):
            target = Path(os.environ["SENTINEL_TEST_ARTIFACTS"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(picture, target / "ui.png")
    finally:
        server.stop()
