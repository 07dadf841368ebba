"""`sentinel simulate --trace`: the contract (DESIGN §7) — policies side by side, `--days`, `--json OUT`
with `-` for standard output, and a bad trace is a clear error naming the record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.simulate.conftest import TRACE, event


def sentinel(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel.cli", "simulate", *args], capture_output=True,
                          text=True, timeout=240)


def test_the_trace_replay_prints_the_table_and_writes_one_object_per_policy(tmp_path: Path,
                                                                           figures_file: Path) -> None:
    out = sentinel("--trace", str(TRACE), "--days", "121:174", "--costs", str(figures_file), "--json", "-")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert set(summary["policies"]) == {"none", "heuristic", "learned"}
    for policy in summary["policies"].values():
        assert {"ettr", "serving_slo_attainment", "accelerator_hours_lost"} <= set(policy)
        assert 0 < policy["ettr"] <= 1 and 0 < policy["serving_slo_attainment"] <= 1
    assert "111 faults (5.24 per 1,000 node-days)" in out.stderr  # the table went to stderr: stdout is the JSON
    assert "POLICY" in out.stderr and "learned" in out.stderr
    target = tmp_path / "s.json"
    out = sentinel("--trace", str(TRACE), "--policy", "none", "--days", "0:30", "--seeds", "2", "--costs",
                   str(figures_file), "--json", str(target))
    assert out.returncode == 0, out.stderr
    written = json.loads(target.read_text())
    assert list(written["policies"]) == ["none"] and written["seeds"] == 2
    assert "none over 2 seeds" in out.stdout


def test_bad_input_is_a_clear_error(tmp_path: Path, figures_file: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([event("a", 2.0), event("a", 1.0, "fault_end")]))
    out = sentinel("--trace", str(bad), "--costs", str(figures_file))
    assert out.returncode == 2 and "error: record 1: fault_end at day 1.0 before its fault_start" in out.stderr
    out = sentinel("--trace", str(TRACE), "--days", "9:3", "--costs", str(figures_file))
    assert out.returncode == 2 and "need 0 ≤ A < B" in out.stderr
    out = sentinel("--trace", str(TRACE), "--costs", str(tmp_path / "none.json"))
    assert out.returncode == 2 and "run benchmarks/recovery.py" in out.stderr
    out = sentinel("--trace", str(TRACE), "--training", "500", "--costs", str(figures_file))
    assert out.returncode == 2 and "the cluster has 400" in out.stderr
