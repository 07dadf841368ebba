"""A warm standby for one rank: `python -m sentinel.launcher.standby --preload torch`.

It imports the heavy modules now, then waits for one JSON line on stdin — {"env": {...}, "argv":
[script, args…]} or {"env": {...}, "module": name, "argv": [...]} — sets the environment and runs the
script in this same process, as `python script args…` would. A restart then costs a gloo rendezvous
and a checkpoint load instead of `import torch` (seconds on a small machine). An empty line or EOF
means "not needed": the standby exits quietly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import sys


def main() -> int:
    parser = argparse.ArgumentParser(prog="sentinel-standby")
    parser.add_argument("--preload", action="append", default=[], help="module to import now; repeat")
    args = parser.parse_args()
    for name in args.preload:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"sentinel standby: cannot preload {name}: {exc}", file=sys.stderr, flush=True)
    print("ready", flush=True)  # the launcher waits for this line before counting the standby as warm
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    spec = json.loads(line)
    os.environ.update({str(k): str(v) for k, v in spec.get("env", {}).items()})
    argv = [str(a) for a in spec.get("argv", [])]
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the script's stdin, as under a launcher
    if spec.get("module"):
        sys.argv = [spec["module"], *argv]
        runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
