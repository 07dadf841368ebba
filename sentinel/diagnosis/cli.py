"""`sentinel diagnose JOB [--run [KIND]]`: where a job's step time goes, which layer a slowdown comes from, and
the experiment that confirms it (run with --run, with progress until its verdict)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from sentinel.client import SentinelClient, resolve_token
from sentinel.console import table
from sentinel.diagnosis.components import COMPONENTS


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def cmd_diagnose(args: argparse.Namespace) -> int:
    client = SentinelClient(args.server, resolve_token(args.token))
    found = client.get(f"/jobs/{args.job}/diagnosis")
    print(f"job {args.job}: {found['state']} — {found['detail']}")
    d = found.get("diagnosis")
    ranks = client.get(f"/jobs/{args.job}/ranks")
    if ranks:
        print(table(["RANK", "NODE", "ITER MS", *[c.upper() for c in COMPONENTS], "CPU WAIT"],
                    [(r["rank"], r["node"], _ms(r["iteration_seconds"]), *[_ms(r["components"].get(c))
                                                                         for c in COMPONENTS],
                      "-" if r["cpu_wait_ratio"] is None else f"{r['cpu_wait_ratio']:.0%}") for r in ranks]))
    if d is not None:
        print(f"\nlayer {d['layer']}, component {d['component']} ({d['status']}): {d['title']}")
        for item in d["ruled_out"]:
            print(f"  ruled out {item['what']}: {item['why']}")
        e = d["proposed_experiment"]
        print(f"  proposed experiment: {e['kind']} — {e['why']}; {e['expect']}")
        if d["confirmation"]:
            print(f"  {d['confirmation']}")
    if args.run is not None:
        return _run(client, args, d)
    return 0


def _run(client: SentinelClient, args: argparse.Namespace, d: dict[str, Any] | None) -> int:
    body = {"kind": args.run} if args.run else {}
    if not body and d is None:
        print("nothing to run: no diagnosis proposes an experiment (name one: --run KIND)", file=sys.stderr)
        return 1
    out = client.post(f"/jobs/{args.job}/experiments", body)
    started = time.monotonic()
    while out["state"] == "pending" and time.monotonic() - started < args.wait:
        where = out["node"] or "the server"
        print(f"\r  {out['id']} {out['kind']} on {where}: running {time.monotonic() - started:.0f} s", end="",
              file=sys.stderr, flush=True)
        time.sleep(0.5)
        out = client.get(f"/jobs/{args.job}/experiments/{out['id']}")
    print(file=sys.stderr)
    print(f"{out['id']} {out['kind']}: {out['state']} — {out['summary'] or out['detail'] or out['error']}")
    return 0 if out["state"] == "done" else 1


def add_parser(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("diagnose", help="a job's step-time decomposition, its slowdown's layer, and experiments")
    p.add_argument("job", type=int)
    p.add_argument("--run", nargs="?", const="", default=None, metavar="KIND",
                   help="run the proposed experiment (or KIND) and wait for its verdict")
    p.add_argument("--wait", type=float, default=90.0, help="seconds to wait for an experiment's result")
    remote(p)
    p.set_defaults(fn=cmd_diagnose)
