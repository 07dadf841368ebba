"""`sentinel simulate`: arguments, the run, and the summary table."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from sentinel.console import table
from sentinel.simulate import tracecli
from sentinel.simulate.runner import Options, Simulator
from sentinel.simulate.wire import HttpError


def print_summary(summary: dict[str, Any], out: Any = sys.stdout) -> None:
    rows = [("nodes x accelerators", f"{summary['nodes']} x {summary['accelerators'] // max(1, summary['nodes'])}"),
            ("interval", f"{summary['interval_seconds']:g} s"),
            ("scheduled for", f"{summary['duration_seconds']:.1f} s"),
            ("reports offered", f"{summary['offered']} ({summary['offered_per_second']:.1f}/s)"),
            ("reports accepted", f"{summary['acked']} ({summary['acked_per_second']:.1f}/s)"),
            ("duplicates acked", str(summary["duplicates"])),
            ("failed attempts (retried)", str(summary["failed_attempts"])),
            ("lost (refused for good)", str(summary["lost"])),
            ("unsent at the end", str(summary["unsent"])),
            ("faults injected", str(summary["faults"] + (1 if summary["injected"] else 0))),
            ("server failovers", str(summary["failovers"])),
            ("latency p50 / p99 / max", f"{summary['p50_ms']:.1f} / {summary['p99_ms']:.1f} / "
                                        f"{summary['max_ms']:.1f} ms"),
            ("max send lag", f"{summary['max_lag_seconds']:.2f} s")]
    if summary["errors"]:
        rows.append(("errors", ", ".join(f"{k}={v}" for k, v in sorted(summary["errors"].items()))))
    print(table(["", "VALUE"], rows), file=out, flush=True)


def lost_reports(summary: dict[str, Any]) -> int:
    return int(summary["lost"] + summary["unsent"] + max(0, summary["offered"] + bool(summary["injected"])
                                                          - summary["acked"] - summary["duplicates"]
                                                          - summary["lost"] - summary["unsent"]))


def cmd_simulate(args: argparse.Namespace) -> int:
    from sentinel.client import DEFAULT_SERVER, resolve_token

    if args.trace is not None:
        return tracecli.cmd_trace(args)
    args.nodes = 100 if args.nodes is None else args.nodes
    if not (args.nodes >= 1 and 1 <= args.accelerators <= 64 and args.interval > 0 and args.duration > 0
            and args.connections >= 1 and args.faults_per_hour >= 0):
        print("error: need --nodes >= 1, 1 <= --accelerators <= 64, --interval > 0, --duration > 0, "
              "--connections >= 1, --faults-per-hour >= 0", file=sys.stderr)
        return 2
    given = args.server or os.environ.get("SENTINEL_SERVER") or DEFAULT_SERVER
    servers = [u.strip().rstrip("/") for u in given.split(",") if u.strip()]
    opts = Options(nodes=args.nodes, accelerators=args.accelerators, interval=args.interval, duration=args.duration,
                   connections=args.connections, faults_per_hour=args.faults_per_hour, seed=args.seed,
                   prefix=args.prefix, token=resolve_token(args.token), servers=servers,
                   drain_seconds=args.drain, inject_at=args.inject_xid79_at, register_only=args.register_only,
                   mint_agent_token=not args.no_agent_token)
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            summary = runner.run(Simulator(opts).run())
    except HttpError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    lost = lost_reports(summary)
    if lost:
        print(f"error: {lost} reports were not stored", file=sys.stderr)
    return 1 if lost else 0


def add_parser(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register `sentinel simulate`."""
    p = sub.add_parser("simulate", help="drive a synthetic fleet against a running server, or (--trace) replay a "
                                        "fault trace under the recovery policies")
    remote(p)
    p.add_argument("--nodes", type=int, default=None,
                   help="simulated nodes (default 100; with --trace: the modelled cluster, default 400)")
    p.add_argument("--accelerators", type=int, default=8, help="accelerators per node (default 8)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between a node's reports (default 10)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to send reports for (default 60)")
    p.add_argument("--prefix", default="sim-", help="node name prefix (default sim-)")
    p.add_argument("--faults-per-hour", type=float, default=0.0,
                   help="random XID / ECC faults across the fleet per hour (default 0)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--connections", type=int, default=32, help="keep-alive connections to the server (default 32)")
    p.add_argument("--drain", type=float, default=60.0, help="seconds to finish retries after --duration")
    p.add_argument("--inject-xid79-at", type=float, default=None, metavar="SECONDS",
                   help="push an XID 79 on the first node's accelerator 0 this long after sending starts")
    p.add_argument("--register-only", action="store_true", help="register the nodes, send nothing")
    p.add_argument("--no-agent-token", action="store_true",
                   help="send with --token as it is (default: with an admin token, mint an agent token bound to "
                        "PREFIX* with a rate limit of 2·N/S requests/s)")
    p.add_argument("--json", default=None, help="also write the summary to this file ('-': standard output, "
                   "with --trace)")
    tracecli.add_arguments(p)
    p.set_defaults(fn=cmd_simulate)
