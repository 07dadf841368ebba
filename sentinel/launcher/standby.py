"""A warm standby for one rank: a process forked from the zygote (zygote.py) with the heavy modules imported.

It blocks reading one JSON line from its pipe — {"env": {...}, "argv": [script, args…]} or {"env": {...},
"module": name, "argv": [...]} — then sets the environment and runs the script in this same process, as
`python script args…` would. A restart then costs a gloo rendezvous and a checkpoint load instead of an
interpreter start and `import torch` (seconds on a small machine). Waiting is a blocking read: an idle
standby costs no CPU. EOF instead of a spec means "not needed": the standby exits quietly.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any


def read_spec(fd: int) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return json.loads(data) if data.strip() else None


def run(spec: dict[str, Any]) -> int:
    """Run the rank's script or module here, as `python script args…` / `python -m module args…` would."""
    os.environ.update({str(k): str(v) for k, v in spec.get("env", {}).items()})
    argv = [str(a) for a in spec.get("argv", [])]
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the script's stdin, as under a launcher
    if spec.get("module"):
        sys.argv = [spec["module"], *argv]
        runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def become(spec_fd: int) -> int:
    """In a freshly forked standby: wait for the spec, then become the rank (or exit 0 when not needed)."""
    spec = read_spec(spec_fd)
    return 0 if spec is None else run(spec)
