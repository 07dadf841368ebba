"""Ingest benchmark: the real server's report path against a parse-only FastAPI baseline.

    PYTHONPATH=. python benchmarks/ingest.py [--nodes 200] [--concurrency 32] [--duration 10] [--postgres]

What runs, each in its own process:

* the Sentinel server (`python -m sentinel.cli server`), with a fresh data directory (SQLite) or a fresh
  PostgreSQL database (`--postgres`), an agent token made with `sentinel token create`, and `--nodes`
  synthetic nodes with 8 accelerators each, registered through the API;
* a bare FastAPI app (below) whose only endpoint, `POST /parse`, reads the body and runs
  `NodeReport.model_validate_json` on it: the floor any ingest path pays. It runs on uvicorn with the
  server's settings (uvloop, httptools, log level warning, no access log, no server header);
* one load generator: a closed loop over `--concurrency` keep-alive HTTP/1.1 connections, written on
  asyncio protocols and raw bytes so that it costs little CPU. On a 2-core machine a second generator
  process would only take CPU from the server it measures; the generator's own CPU use is printed so
  a reader can tell when it, not the server, was the limit.

Both endpoints are driven by the same generator, with the same bodies, at the same concurrency, one
after the other (never at once), each for a warm-up and then `--duration` measured seconds;
`--rounds 2` alternates the order (ABBA) to cancel drift on a noisy machine. Every body is a new
report: each node belongs to one connection, whose `seq` for it only grows, so the server never sees
a duplicate or an out-of-order report. Afterwards the benchmark checks that the server stored exactly
the reports it acknowledged (rows in `report_receipts`, and `sentinel_ingest_reports_total` on
/metrics).

Loopback only. Every loop and wait is bounded, and every process started is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# At module level: the baseline's endpoint annotations are strings (PEP 563) that FastAPI resolves here.
from starlette.requests import Request
from starlette.responses import JSONResponse
from support import (
    HOST,
    REPO,
    BenchError,
    Processes,
    add_record_arguments,
    command_line,
    figure,
    free_port,
    http_call,
    load,
    machine,
    record_figures,
    report_recorded,
    tail,
)

ACCELERATORS_PER_NODE = 8
BODY_VARIANTS = 4  # distinct value sets per node, cycled, so consecutive reports differ
# Long enough that no node goes down while the other endpoint is being measured (down = 3 intervals).
NODE_INTERVAL_SECONDS = 300.0
TARGET_RATIO = 0.5
TARGET_RPS = 1250.0
TARGET_P99_MS = 100.0
DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# --------------------------------------------------------------------------------------------------
# The parse-only baseline (run with --serve-parse-only in its own process)
# --------------------------------------------------------------------------------------------------

def serve_parse_only(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    from sentinel.telemetry.schemas import NodeReport

    app = FastAPI(title="parse-only baseline")

    @app.post("/parse")
    async def parse(request: Request) -> JSONResponse:
        body = await request.body()
        report = NodeReport.model_validate_json(body)
        return JSONResponse({"status": "accepted", "node": report.node, "seq": report.seq})

    # The same settings as `sentinel server` (cmd_server): loop and http "auto" pick uvloop and httptools.
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False, server_header=False)


# --------------------------------------------------------------------------------------------------
# Synthetic nodes and reports
# --------------------------------------------------------------------------------------------------

def node_name(i: int) -> str:
    return f"bench-{i:05d}"


def accelerator_uuid(node: str, index: int) -> str:
    h = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def registration(node: str) -> dict[str, Any]:
    return {"name": node, "hostname": f"{node}.bench.local", "interval_seconds": NODE_INTERVAL_SECONDS,
            "agent_version": "bench", "sources": ["sim:8"],
            "accelerators": [{"uuid": accelerator_uuid(node, i), "index": i, "model": "Bench H100 80GB HBM3",
                              "memory_total_bytes": 85_899_345_920, "source": "sim", "simulated": True}
                             for i in range(ACCELERATORS_PER_NODE)]}


def accelerator_sample(rng: random.Random, uuid_: str) -> dict[str, Any]:
    """25 values: 16 scalars, a throttle reason (not a complaint), 2 XID counters, 3 processes of 2 values."""
    total = 85_899_345_920
    used = rng.randrange(total // 8, total)
    util = rng.random()
    return {
        "uuid": uuid_,
        "utilization_ratio": util,
        "memory_used_bytes": used,
        "memory_total_bytes": total,
        "memory_peak_bytes": min(total, used + rng.randrange(0, 2**30)),
        "power_watts": 90.0 + 610.0 * util,
        "temperature_celsius": 30.0 + 50.0 * util + rng.random(),
        "sm_clock_hz": 1.98e9 - rng.random() * 3e8,
        # A healthy fleet, as the 1,250 reports/s target assumes: not a complaint (live/samples.py). With
        # "hw_slowdown" or "sw_power_cap" on half the samples the throttle detector opened incidents on most
        # accelerators mid-run, and that sweep and its remediation took ~15% of the server at random moments.
        # (The draw stays, so that every other value is the one drawn before.)
        "throttle_reasons": [rng.choice(["sync_boost", "sync_boost"])],
        "ecc_corrected_total": rng.randrange(0, 10_000),
        "ecc_uncorrected_total": 0,
        "retired_pages_total": rng.randrange(0, 4),
        "remapped_rows_total": rng.randrange(0, 4),
        "remap_failure": False,
        "pcie_replay_total": rng.randrange(0, 100),
        "nvlink_errors_total": rng.randrange(0, 100),
        "xid_errors_total": {"13": rng.randrange(0, 3), "31": rng.randrange(0, 3)},
        "processes": [{"pid": rng.randrange(1000, 2**22), "used_bytes": rng.randrange(2**30, used)}
                      for _ in range(3)],
    }


def report_parts(node: str, variant: int) -> tuple[bytes, bytes]:
    """The JSON of a report, split around `seq` and `sent_at`: body = head + seq + b',"sent_at":' + t + tail."""
    rng = random.Random(f"{node}#{variant}")
    rest = {
        "interval_seconds": NODE_INTERVAL_SECONDS,
        "host": {"cpu_ratio": rng.random(), "load1": rng.random() * 64, "memory_used_bytes": rng.randrange(2**36),
                 "memory_total_bytes": 2**41, "disk_used_bytes": rng.randrange(2**40), "disk_total_bytes": 2**42,
                 "net_rx_bytes_total": rng.randrange(2**50), "net_tx_bytes_total": rng.randrange(2**50)},
        "accelerators": [accelerator_sample(rng, accelerator_uuid(node, i)) for i in range(ACCELERATORS_PER_NODE)],
        "events": [],
    }
    head = b'{"node":' + json.dumps(node).encode() + b',"seq":'
    tail = b"," + json.dumps(rest, separators=(",", ":")).encode()[1:]
    return head, tail


# --------------------------------------------------------------------------------------------------
# The load generator (run with --loadgen in its own process; spec on stdin, results on stdout)
# --------------------------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def children(pid: int) -> list[int]:
    """A process's children (every thread's), from /proc; none if it is gone."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(c) for c in fh.read().split()]
    except (OSError, ValueError):
        pass
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its live descendants (a server's edge workers)."""
    return proc_cpu_seconds(pid) + sum(tree_cpu_seconds(child) for child in children(pid))


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


class Phase:
    """One endpoint driven for warm-up + duration seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop, endpoint: str, target: dict[str, Any], token: str,
                 parts: dict[str, list[tuple[bytes, bytes]]], seqs: dict[str, int], warmup: float, duration: float):
        self.loop = loop
        self.endpoint = endpoint
        self.parts = parts
        self.seqs = seqs
        self.warmup = warmup
        self.duration = duration
        self.measure_from = self.stop_at = float("inf")  # set by begin(), once the connections are open
        self.latencies: list[float] = []
        self.acked = 0
        self.duplicates = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self.sent = 0
        self.body_bytes = 0
        port = target["port"]
        self.heads = {
            node: (f"POST {target['path'].format(node=node)} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                   f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                   "Content-Length: ").encode()
            for node in parts
        }

    def begin(self) -> None:
        self.measure_from = time.perf_counter() + self.warmup
        self.stop_at = self.measure_from + self.duration

    def request(self, node: str) -> bytes:
        seq = self.seqs[node] + 1
        self.seqs[node] = seq
        head, tail = self.parts[node][seq % len(self.parts[node])]
        body = b"".join((head, str(seq).encode(), b',"sent_at":', repr(time.time()).encode(), tail))
        self.sent += 1
        self.body_bytes += len(body)
        return b"".join((self.heads[node], str(len(body)).encode(), b"\r\n\r\n", body))

    def record(self, started: float, ended: float, status: int, body: bytes) -> None:
        ok = False
        if status == 200:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = {}
            if answer.get("status") == "accepted":
                ok = True
                self.acked += 1
            elif answer.get("status") == "duplicate":
                self.duplicates += 1
        if not ok:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{status}: {body[:300]!r}")
        if self.measure_from <= ended < self.stop_at and ok:
            self.latencies.append(ended - started)


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request in flight; the next is written as soon as an answer is read."""

    def __init__(self, phase: Phase, nodes: list[str]):
        self.phase = phase
        self.nodes = nodes
        self.turn = 0
        self.buffer = bytearray()
        self.started = 0.0
        self.header_end = -1
        self.status = 0
        self.length = 0
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.done: asyncio.Future[None] = phase.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_next(self) -> None:
        now = time.perf_counter()
        if now >= self.phase.stop_at:
            if not self.done.done():
                self.done.set_result(None)
            return
        node = self.nodes[self.turn % len(self.nodes)]
        self.turn += 1
        request = self.phase.request(node)
        assert self.transport is not None
        self.started = time.perf_counter()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.header_end < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            self.status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self.fail("response without content-length")
                return
            line_end = head.find(b"\r\n", at + 2)
            self.length = int(head[at + 17: line_end if line_end > 0 else len(head)])
            self.header_end = end + 4
        total = self.header_end + self.length
        if len(self.buffer) < total:
            return
        ended = time.perf_counter()
        body = bytes(self.buffer[self.header_end:total])
        del self.buffer[:total]
        self.header_end = -1
        self.phase.record(self.started, ended, self.status, body)
        self.send_next()

    def fail(self, why: str) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection closed by the server: {exc}"))


async def run_phase(endpoint: str, spec: dict[str, Any], parts: dict[str, list[tuple[bytes, bytes]]],
                    seqs: dict[str, int]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    target = spec["targets"][endpoint]
    concurrency = spec["concurrency"]
    nodes = list(parts)
    # Node i belongs to connection i % concurrency alone: its seqs go out in order, never concurrently.
    shares = [nodes[k::concurrency] for k in range(concurrency)]
    phase = Phase(loop, endpoint, target, spec["token"], parts, seqs, spec["warmup"], spec["duration"])
    connections = []
    for share in shares:
        conn = Connection(phase, share)
        await loop.create_connection(lambda conn=conn: conn, HOST, target["port"])  # type: ignore[misc]
        connections.append(conn)
    pids = {name: pid for name, pid in spec["pids"].items()}
    cpu: dict[str, dict[str, float]] = {"start": {}, "end": {}}

    def sample(at: str) -> None:
        cpu[at] = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
        cpu[at]["server_core"] = proc_cpu_seconds(pids["server"])  # without its edge workers
        cpu[at]["loadgen"] = proc_cpu_seconds(os.getpid())
        cpu[at]["machine_busy"], cpu[at]["machine_total"] = machine_cpu_seconds()
        cpu[at]["wall"] = time.perf_counter()

    phase.begin()
    loop.call_later(spec["warmup"], sample, "start")
    loop.call_later(spec["warmup"] + spec["duration"], sample, "end")
    for conn in connections:
        conn.send_next()
    failures = []
    deadline = spec["warmup"] + spec["duration"] + spec["drain_timeout"]
    done, pending = await asyncio.wait([c.done for c in connections], timeout=deadline)
    for fut in done:
        if fut.exception() is not None:
            failures.append(str(fut.exception()))
    if pending:
        failures.append(f"{len(pending)} connections still waiting for an answer after {deadline:.0f}s")
    await asyncio.sleep(max(0.0, phase.stop_at + 0.05 - time.perf_counter()))  # the "end" sample has run
    for conn in connections:
        if conn.transport is not None:
            conn.transport.close()
    lat = sorted(phase.latencies)
    start, end = cpu["start"], cpu["end"]
    wall = end.get("wall", 0.0) - start.get("wall", 0.0) or spec["duration"]
    usage = {name: (end.get(name, 0.0) - start.get(name, 0.0)) / wall for name in [*pids, "loadgen"]}
    busy = (end.get("machine_busy", 0.0) - start.get("machine_busy", 0.0)) / wall
    usage["rest_of_machine"] = max(0.0, busy - sum(usage.values()))
    usage["server_core"] = (end.get("server_core", 0.0) - start.get("server_core", 0.0)) / wall
    return {
        "endpoint": endpoint, "measured": len(lat), "duration": spec["duration"],
        "rps": len(lat) / spec["duration"], "latencies": lat, "acked": phase.acked, "sent": phase.sent,
        "duplicates": phase.duplicates, "errors": phase.errors, "error_samples": phase.error_samples,
        "failures": failures, "body_bytes": phase.body_bytes, "cpu": usage,
    }


async def loadgen_main(spec: dict[str, Any]) -> dict[str, Any]:
    nodes = spec["nodes"]
    parts = {node: [report_parts(node, v) for v in range(BODY_VARIANTS)] for node in nodes}
    # The server's seqs continue from what registration said; the baseline's are its own.
    seqs = {"ingest": {node: int(s) for node, s in nodes.items()}, "parse": dict.fromkeys(nodes, 0)}
    phases = []
    for i, endpoint in enumerate(spec["phases"]):
        if i:
            await asyncio.sleep(spec["pause"])
        phases.append(await run_phase(endpoint, spec, parts, seqs[endpoint]))
    return {"phases": phases, "last_seqs": seqs["ingest"]}


def loadgen_entry() -> None:
    spec = json.loads(sys.stdin.read())
    try:
        import uvloop
        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(loadgen_main(spec))
    json.dump(result, sys.stdout)


# --------------------------------------------------------------------------------------------------
# The orchestrator
# --------------------------------------------------------------------------------------------------

def wait_until(what: str, probe: Any, procs: Processes, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        procs.check_alive(proc)
        try:
            if probe():
                return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise BenchError(f"{what} not ready after {timeout:.0f}s {last}")


@contextlib.contextmanager
def fresh_postgres(admin_url: str, keep: bool) -> Iterator[str]:
    """A new, empty database on the server of `admin_url`, dropped afterwards unless `keep`."""
    try:
        import psycopg
    except ImportError as exc:
        raise BenchError("--postgres needs psycopg: pip install 'psycopg[binary]'") from exc

    name = f"sentinel_bench_{uuid.uuid4().hex[:12]}"
    dsn = admin_url.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise BenchError(f"cannot create a database on {admin_url.split('@')[-1]}: {exc}") from exc
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        if keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def count_receipts(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM report_receipts")).scalar_one())
    finally:
        engine.dispose()


def metric_value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def summarize(phases: list[dict[str, Any]], endpoint: str) -> dict[str, Any]:
    mine = [p for p in phases if p["endpoint"] == endpoint]
    lat = sorted(x for p in mine for x in p["latencies"])
    seconds = sum(p["duration"] for p in mine)
    cpu_names = {k for p in mine for k in p["cpu"]}
    return {
        "endpoint": endpoint, "rps": len(lat) / seconds if seconds else 0.0,
        "rps_per_round": [p["rps"] for p in mine],
        "p50_ms": percentile(lat, 0.50) * 1e3, "p90_ms": percentile(lat, 0.90) * 1e3,
        "p99_ms": percentile(lat, 0.99) * 1e3, "max_ms": (lat[-1] if lat else float("nan")) * 1e3,
        "errors": sum(p["errors"] for p in mine), "duplicates": sum(p["duplicates"] for p in mine),
        "acked": sum(p["acked"] for p in mine), "sent": sum(p["sent"] for p in mine),
        "mean_body_bytes": sum(p["body_bytes"] for p in mine) / max(1, sum(p["sent"] for p in mine)),
        "cpu": {k: sum(p["cpu"].get(k, 0.0) for p in mine) / len(mine) for k in cpu_names},
        "error_samples": [s for p in mine for s in p["error_samples"]][:5],
        "failures": [f for p in mine for f in p["failures"]],
    }


def print_report(args: argparse.Namespace, db_label: str, parse: dict[str, Any], ingest: dict[str, Any],
                 verify: dict[str, Any]) -> bool:
    from importlib.metadata import version

    versions = ", ".join(f"{pkg} {version(pkg)}" for pkg in ("fastapi", "uvicorn", "pydantic", "sqlalchemy"))
    print()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {versions}")
    print(f"database: {db_label}   nodes: {args.nodes} x {ACCELERATORS_PER_NODE} accelerators   "
          f"concurrency: {args.concurrency}   measured: {args.duration:g}s x {args.rounds} round(s) per endpoint "
          f"after {args.warmup:g}s warm-up")
    print(f"mean report body: {ingest['mean_body_bytes']:.0f} bytes "
          f"({ACCELERATORS_PER_NODE} accelerators x 25 values, host metrics, no events)")
    print()
    header = (f"{'endpoint':<30}{'reports/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
              f"{'errors':>8}{'server CPU':>12}{'loadgen CPU':>13}{'other CPU':>11}")
    print(header)
    print("-" * len(header))
    for label, row, proc in (("parse-only  POST /parse", parse, "parse"),
                             ("full ingest POST .../reports", ingest, "server")):
        cpu = row["cpu"]
        other = cpu.get("rest_of_machine", 0.0) + sum(v for k, v in cpu.items()
                                                       if k not in (proc, "loadgen", "rest_of_machine",
                                                                    "server_core"))
        print(f"{label:<30}{row['rps']:>10.0f}{row['p50_ms']:>9.1f}{row['p90_ms']:>9.1f}{row['p99_ms']:>9.1f}"
              f"{row['max_ms']:>9.1f}{row['errors']:>8d}{cpu.get(proc, 0.0):>11.0%}{cpu.get('loadgen', 0.0):>13.0%}"
              f"{other:>11.0%}")
    if args.rounds > 1:
        for row in (parse, ingest):
            print(f"  {row['endpoint']} reports/s by round: {', '.join(f'{x:.0f}' for x in row['rps_per_round'])}")
    print("  (CPU: share of one core during the measured seconds; 'other' is the rest of the machine, "
          "PostgreSQL included)")
    if str(args.workers) != "0":
        core = ingest["cpu"].get("server_core", 0.0)
        print(f"  server CPU with {args.workers} edge worker(s): the core {core:.0%}, the workers "
              f"{ingest['cpu'].get('server', 0.0) - core:.0%}")
    ratio = ingest["rps"] / parse["rps"] if parse["rps"] else 0.0
    checks = [
        ("full ingest / parse-only throughput", f"{ratio:.2f}x", f">= {TARGET_RATIO}x", ratio >= TARGET_RATIO),
        ("full ingest throughput", f"{ingest['rps']:.0f} reports/s", f">= {TARGET_RPS:.0f}",
         ingest["rps"] >= TARGET_RPS),
        ("full ingest p99 latency", f"{ingest['p99_ms']:.1f} ms", f"< {TARGET_P99_MS:.0f} ms",
         ingest["p99_ms"] < TARGET_P99_MS),
    ]
    print()
    for name, value, target, ok in checks:
        print(f"  {name:<38}{value:>18}   target {target:<10} {'ok' if ok else 'MISSED'}")
    print()
    print(f"  stored vs acknowledged: {verify['acked']} reports acknowledged 'accepted' "
          f"(warm-up included), {verify['receipts']} new rows in report_receipts, "
          f"sentinel_ingest_reports_total = {verify['metric']:.0f}, duplicates = {verify['duplicates']}: "
          f"{'ok' if verify['ok'] else 'MISMATCH'}")
    return all(ok for *_, ok in checks)


def orchestrate(args: argparse.Namespace) -> int:
    python = sys.executable
    procs = Processes()
    data_dir = Path(tempfile.mkdtemp(prefix="sentinel-bench-"))
    stack = contextlib.ExitStack()
    try:
        if args.postgres:
            url = stack.enter_context(fresh_postgres(args.postgres_admin_url, args.keep))
        else:
            url = args.database_url or ""
        db_url = url or f"sqlite:///{data_dir / 'sentinel.db'}"
        db_label = db_url.split("@")[-1] if "@" in db_url else db_url
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        env["SENTINEL_DATA_DIR"] = str(data_dir)
        if url:
            env["SENTINEL_DATABASE_URL"] = url
        server_port, parse_port = free_port(), free_port()
        start_load = load()

        print(f"starting the server (port {server_port}, {db_label}) and the parse-only baseline "
              f"(port {parse_port}); logs in {data_dir}", flush=True)
        server = procs.start("server", [python, "-m", "sentinel.cli", "server", "--host", HOST, "--port",
                                        str(server_port), "--workers", str(args.workers)], env,
                             data_dir / "server.log")
        baseline = procs.start("parse-only baseline", [python, str(Path(__file__).resolve()),
                                                       "--serve-parse-only", str(parse_port)],
                               env, data_dir / "baseline.log")
        wait_until("server", lambda: http_call(server_port, "GET", "/readyz", timeout=5)[0] == 200,
                   procs, server, args.start_timeout)
        head, tailpart = report_parts("probe", 0)
        probe = head + b'1,"sent_at":1.0' + tailpart
        wait_until("parse-only baseline", lambda: http_call(parse_port, "POST", "/parse", probe, timeout=5)[0] == 200,
                   procs, baseline, args.start_timeout)

        made = subprocess.run([python, "-m", "sentinel.cli", "token", "create", "--role", "agent", "--name", "bench",
                               "--node", "*", "--rate-limit", "0"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
        if made.returncode != 0 or not made.stdout.strip():
            raise BenchError(f"token create failed ({made.returncode}): {made.stderr[-2000:]}")
        token = made.stdout.strip().splitlines()[-1].strip()
        admin_file = data_dir / "admin-token"
        admin = admin_file.read_text().strip() if admin_file.exists() else None

        print(f"registering {args.nodes} nodes x {ACCELERATORS_PER_NODE} accelerators", flush=True)
        nodes: dict[str, int] = {}
        conn = http.client.HTTPConnection(HOST, server_port, timeout=30)
        try:
            for i in range(args.nodes):
                name = node_name(i)
                conn.request("POST", "/api/v1/nodes/register", body=json.dumps(registration(name)).encode(),
                             headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
                resp = conn.getresponse()
                answer = resp.read()
                if resp.status != 200:
                    raise BenchError(f"registering {name} failed: {resp.status} {answer[:500]!r}")
                nodes[name] = int(json.loads(answer)["last_seq"])
        finally:
            conn.close()
        receipts_before = count_receipts(db_url)

        phases: list[str] = []
        for r in range(args.rounds):
            phases += ["parse", "ingest"] if r % 2 == 0 else ["ingest", "parse"]
        spec = {
            "targets": {"ingest": {"port": server_port, "path": "/api/v1/nodes/{node}/reports"},
                        "parse": {"port": parse_port, "path": "/parse"}},
            "token": token, "nodes": nodes, "concurrency": args.concurrency, "warmup": args.warmup,
            "duration": args.duration, "phases": phases, "pause": 1.0, "drain_timeout": 30.0,
            "pids": {"server": server.pid, "parse": baseline.pid},
        }
        print(f"driving {' -> '.join(phases)}: {args.concurrency} connections, {args.warmup:g}s warm-up + "
              f"{args.duration:g}s each", flush=True)
        budget = len(phases) * (args.warmup + args.duration + 1.0 + 30.0) + 120
        gen = procs.start("load generator", [python, str(Path(__file__).resolve()), "--loadgen"], env,
                          data_dir / "loadgen.log", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            out, _ = gen.communicate(json.dumps(spec).encode(), timeout=budget)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"load generator still running after {budget:.0f}s") from exc
        if gen.returncode != 0:
            raise BenchError(f"load generator failed ({gen.returncode})\n{tail(data_dir / 'loadgen.log')}")
        result = json.loads(out)
        procs.check_alive(server)

        parse = summarize(result["phases"], "parse")
        ingest = summarize(result["phases"], "ingest")
        for row in (parse, ingest):
            for failure in row["failures"]:
                print(f"warning: {row['endpoint']}: {failure}", file=sys.stderr)
            for sample in row["error_samples"]:
                print(f"warning: {row['endpoint']} answered {sample}", file=sys.stderr)

        stored = count_receipts(db_url) - receipts_before
        metric = float("nan")
        if admin:
            status, body = http_call(server_port, "GET", "/metrics", token=admin)
            if status == 200:
                metric = metric_value(body.decode(), "sentinel_ingest_reports_total") or 0.0
        verify = {"acked": ingest["acked"], "receipts": stored, "metric": metric, "duplicates": ingest["duplicates"],
                  "ok": ingest["acked"] == stored and (metric != metric or metric == stored)  # nan: no admin token
                  and ingest["duplicates"] == 0}
        met = print_report(args, db_label, parse, ingest, verify)
        print(f"  load average: {start_load} at the start, {load()} at the end")
        if verify["ok"] and not parse["errors"] and not ingest["errors"]:
            record(args, "postgresql" if url.startswith("postgresql") else "sqlite", parse, ingest, start_load)
        if args.json:
            for row in (parse, ingest):
                row.pop("error_samples", None)
            Path(args.json).write_text(json.dumps({
                "database": "postgresql" if url.startswith("postgresql") else "sqlite", "nodes": args.nodes,
                "concurrency": args.concurrency, "duration": args.duration, "warmup": args.warmup,
                "rounds": args.rounds, "parse": parse, "ingest": ingest, "verify": verify,
                "ratio": ingest["rps"] / parse["rps"] if parse["rps"] else 0.0, "targets_met": met}, indent=2))
        if not verify["ok"] or parse["errors"] or ingest["errors"]:
            return 1
        return 0 if met or not args.check_targets else 3
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        for name, _, log in procs.procs:
            if log is not None and log.exists() and log.stat().st_size:
                print(f"--- {name} log tail ---\n{tail(log)}", file=sys.stderr)
        return 2
    finally:
        procs.stop_all()
        stack.close()
        if args.keep:
            print(f"kept {data_dir}", file=sys.stderr)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def record(args: argparse.Namespace, db: str, parse: dict[str, Any], ingest: dict[str, Any], start_load: str) -> None:
    """Seconds per report on each side (medians over rounds) and the ingest p99, into measured.json."""
    ratio = ingest["rps"] / parse["rps"] if parse["rps"] else 0.0
    conditions = (f"{machine()}; {db}, {args.nodes} nodes x {ACCELERATORS_PER_NODE} accelerators, "
                  f"{args.concurrency} keep-alive connections, {args.rounds} round(s) of {args.duration:g} s per "
                  f"endpoint (ABBA); full ingest {ingest['rps']:.0f} reports/s against parse-only "
                  f"{parse['rps']:.0f} in the same run ({ratio:.2f}x), p99 {ingest['p99_ms']:.1f} ms; "
                  f"every acknowledged report stored; load average {start_load} at the start, {load()} at the end")
    figures = {
        f"ingest_{db}_seconds_per_report": figure([1.0 / r for r in ingest["rps_per_round"] if r > 0]),
        f"ingest_parse_only_{db}_seconds_per_report": figure([1.0 / r for r in parse["rps_per_round"] if r > 0]),
        f"ingest_{db}_p99_seconds": figure([ingest["p99_ms"] / 1e3]),
    }
    if args.record is not None:
        record_figures(figures, source=command_line(), conditions=conditions, path=args.record)
    report_recorded(args.record, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=200, help="synthetic nodes, 8 accelerators each (default 200)")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="keep-alive connections, one request in flight each (default 32; <= --nodes)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per endpoint and round")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each measurement")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of (parse-only, ingest); even rounds run in the other order (default 1)")
    parser.add_argument("--postgres", action="store_true",
                        help="use a fresh PostgreSQL database, made on --postgres-admin-url and dropped after")
    parser.add_argument("--postgres-admin-url", default=DEFAULT_PG_ADMIN_URL,
                        help=f"where --postgres creates its database (default {DEFAULT_PG_ADMIN_URL})")
    parser.add_argument("--database-url", default=None,
                        help="an existing database for the server (SENTINEL_DATABASE_URL); default SQLite in a "
                             "temporary data directory")
    parser.add_argument("--workers", default="0",
                        help="the server's edge workers (sentinel server --workers): 0 (one process), N or auto")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the data directory and database afterwards")
    parser.add_argument("--check-targets", action="store_true", help="exit 3 when a target is missed")
    add_record_arguments(parser)
    parser.add_argument("--start-timeout", type=float, default=90.0, help=argparse.SUPPRESS)
    parser.add_argument("--serve-parse-only", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_parse_only:
        serve_parse_only(args.serve_parse_only)
        return 0
    if args.loadgen:
        loadgen_entry()
        return 0
    if not 1 <= args.concurrency <= args.nodes:
        parser.error("--concurrency must be between 1 and --nodes: each node's reports go over one connection")
    if not (0 < args.duration <= 3600 and 0 <= args.warmup <= 600 and 1 <= args.rounds <= 20
            and 1 <= args.nodes <= 20_000):
        parser.error("--duration, --warmup, --rounds or --nodes out of range")
    if args.postgres and args.database_url:
        parser.error("--postgres makes its own database; give --database-url or --postgres, not both")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
