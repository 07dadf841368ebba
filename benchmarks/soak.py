"""Soak: a synthetic fleet with random faults against one server for a long while; nothing lost, nobody
paged twice, memory flat.

    PYTHONPATH=. python benchmarks/soak.py [--nodes 1000] [--minutes 30] [--faults-per-hour 120] [--postgres]

What runs: a loopback webhook receiver (configured as the server's only receiver, min severity warning),
a fresh `sentinel server` (SQLite, or a fresh PostgreSQL database), and `sentinel simulate` with random XID /
ECC faults from the fault catalog for `--minutes`. The server's RSS is sampled every `--sample-seconds`.
At the end, after the alert outbox had time to drain:

* reports: every report the simulator had acknowledged is a row in `report_receipts`, and
  `sentinel_ingest_reports_total` agrees; the simulator lost none (exit status 0);
* faults: every random fault is an occurrence of a hardware incident (a new one, or one more occurrence of
  the incident still open for the same accelerator and fault);
* pages: no notification was delivered twice (per Idempotency-Key), and no incident fingerprint was paged
  as `trigger` by two incidents open at the same time;
* memory: the slope of RSS over time (least squares, after `--warmup`) with its standard error;
  flat means the growth over the whole run is within 2 standard errors or under 2% of the RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ingest import count_receipts, fresh_postgres, metric_value, proc_cpu_seconds
from scale import load_average, rss_bytes, server_env
from support import HOST, BenchError, Processes, api, free_port, http_call, ready, say, tail, wait

DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


class PageCounter:
    """A webhook receiver that answers at once and keeps (key, event, incident id, fingerprint) of each page."""

    def __init__(self) -> None:
        self.pages: list[tuple[str, str, int, str]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(204)
                self.end_headers()
                with contextlib.suppress(ValueError, KeyError):
                    page = json.loads(body)
                    with outer.lock:
                        outer.pages.append((self.headers.get("Idempotency-Key", ""), page["event"],
                                            int(page["incident"]["id"]), page["incident"]["fingerprint"]))

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def slope(samples: list[tuple[float, int]]) -> tuple[float, float]:
    """Least-squares slope of (seconds, bytes) and its standard error, in bytes per second."""
    n = len(samples)
    if n < 3:
        return 0.0, float("inf")
    xs, ys = [s[0] for s in samples], [float(s[1]) for s in samples]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return b, math.sqrt(residual / (n - 2) / sxx)


def incidents(port: int, token: str) -> list[dict[str, Any]]:
    found, offset = [], 0
    while True:
        page = api(port, "GET", f"/api/v1/incidents?state=all&limit=1000&offset={offset}", token)["incidents"]
        found += page
        if len(page) < 1000:
            return found
        offset += 1000


def overlapping_triggers(pages: list[tuple[str, str, int, str]], known: list[dict[str, Any]]) -> list[str]:
    """Fingerprints paged `trigger` by two incidents whose open spans overlap."""
    spans = {i["id"]: (datetime.fromisoformat(i["opened_at"]).timestamp(),
                       datetime.fromisoformat(i["resolved_at"]).timestamp() if i["resolved_at"] else math.inf)
             for i in known}
    by_fingerprint: dict[str, set[int]] = {}
    for _, event, incident_id, fingerprint in pages:
        if event == "trigger":
            by_fingerprint.setdefault(fingerprint, set()).add(incident_id)
    bad = []
    for fingerprint, ids in by_fingerprint.items():
        ordered = sorted(spans.get(i, (0.0, math.inf)) for i in ids)
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ordered)):
            bad.append(fingerprint)
    return bad


def soak(args: argparse.Namespace, url: str, data_dir: Path) -> dict[str, Any]:
    procs, receiver = Processes(), PageCounter()
    python = sys.executable
    env = server_env(data_dir, url)
    env["SENTINEL_RECEIVERS"] = json.dumps([{"name": "soak", "kind": "webhook", "url": receiver.url,
                                             "min_severity": "warning"}])
    port = free_port()
    try:
        server = procs.start("server", [python, "-m", "sentinel.cli", "server", "--host", HOST, "--port", str(port)],
                             env, data_dir / "server.log")
        wait("server ready", lambda: ready(port), 120, procs, [server], poll=0.2)
        admin = (data_dir / "admin-token").read_text().strip()
        summary_file = data_dir / "simulate.json"
        seconds = args.minutes * 60
        sim = procs.start("simulate", [
            python, "-m", "sentinel.cli", "simulate", "--server", f"http://{HOST}:{port}",
            "--nodes", str(args.nodes), "--interval", str(args.interval), "--duration", f"{seconds:g}",
            "--faults-per-hour", f"{args.faults_per_hour:g}", "--seed", str(args.seed), "--json", str(summary_file)],
            {**env, "SENTINEL_TOKEN": admin}, data_dir / "simulate.log")
        started = time.monotonic()
        samples: list[tuple[float, int]] = []
        cpu0 = proc_cpu_seconds(server.pid)
        while sim.poll() is None:
            procs.check_alive(server)
            samples.append((time.monotonic() - started, rss_bytes(server.pid)))
            say(f"  [{samples[-1][0] / 60:5.1f} min] server RSS {samples[-1][1] / 2**20:.0f} MiB, "
                f"{len(receiver.pages)} pages, load {load_average()}")
            deadline = time.monotonic() + args.sample_seconds
            while sim.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        cpu = (proc_cpu_seconds(server.pid) - cpu0) / max(1e-9, time.monotonic() - started)
        if not summary_file.exists():
            raise BenchError(f"the simulator wrote no summary (status {sim.returncode})\n"
                             f"{tail(data_dir / 'simulate.log')}")
        time.sleep(args.settle)  # the outbox delivers what the last faults opened
        summary = json.loads(summary_file.read_text())
        stored = count_receipts(url or f"sqlite:///{data_dir / 'sentinel.db'}")
        _, metrics = http_call(port, "GET", "/metrics", token=admin)
        counted = metric_value(metrics.decode(), "sentinel_ingest_reports_total")
        known = incidents(port, admin)
        with receiver.lock:
            pages = list(receiver.pages)
        keys: dict[str, int] = {}
        for key, *_ in pages:
            keys[key] = keys.get(key, 0) + 1
        # memory: from --warmup on (registration, first windows and caches filled), the fleet at steady work
        steady = [s for s in samples if s[0] >= args.warmup]
        rate, error = slope(steady)
        span = (steady[-1][0] - steady[0][0]) if len(steady) > 2 else 0.0
        growth = rate * span
        flat = abs(growth) <= max(2 * error * span, 0.02 * steady[-1][1]) if len(steady) > 3 else None
        acked = summary["acked"] + summary["duplicates"]
        return {
            "nodes": args.nodes, "minutes": args.minutes, "faults_per_hour": args.faults_per_hour,
            "offered": summary["offered"], "acked": acked, "lost": summary["lost"] + summary["unsent"],
            "stored": stored, "metric": counted, "faults": summary["faults"],
            "simulate_exit": sim.returncode, "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"],
            "max_lag_seconds": summary["max_lag_seconds"], "server_cpu": cpu,
            "incidents": len(known), "pages": len(pages),
            # a fault on an accelerator whose incident for the same fault is still open joins it (one more
            # occurrence), as it should: one page per open fingerprint; every fault is accounted for
            "hardware_occurrences": sum(int(i["occurrences"]) for i in known if i["detector"] == "hardware"),
            "repeats": sum(int(i["occurrences"]) - 1 for i in known if i["detector"] == "hardware"),
            "trigger_pages": sum(1 for p in pages if p[1] == "trigger"),
            "duplicate_deliveries": sum(n - 1 for n in keys.values() if n > 1),
            "overlapping_trigger_fingerprints": overlapping_triggers(pages, known),
            "rss_samples": samples, "rss_slope_mib_per_hour": rate * 3600 / 2**20,
            "rss_slope_stderr_mib_per_hour": error * 3600 / 2**20, "rss_growth_mib": growth / 2**20,
            "memory_flat": flat, "load_average": load_average(),
        }
    except BenchError:
        for name, _, log in procs.procs:
            say(f"--- {name} log tail ---\n{tail(log)}")
        raise
    finally:
        procs.stop_all()
        receiver.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--faults-per-hour", type=float, default=120.0, help="across the fleet (default 120)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sample-seconds", type=float, default=60.0, help="RSS sampling period (default 60)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before memory counts as steady (default 64 x interval + 60: every node's "
                             "last-64-seqs set is full by then)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds for the last pages to go out")
    parser.add_argument("--postgres", action="store_true", help="a fresh PostgreSQL database")
    parser.add_argument("--postgres-admin-url", default=DEFAULT_PG_ADMIN_URL)
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = 64 * args.interval + 60
    data_dir = Path(tempfile.mkdtemp(prefix="sentinel-soak-"))
    say(f"soak: {args.nodes} nodes x 8 accelerators, {args.minutes:g} min, {args.faults_per_hour:g} faults/hour, "
        f"{'PostgreSQL' if args.postgres else 'SQLite'}, load {load_average()}; logs in {data_dir}")
    try:
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(fresh_postgres(args.postgres_admin_url, args.keep)) if args.postgres else ""
            result = soak(args, url, data_dir)
    except BenchError as exc:
        say(f"soak failed: {exc}")
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    ok_reports = result["lost"] == 0 and result["stored"] == result["acked"] and result["metric"] == result["stored"]
    ok_pages = result["duplicate_deliveries"] == 0 and not result["overlapping_trigger_fingerprints"]
    ok_faults = result["hardware_occurrences"] == result["faults"]
    say("")
    say(f"reports   offered {result['offered']}, acknowledged {result['acked']}, stored {result['stored']} "
        f"(report_receipts), counted {result['metric']:.0f} (sentinel_ingest_reports_total), lost {result['lost']}: "
        f"{'ok' if ok_reports else 'MISMATCH'}")
    say(f"latency   p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, max send lag "
        f"{result['max_lag_seconds']:.2f} s; server CPU {result['server_cpu']:.0%} of a core")
    twice = len(result["overlapping_trigger_fingerprints"])
    say(f"faults    {result['faults']} random faults -> {result['hardware_occurrences']} occurrences in hardware "
        f"incidents ({result['repeats']} a repeat on an accelerator whose incident for it was still open): "
        f"{'ok' if ok_faults else 'MISMATCH'}")
    say(f"pages     {result['faults']} random faults -> {result['incidents']} incidents, {result['pages']} pages "
        f"({result['trigger_pages']} trigger); duplicate deliveries {result['duplicate_deliveries']}, fingerprints "
        f"paged twice while open {twice}: {'ok' if ok_pages else 'DUPLICATES'}")
    say(f"memory    RSS {result['rss_samples'][0][1] / 2**20:.0f} -> {result['rss_samples'][-1][1] / 2**20:.0f} MiB; "
        f"slope {result['rss_slope_mib_per_hour']:+.1f} ± {result['rss_slope_stderr_mib_per_hour']:.1f} MiB/hour "
        f"({result['rss_growth_mib']:+.1f} MiB over the run): "
        f"{'flat' if result['memory_flat'] else 'too few samples' if result['memory_flat'] is None else 'GROWING'}")
    say(f"load      {result['load_average']} (2-core machine shared with other work)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if ok_reports and ok_faults and ok_pages and result["memory_flat"] is not False else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
