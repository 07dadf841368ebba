"""`sentinel demo --exit`: the README's main command tells the whole story, and every figure of its
timeline is what the server's API says (checked by starting a server on the demo's database)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import pytest

from tests.live import LiveServer, free_port, sentinel_cmd

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_the_demo_tells_the_story_and_its_figures_are_the_servers(tmp_path: Path):
    data = tmp_path / "demo"
    result = subprocess.run(sentinel_cmd("demo", "--exit", "--data-dir", str(data), "--port", str(free_port())),
                            env={**os.environ, "COLUMNS": "100"}, capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for chapter in ("1. The central service", "2. Two node agents", "3. A real training job", "4. Fault",
                    "5. Detected", "6. What Sentinel did", "7. Stepping again", "timeline"):
        assert chapter in out, chapter
    assert "SIMULATED" in out, "it says what is simulated"
    assert max(len(line) for line in out.splitlines()) <= 100, "fits a 100-column terminal"
    figures = json.loads((data / "timeline.json").read_text())

    server = LiveServer(data / "check", f"sqlite:///{data / 'sentinel.db'}").start()
    try:
        token = (data / "admin-token").read_text().strip()  # the demo's database made it; the check server reuses it
        with httpx.Client(base_url=server.url + "/api/v1", headers={"authorization": f"Bearer {token}"},
                          timeout=10) as api:
            incident = api.get(f"/incidents/{figures['incident_id']}").json()
            assert incident["detection_latency_seconds"] == pytest.approx(figures["detection_latency_seconds"])
            assert incident["detector"] == "hardware" and "XID 79" in incident["title"]
            opened = datetime.fromisoformat(incident["opened_at"]).timestamp()
            assert opened - figures["injected_at"] == pytest.approx(figures["injected_to_open_seconds"])
            texts = [a["text"] for a in incident["actions"]]
            assert any("quarantined accelerator" in t for t in texts) and any("stepping again" in t for t in texts)
            [order] = [o for o in api.get(f"/jobs/{figures['job_id']}/orders", params={"state": "all"}).json()
                       if o["id"] == figures["order_id"]]
            assert order["recovery_seconds"] == pytest.approx(figures["recovery_seconds"])
            completed = datetime.fromisoformat(order["completed_at"]).timestamp()
            assert completed - figures["injected_at"] == pytest.approx(figures["injected_to_stepping_seconds"])
            assert order["lost_steps"] == figures["lost_steps"]
            # the drained node's local disk does not count: the ranks resumed from the shared tier, from the
            # plan's step or a newer one the old ranks committed before they were stopped
            assert order["checkpoint_step"] == figures["checkpoint_step"] and figures["restored_tier"] == "persistent"
            assert figures["restored_step"] >= figures["checkpoint_step"] > 0
            # only the steps since that checkpoint are redone (the job steps on until its ranks are stopped);
            # the server counts those it saw (telemetry and checkpoint shards), never more than the job's own log
            assert 0 <= figures["lost_steps"] <= figures["redone_steps"]
            assert figures["redone_steps"] <= figures["step_at_fault"] - figures["restored_step"] + 200
            assert {s["node"] for s in order["placement"]} == {"demo-node-2"}, "the job moved to the spare"
            accelerators = {a["uuid"]: a["health"] for a in api.get("/accelerators").json()}
            assert accelerators["SIM-demo-node-1-1"] == "quarantined"
        # goodput = 1 − (recovery + lost steps × median step) ÷ time since the job started, from the same figures
        assert 0 < figures["goodput_ratio"] < 1
        wasted = figures["recovery_seconds"] + figures["lost_steps"] * figures["step_seconds_p50"]
        assert wasted > 0 and figures["goodput_ratio"] <= 1 - wasted / (wasted + 600)
    finally:
        server.stop()
    for figure in (f"{figures['detection_latency_seconds']:.3f} s", f"{figures['recovery_seconds']:.2f} s",
                   str(figures["lost_steps"])):
        assert figure in out, f"the timeline shows {figure}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_a_stopped_demo_leaves_none_of_its_processes(tmp_path: Path, sig: int) -> None:
    """Stopped while its job starts (server, agents, launcher, zygote, ranks all up): the whole tree goes, and
    a SIGTERM exits 128 + 15 after stopping it; a SIGKILL leaves it to the tethers."""
    out = tmp_path / "out.txt"
    tree: list[psutil.Process] = []
    with open(out, "wb") as fh:
        demo = subprocess.Popen(sentinel_cmd("demo", "--data-dir", str(tmp_path / "demo"), "--port", str(free_port())),
                                env={**os.environ, "COLUMNS": "100"}, stdout=fh, stderr=fh, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("sentinel.launcher.zygote" in _command(p) for p in tree):
            time.sleep(0.2)
            tree = psutil.Process(demo.pid).children(recursive=True)
        assert "3. A real training job" in out.read_text() and len(tree) >= 5, out.read_text()

        os.kill(demo.pid, sig)
        code = demo.wait(60)

        assert code == (-sig if sig == signal.SIGKILL else 128 + sig), out.read_text()[-2000:]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(tree):
            time.sleep(0.2)
        assert _alive(tree) == []
    finally:
        for p in _alive(tree):  # whatever a failing test left running
            p.kill()
        if demo.poll() is None:
            demo.kill()


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            continue
    return left


def test_the_serving_demo_replaces_the_frozen_replica_and_no_client_request_fails(tmp_path: Path):
    data = tmp_path / "serving"
    result = subprocess.run(sentinel_cmd("demo", "--serving", "--exit", "--data-dir", str(data), "--port",
                                         str(free_port())),
                            env={**os.environ, "COLUMNS": "100"}, capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for chapter in ("3. A serving job", "NOT a model", "4. Client load", "5. Fault", "6. Detected by serving_stall",
                    "7. What Sentinel did", "what the clients saw", "timeline"):
        assert chapter in out, chapter
    assert max(len(line) for line in out.splitlines()) <= 100, "fits a 100-column terminal"
    figures = json.loads((data / "timeline.json").read_text())
    assert figures["detector"] == "serving_stall" and figures["injected_to_serving_seconds"] < 30
    assert "replica r1 → r1.a1" in figures["order_result"] and "0 failed" in figures["order_result"]
    assert figures["client_fault_to_cutover"]["failed"] == 0, "the streams cut by the stop were resumed"
    assert figures["client_after_cutover"]["requests"] > 0 and figures["client_after_cutover"]["failed"] == 0
    server = LiveServer(data / "check", f"sqlite:///{data / 'sentinel.db'}").start()
    try:
        token = (data / "admin-token").read_text().strip()
        with httpx.Client(base_url=server.url + "/api/v1", headers={"authorization": f"Bearer {token}"},
                          timeout=10) as api:
            orders = api.get(f"/jobs/{figures['job_id']}/orders", params={"state": "all"}).json()
            assert [(o["kind"], o["state"]) for o in orders] == [("replace_replica", "done")], \
                "one replacement: the replaced replica's last frozen report stalls nothing after it"
            assert [s["rank"] for s in orders[0]["placement"] if s.get("replace")] == [1]
    finally:
        server.stop()
