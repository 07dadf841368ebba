"""`sentinel policy decisions|shadow` against a real server process with a learned placement shadow."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sentinel.policy.cli import choice_text, outcome_text
from tests.factories import registration
from tests.live import LiveServer, sentinel_cmd
from tests.policy.hazard_models import hazard_model


def run_cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sentinel_cmd(*args, "--server", server.url), env=server.env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.slow
def test_decisions_and_the_shadow_summary(tmp_path: Path) -> None:
    model = tmp_path / "learned.json"
    hazard_model().save(model)
    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server.db'}",
                        {"SENTINEL_PLACEMENT_SHADOW": "learned", "SENTINEL_LEARNED_POLICY_PATH": str(model)}).start()
    try:
        with server.api() as api:
            for name in ("node-a", "node-b"):
                assert api.post("/nodes/register", json=registration(name, 2)).status_code == 200
            job = api.post("/jobs", json={"name": "llm", "world_size": 2}).json()["id"]
            assert api.post(f"/jobs/{job}/placement", json={}).status_code == 200
        decisions = run_cli(server, "policy", "decisions", "--kind", "placement", "--job", str(job))
        assert decisions.returncode == 0, decisions.stderr
        header, _, row = decisions.stdout.splitlines()[:3]
        assert header.split() == ["ID", "AT", "KIND", "JOB", "INCIDENT", "ACTIVE", "CHOICE", "SHADOW", "SHADOW",
                                  "CHOICE", "AGREE"]
        assert row.split()[2:] == ["placement", str(job), "-", "best-fit", "r0→node-a", "r1→node-a", "learned",
                                   "r0→node-a", "r1→node-a", "yes"]
        shadow = run_cli(server, "policy", "shadow")
        assert shadow.returncode == 0, shadow.stderr
        rows = [line.split() for line in shadow.stdout.splitlines()[2:]]
        assert rows[0][:6] == ["placement", "best-fit", "learned", "1", "1", "100.0%"]
        assert rows[0][6:13] == ["0", "of", "0", "nodes", "/", "0", "of"], "no disagreement to score yet"
        assert "over the 0 placement(s) where they disagreed" in shadow.stdout
        assert rows[1][:6] == ["checkpoint_interval", "young-daly", "-", "0", "0", "-"]
        refused = run_cli(server, "policy", "decisions", "--limit", "0")
        assert refused.returncode == 1 and "422" in refused.stderr
    finally:
        server.stop()


def test_choices_read_in_a_cell() -> None:
    assert choice_text(None) == "-"
    assert choice_text({"ranks": {"10": {"node": "b"}, "2": {"node": "a"}}}) == "r2→a r10→b"
    assert choice_text({"interval_seconds": 600.4}) == "600s" and choice_text({"interval_seconds": 7200}) == "2.0h"
    assert choice_text({"interval_seconds": None}) == "-" and choice_text({"no_capacity": "x"}) == "no capacity"
    assert choice_text({"error": "RuntimeError: boom"}) == "failed: RuntimeError: boom"
    assert outcome_text(None) == "-"
    assert outcome_text({"active_faulted": 1, "active_nodes": 2, "shadow_faulted": 0, "shadow_nodes": 3}) == \
        "1 of 2 nodes / 0 of 3"
