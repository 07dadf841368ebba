"""Scale benchmark: one real server against a synthetic fleet of N nodes from `sentinel simulate`.

    PYTHONPATH=. python benchmarks/scale.py [--nodes 1000,5000,12500] [--duration 60] [--postgres | --database-url URL]

For each N, in this order and each time from scratch: a fresh `sentinel server` (SQLite in a fresh data
directory, or a fresh PostgreSQL database), its resident memory with no nodes (the N=0 baseline of this
size), then `sentinel simulate --nodes N --accelerators 8 --interval 10` in its own process, which mints an
agent token bound to `sim-*` with a rate limit of 2·N/S, registers the nodes, spreads their reports evenly
over the interval and, halfway through, pushes an XID 79 on one node. Measured over the sending window after
`--warmup` seconds: offered vs accepted reports/s, p50/p99 ingest latency (the simulator's round trips),
how far the sender fell behind schedule, server CPU (share of one core) and RSS, memory per node (RSS growth
over the baseline ÷ N), and detection latency (from the XID report's send to the incident being listed by
GET /api/v1/incidents, and the server's own `detection_latency_seconds`). Every acknowledged report must be
in `report_receipts`. Costs are also given per 1,000 nodes and as a ratio to the smallest N of the same run.

`--workers N` runs the server with N edge workers (sentinel/edge/); its CPU and RSS are then the whole process
tree's, the core's share printed apart, with the share of the machine's cores. The server gets
`missed_intervals_down` long enough to cover the simulator's registration (below, in `run_size`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ingest import children, count_receipts, fresh_postgres, machine_cpu_seconds, proc_cpu_seconds, tree_cpu_seconds
from support import HOST, REPO, BenchError, Processes, api, free_port, http_call, ready, say, tail, wait

DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ACCELERATORS = 8


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its live descendants (a server's edge workers)."""
    return own_rss_bytes(pid) + sum(rss_bytes(child) for child in children(pid))


def own_rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class IncidentWatch(threading.Thread):
    """Polls GET /api/v1/incidents for the XID 79 incident on one node; notes when it first appears."""

    def __init__(self, port: int, token: str, node: str):
        super().__init__(daemon=True)
        self.port, self.token, self.node = port, token, node
        self.seen_at: float | None = None
        self.incident: dict[str, Any] | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.seen_at is None:
            with contextlib.suppress(OSError, BenchError, ValueError):
                found = api(self.port, "GET", f"/api/v1/incidents?node={self.node}&state=all", self.token)
                for incident in found["incidents"]:
                    if incident["fingerprint"].endswith("xid=79"):
                        self.seen_at, self.incident = time.time(), incident
            self.stop.wait(0.1)


def server_env(data_dir: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["SENTINEL_DATA_DIR"] = str(data_dir)
    if url:
        env["SENTINEL_DATABASE_URL"] = url
    return env


def run_size(args: argparse.Namespace, nodes: int, url: str, data_dir: Path) -> dict[str, Any]:
    procs = Processes()
    python = sys.executable
    env = server_env(data_dir, url)
    # The simulator registers every node before any sends (~200 registrations/s here), so the first nodes are
    # silent for a minute at 12,500: with the default 3 missed intervals they went down, and 10,000 heartbeat
    # incidents and node-up writes were measured instead of a fleet's steady state. An agent reports at once
    # after it registers; the server is given the registration's length as grace instead.
    env["SENTINEL_MISSED_INTERVALS_DOWN"] = str(3 + math.ceil(nodes / 1500 * 10 / args.interval))
    port = free_port()
    try:
        server = procs.start("server", [python, "-m", "sentinel.cli", "server", "--host", HOST, "--port", str(port),
                                        "--workers", str(args.workers)], env, data_dir / "server.log")
        wait("server ready", lambda: ready(port), 120, procs, [server], poll=0.2)
        time.sleep(3.0)
        rss_empty = rss_bytes(server.pid)
        admin = (data_dir / "admin-token").read_text().strip()
        summary_file = data_dir / f"simulate-{nodes}.json"
        inject_at = args.warmup + (args.duration - args.warmup) / 2
        sim = procs.start("simulate", [
            python, "-m", "sentinel.cli", "simulate", "--server", f"http://{HOST}:{port}",
            "--nodes", str(nodes), "--accelerators", str(ACCELERATORS), "--interval", str(args.interval),
            "--duration", str(args.duration), "--connections", str(args.connections),
            "--inject-xid79-at", f"{inject_at:g}", "--json", str(summary_file)],
            {**env, "SENTINEL_TOKEN": admin}, data_dir / f"simulate-{nodes}.log", stdout=subprocess.PIPE)
        assert sim.stdout is not None
        registered = threading.Event()
        lines: list[str] = []

        def read() -> None:
            assert sim.stdout is not None
            for raw in sim.stdout:
                line = raw.decode(errors="replace").rstrip()
                lines.append(line)
                if args.verbose:
                    say(f"    {line}")
                if "registered" in line:
                    registered.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait("simulated nodes registered", registered.is_set, 900, procs, [server, sim], poll=0.2)
        sending_from = time.monotonic()
        watch = IncidentWatch(port, admin, "sim-00000")
        watch.start()
        time.sleep(args.warmup)
        cpu0 = (tree_cpu_seconds(server.pid), proc_cpu_seconds(sim.pid), *machine_cpu_seconds(), time.monotonic(),
                proc_cpu_seconds(server.pid))
        rss_samples = []
        while time.monotonic() < sending_from + args.duration - 1:
            procs.check_alive(server)
            rss_samples.append(rss_bytes(server.pid))
            time.sleep(1.0)
        cpu1 = (tree_cpu_seconds(server.pid), proc_cpu_seconds(sim.pid), *machine_cpu_seconds(), time.monotonic(),
                proc_cpu_seconds(server.pid))
        rss_full = rss_bytes(server.pid)
        try:
            sim.wait(timeout=args.duration + 300)
        except subprocess.TimeoutExpired as exc:
            raise BenchError("the simulator did not finish") from exc
        reader.join(5)
        watch.join(timeout=max(0.0, 30.0 - (time.monotonic() - sending_from - args.duration)))
        watch.stop.set()
        if not summary_file.exists():
            raise BenchError(f"the simulator wrote no summary (status {sim.returncode})\n" + "\n".join(lines[-20:]))
        summary = json.loads(summary_file.read_text())
        stored = count_receipts(url or f"sqlite:///{data_dir / 'sentinel.db'}")
        status, metrics = http_call(port, "GET", "/metrics", token=admin)
        wall = cpu1[4] - cpu0[4]
        injected = summary.get("injected") or {}
        detected = (watch.seen_at - injected["sent_at"]) if watch.seen_at and "sent_at" in injected else None
        return {
            "nodes": nodes, "accelerators": nodes * ACCELERATORS, "interval_seconds": args.interval,
            "offered_per_second": summary["offered_per_second"], "accepted_per_second": summary["acked_per_second"],
            "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"], "max_ms": summary["max_ms"],
            "max_lag_seconds": summary["max_lag_seconds"], "lost": summary["lost"] + summary["unsent"],
            "failed_attempts": summary["failed_attempts"], "errors": summary["errors"],
            "register_seconds": summary["register_seconds"],
            "server_cpu": (cpu1[0] - cpu0[0]) / wall, "simulator_cpu": (cpu1[1] - cpu0[1]) / wall,
            "core_cpu": (cpu1[5] - cpu0[5]) / wall, "workers": args.workers,
            "server_machine_share": (cpu1[0] - cpu0[0]) / wall / (os.cpu_count() or 1),
            "machine_cpu": (cpu1[2] - cpu0[2]) / wall,
            "rss_empty_bytes": rss_empty, "rss_bytes": rss_full, "rss_peak_bytes": max(rss_samples or [rss_full]),
            "memory_per_node_bytes": (rss_full - rss_empty) / nodes,
            "detection_seconds": detected,
            "server_detection_seconds": (watch.incident or {}).get("detection_latency_seconds"),
            "acked": summary["acked"] + summary["duplicates"], "stored": stored,
            "stored_ok": stored == summary["acked"] + summary["duplicates"],
            "metrics_ok": status == 200 and b"sentinel_ingest_reports_total" in metrics,
            "simulate_exit": sim.returncode, "load_average": load_average(),
        }
    except BenchError:
        for name, _, log in procs.procs:
            say(f"--- {name} log tail ---\n{tail(log)}")
        raise
    finally:
        procs.stop_all()


def growth(rows: list[dict[str, Any]]) -> None:
    """Each cost per 1,000 nodes, and as a ratio to the smallest N's."""
    base = rows[0]
    for row in rows:
        k = row["nodes"] / 1000
        row["per_1k"] = {"server_cpu": row["server_cpu"] / k, "rss_growth_bytes": (row["rss_bytes"]
                                                                                  - row["rss_empty_bytes"]) / k}
        row["ratio_to_smallest"] = {
            name: (row["per_1k"][name] / base["per_1k"][name]) if base["per_1k"][name] else float("nan")
            for name in row["per_1k"]}
        row["ratio_to_smallest"]["p99_ms"] = row["p99_ms"] / base["p99_ms"] if base["p99_ms"] else float("nan")


def print_table(db_label: str, rows: list[dict[str, Any]]) -> None:
    mib = 2**20
    say("")
    say(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; database: {db_label}; "
        f"{ACCELERATORS} accelerators per node, one report per node every {rows[0]['interval_seconds']:g}s")
    header = (f"{'nodes':>6}{'offered/s':>10}{'accepted/s':>11}{'p50 ms':>8}{'p99 ms':>8}{'lag s':>7}{'lost':>6}"
              f"{'srv CPU':>9}{'sim CPU':>9}{'RSS MiB':>9}{'KiB/node':>10}{'detect s':>10}{'load':>16}")
    say(header)
    say("-" * len(header))
    for r in rows:
        detect = f"{r['detection_seconds']:.2f}" if r["detection_seconds"] is not None else "-"
        say(f"{r['nodes']:>6}{r['offered_per_second']:>10.0f}{r['accepted_per_second']:>11.0f}{r['p50_ms']:>8.1f}"
            f"{r['p99_ms']:>8.1f}{r['max_lag_seconds']:>7.2f}{r['lost']:>6d}{r['server_cpu']:>9.0%}"
            f"{r['simulator_cpu']:>9.0%}{r['rss_bytes'] / mib:>9.0f}{r['memory_per_node_bytes'] / 1024:>10.1f}"
            f"{detect:>10}{r['load_average']:>16}")
    say("  (CPU: share of one core over the measured window, the server's edge workers included; RSS: server at "
        "the end of it; KiB/node: RSS growth over the same server with no nodes, ÷ N; detect: XID 79 report sent "
        "→ incident listed)")
    cores = os.cpu_count() or 1
    for r in rows:
        say(f"  N={r['nodes']}: server {r['server_cpu']:.0%} of a core = {r['server_machine_share']:.0%} of the "
            f"machine's {cores} cores (the core process {r['core_cpu']:.0%}, {r['workers']} edge worker(s) "
            f"{r['server_cpu'] - r['core_cpu']:.0%})")
    say("")
    say(f"{'growth per 1k nodes':<22}" + "".join(f"{r['nodes']:>12}" for r in rows))
    say(f"{'  server CPU / 1k':<22}" + "".join(f"{r['per_1k']['server_cpu']:>11.1%} " for r in rows))
    say(f"{'    ratio to smallest':<22}" + "".join(f"{r['ratio_to_smallest']['server_cpu']:>11.2f}x" for r in rows))
    say(f"{'  RSS growth MiB / 1k':<22}" + "".join(f"{r['per_1k']['rss_growth_bytes'] / mib:>12.1f}" for r in rows))
    say(f"{'    ratio to smallest':<22}"
        + "".join(f"{r['ratio_to_smallest']['rss_growth_bytes']:>11.2f}x" for r in rows))
    say(f"{'  p99 latency ratio':<22}" + "".join(f"{r['ratio_to_smallest']['p99_ms']:>11.2f}x" for r in rows))
    for r in rows:
        say(f"  N={r['nodes']}: {r['acked']} acknowledged, {r['stored']} in report_receipts: "
            f"{'ok' if r['stored_ok'] else 'MISMATCH'}; server-side detection latency "
            f"{r['server_detection_seconds'] if r['server_detection_seconds'] is not None else '-'} s; "
            f"errors {r['errors'] or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", default="1000,5000,12500", help="comma-separated fleet sizes")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between a node's reports")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of sending per size")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of sending before measuring")
    parser.add_argument("--connections", type=int, default=32, help="the simulator's keep-alive connections")
    parser.add_argument("--workers", default="0",
                        help="the server's edge workers (sentinel server --workers): 0 (one process), N or auto")
    parser.add_argument("--postgres", action="store_true", help="a fresh PostgreSQL database per size")
    parser.add_argument("--postgres-admin-url", default=DEFAULT_PG_ADMIN_URL)
    parser.add_argument("--database-url", default=None, help="an existing, empty database (one size only)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--verbose", action="store_true", help="echo the simulator's progress lines")
    parser.add_argument("--keep", action="store_true", help="keep data directories and databases")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    if not sizes or args.duration <= args.warmup + 5:
        parser.error("give at least one size, and --duration > --warmup + 5")
    if args.database_url and len(sizes) > 1:
        parser.error("--database-url is one database: give one size (or use --postgres for a fresh one per size)")
    rows = []
    db_label = "PostgreSQL" if args.postgres or (args.database_url or "").startswith("postgresql") else "SQLite"
    try:
        for nodes in sizes:
            data_dir = Path(tempfile.mkdtemp(prefix=f"sentinel-scale-{nodes}-"))
            say(f"N={nodes}: starting a fresh server ({db_label}), load {load_average()}; logs in {data_dir}")
            try:
                with contextlib.ExitStack() as stack:
                    url = args.database_url or ""
                    if args.postgres:
                        url = stack.enter_context(fresh_postgres(args.postgres_admin_url, args.keep))
                    rows.append(run_size(args, nodes, url, data_dir))
            finally:
                if not args.keep:
                    shutil.rmtree(data_dir, ignore_errors=True)
            r = rows[-1]
            say(f"N={nodes}: offered {r['offered_per_second']:.0f}/s, accepted {r['accepted_per_second']:.0f}/s, "
                f"p99 {r['p99_ms']:.1f} ms, server CPU {r['server_cpu']:.0%}, lost {r['lost']}")
    except BenchError as exc:
        say(f"benchmark failed: {exc}")
        return 2
    growth(rows)
    print_table(db_label, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"database": db_label, "rows": rows}, indent=2))
    kept_up = all(r["accepted_per_second"] >= 0.98 * r["offered_per_second"] and r["lost"] == 0 and r["stored_ok"]
                  for r in rows)
    return 0 if kept_up else 1


if __name__ == "__main__":
    sys.exit(main())
