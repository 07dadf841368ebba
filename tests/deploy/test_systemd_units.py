"""deploy/systemd's units checked by the real `systemd-analyze verify` (systemd 252 here): every key known,
every value parsed, the ExecStart binary present. The units name /opt/sentinel/bin/sentinel, the install
path their comments give; the test points that at this checkout's `sentinel` and the EnvironmentFile at
the shipped examples, and fails on any line verify prints, not only on its exit status (unknown keys are
warnings to it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SENTINEL = Path(sys.executable).parent / "sentinel"


def installed(tmp_path: Path, unit: str, edit: str = "") -> Path:
    text = (UNITS / unit).read_text().replace("/opt/sentinel/bin/sentinel", str(SENTINEL))
    for name in ("server", "agent"):
        text = text.replace(f"/etc/sentinel/{name}.env", str(UNITS / f"{name}.env.example"))
    path = tmp_path / unit
    path.write_text(text + edit)
    return path


def verify(path: Path) -> str:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    return f"rc={done.returncode} {done.stdout}{done.stderr}".strip()


@pytest.mark.parametrize("unit", ["sentinel-server.service", "sentinel-agent.service"])
def test_the_unit_verifies_cleanly(tmp_path: Path, unit: str) -> None:
    assert SENTINEL.exists(), SENTINEL
    assert verify(installed(tmp_path, unit)) == "rc=0"


def test_a_bad_key_is_caught(tmp_path: Path) -> None:
    out = verify(installed(tmp_path, "sentinel-server.service", "ProtectSistem=yes\n"))
    assert "Unknown key 'ProtectSistem'" in out


def test_the_agent_unit_passes_its_arguments_to_the_collector() -> None:
    from sentinel.cli import build_parser

    env = dict(line.split("=", 1) for line in (UNITS / "agent.env.example").read_text().splitlines()
               if line and not line.startswith("#"))
    unit = (UNITS / "sentinel-agent.service").read_text()
    start = unit.split("ExecStart=", 1)[1].split("\n\n", 1)[0].split("\nRestart", 1)[0]
    words = start.replace("\\\n", " ").replace("$SENTINEL_AGENT_ARGS", env["SENTINEL_AGENT_ARGS"]).split()
    parsed = build_parser().parse_args(words[1:])
    assert parsed.fn.__name__ == "cmd_collector" and parsed.token_file == "/etc/sentinel/agent-token"
    assert parsed.source == ["nvml", "host", "rdma"] and parsed.listen == "0.0.0.0:9481"
