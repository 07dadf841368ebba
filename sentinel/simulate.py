"""`sentinel simulate`: a synthetic fleet driven against a running server from one cheap process.

Every node registers with the real `NodeRegistration` and sends real `NodeReport`s (growing `seq`, 8
accelerator samples, host metrics) on `POST /api/v1/nodes/{node}/reports`, its phase spread evenly over
the interval. Bodies are assembled from pre-rendered JSON fragments (one per utilization level, as
`collectors/sim.py` derives power and temperature from utilization), so a report costs a few string joins,
and a node's state is its `seq`. The HTTP client is a minimal HTTP/1.1 keep-alive client on asyncio streams:
one connection per sender, `--connections` in all. A report that fails is retried in seq order, like the
agent's spool, and counted; one the server refuses for good is lost, and the exit status says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sentinel.console import table
from sentinel.telemetry.schemas import AcceleratorInfo, NodeRegistration

SIM_MODEL = "sim-h100-80gb"  # as collectors/sim.py
MEMORY_TOTAL_BYTES = 80 * 2**30
WORKING_SET_BYTES = 60 * 2**30
IDLE_WATTS, MAX_WATTS = 70.0, 700.0
PEAK_FLOPS = 989e12
LEVELS = 101  # utilization 0.00 … 1.00
PROGRESS_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 5.0


def default_xids() -> list[int]:
    """XID codes that open incidents, from the fault catalog (79, 48, 94, 13, …)."""
    from sentinel.detection.catalog import FaultCatalog

    catalog = FaultCatalog.load()
    return sorted(code for code, entry in catalog.xids.items() if entry.opens_incident)


def node_name(prefix: str, index: int) -> str:
    return f"{prefix}{index:05d}"


def accelerator_uuid(node: str, index: int) -> str:
    return f"SIM-{node}-{index}"  # as collectors/sim.py


def registration(node: str, accelerators: int, interval_seconds: float) -> NodeRegistration:
    return NodeRegistration(
        name=node, hostname=f"{node}.sim", interval_seconds=interval_seconds, agent_version="simulate",
        sources=[f"sim:{accelerators}"], labels={"simulated": "true"},
        accelerators=[AcceleratorInfo(uuid=accelerator_uuid(node, i), index=i, model=SIM_MODEL,
                                      memory_total_bytes=MEMORY_TOTAL_BYTES, source="sim", simulated=True,
                                      peak_flops=PEAK_FLOPS) for i in range(accelerators)])


def sample_fields(utilization: float, xids: dict[str, int] | None = None, ecc_uncorrected: int = 0) -> dict[str, Any]:
    """An accelerator sample's fields but its uuid, derived from utilization as collectors/sim.py does."""
    # A training job's memory is flat once it runs: a fixed working set with a little noise (no trend, no "leak").
    used = WORKING_SET_BYTES + (round(utilization * 100) % 7) * 16 * 2**20
    return {"utilization_ratio": round(utilization, 2), "memory_used_bytes": used,
            "memory_total_bytes": MEMORY_TOTAL_BYTES, "memory_peak_bytes": WORKING_SET_BYTES + 2**30,
            "power_watts": round(IDLE_WATTS + (MAX_WATTS - IDLE_WATTS) * utilization, 1),
            "temperature_celsius": round(32.0 + 45.0 * utilization, 1), "sm_clock_hz": 1.98e9,
            "throttle_reasons": [], "ecc_corrected_total": 0, "ecc_uncorrected_total": ecc_uncorrected,
            "retired_pages_total": 0, "remapped_rows_total": 0, "remap_failure": False, "pcie_replay_total": 0,
            "nvlink_errors_total": 0, "xid_errors_total": xids or {}, "processes": []}


def _fragment(fields: dict[str, Any]) -> bytes:
    """`,"utilization_ratio":…}`: what follows `{"uuid":"…"` in a sample."""
    return b"," + json.dumps(fields, separators=(",", ":")).encode()[1:]


FRAGMENTS = [_fragment(sample_fields(level / (LEVELS - 1))) for level in range(LEVELS)]
HOST = json.dumps({"cpu_ratio": 0.35, "load1": 12.0, "memory_used_bytes": 400 * 2**30,
                   "memory_total_bytes": 2 * 2**40, "disk_used_bytes": 2**40, "disk_total_bytes": 4 * 2**40,
                   "net_rx_bytes_total": 0, "net_tx_bytes_total": 0, "task_memory": []},
                  separators=(",", ":")).encode()


@dataclass
class NodeFaults:
    """Counters of a node that has had a fault: the only per-node state beyond `seq`."""

    xids: dict[int, dict[str, int]] = field(default_factory=dict)  # accelerator index → {xid: count}
    ecc: dict[int, int] = field(default_factory=dict)  # accelerator index → uncorrected count


class Fleet:
    """Names, seqs and report bodies of N simulated nodes."""

    def __init__(self, nodes: int, accelerators: int, interval_seconds: float, prefix: str, rng: random.Random):
        self.nodes = nodes
        self.accelerators = accelerators
        self.interval = interval_seconds
        self.prefix = prefix
        self.rng = rng
        self.seqs = array("q", bytes(8 * nodes))
        self.faults: dict[int, NodeFaults] = {}
        self._phase = [rng.random() for _ in range(nodes)]  # where each node is in its load cycle

    def name(self, index: int) -> str:
        return node_name(self.prefix, index)

    def next_seq(self, index: int) -> int:
        self.seqs[index] += 1
        return self.seqs[index]

    def utilization_level(self, index: int, now: float) -> int:
        """A busy node's load: its own level between 0.70 and 0.95, swaying ±0.03 over 10 minutes."""
        x = 0.70 + 0.25 * self._phase[index] + 0.03 * math.sin(2 * math.pi * (now / 600.0 + self._phase[index]))
        return max(0, min(LEVELS - 1, int(x * (LEVELS - 1))))

    def body(self, index: int, seq: int, now: float, events: list[dict[str, Any]] | None = None) -> bytes:
        node = self.name(index)
        level = self.utilization_level(index, now)
        faults = self.faults.get(index)
        parts = [b'{"node":"', node.encode(), b'","seq":', str(seq).encode(), b',"sent_at":', repr(now).encode(),
                 b',"interval_seconds":', repr(self.interval).encode(), b',"host":', HOST, b',"accelerators":[']
        rand = self.rng.random
        for i in range(self.accelerators):
            if i:
                parts.append(b",")
            parts += (b'{"uuid":"', accelerator_uuid(node, i).encode(), b'"')
            lvl = max(0, min(LEVELS - 1, level + int(rand() * 7) - 3))
            if faults is not None and (i in faults.xids or i in faults.ecc):
                parts.append(_fragment(sample_fields(lvl / (LEVELS - 1), faults.xids.get(i), faults.ecc.get(i, 0))))
            else:
                parts.append(FRAGMENTS[lvl])
        # Every field, defaults too, as the agent's model_dump_json() sends them.
        parts.append(b'],"events":')
        parts.append(json.dumps(events or [], separators=(",", ":")).encode())
        parts.append(b',"tasks":[],"task_exits":[]}')
        return b"".join(parts)

    def fault(self, index: int, now: float, xids: list[int], kind: str | None = None,
              xid: int | None = None, accelerator: int | None = None) -> dict[str, Any]:
        """Record a random fault (XID from the catalog, or uncorrectable ECC) and return its event."""
        acc = self.rng.randrange(self.accelerators) if accelerator is None else accelerator
        kind = kind or ("ecc" if self.rng.random() < 0.25 else "xid")
        uuid = accelerator_uuid(self.name(index), acc)
        state = self.faults.setdefault(index, NodeFaults())
        if kind == "ecc":
            state.ecc[acc] = state.ecc.get(acc, 0) + 1
            return {"kind": "ecc", "accelerator_uuid": uuid, "message": "uncorrectable ECC error (simulated)",
                    "observed_at": now}
        code = xid if xid is not None else self.rng.choice(xids)
        counts = state.xids.setdefault(acc, {})
        counts[str(code)] = counts.get(str(code), 0) + 1
        return {"kind": "xid", "accelerator_uuid": uuid, "xid": code, "message": f"XID {code} (simulated)",
                "observed_at": now}


class HttpError(Exception):
    """The connection failed: try again, possibly on the next server."""


class Refused(HttpError):
    """The server answered, but not 200."""

    def __init__(self, status: int, text: str):
        super().__init__(f"{status}: {text}")
        self.status = status


class Connection:
    """One HTTP/1.1 keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str | None, body: bytes) -> tuple[int, bytes]:
        """A kept-alive connection the server closed while idle is reopened once, at no cost to the caller:
        what is sent here (registration, a report with its seq) is idempotent."""
        reused = self._writer is not None
        try:
            return await asyncio.wait_for(self._request(method, path, token, body), self.timeout)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            self.close()
            if not reused:
                raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        except (TimeoutError, OSError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        try:
            return await asyncio.wait_for(self._request(method, path, token, body), self.timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc

    async def _request(self, method: str, path: str, token: str | None, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self._writer.write(head + body)
        header = await self._reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length, close = 0, False
        for line in header.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        answer = await self._reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, answer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class Servers:
    """The server URLs in failover order; all senders move to the next one together."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.current = 0
        self.failovers = 0

    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.urls[self.current])
        return parts.hostname or "127.0.0.1", parts.port or 80

    def fail(self, seen: int) -> None:
        """Move on from server `seen` (if no other sender has already)."""
        if len(self.urls) > 1 and seen == self.current:
            self.current = (self.current + 1) % len(self.urls)
            self.failovers += 1


@dataclass
class Stats:
    sent: int = 0  # requests, retries included
    acked: int = 0  # reports acknowledged "accepted"
    duplicates: int = 0  # acknowledged "duplicate" (a retry of one the server had kept)
    failed: int = 0  # attempts that failed and were retried
    lost: int = 0  # refused for good
    offered: int = 0  # reports scheduled
    registered: int = 0
    faults: int = 0
    latencies: array = field(default_factory=lambda: array("d"))
    window: array = field(default_factory=lambda: array("d"))
    lag_seconds: float = 0.0
    max_lag_seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    injected: dict[str, Any] = field(default_factory=dict)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Options:
    nodes: int
    accelerators: int
    interval: float
    duration: float
    connections: int
    faults_per_hour: float
    seed: int
    prefix: str
    token: str | None
    servers: list[str]
    timeout: float = 10.0
    drain_seconds: float = 60.0
    inject_at: float | None = None  # seconds after start: XID 79 on the first node's accelerator 0
    register_only: bool = False
    mint_agent_token: bool = True
    max_backoff_seconds: float = MAX_BACKOFF_SECONDS


Item = tuple[int, float, list[dict[str, Any]] | None]  # node index, when it was due, events


class Simulator:
    def __init__(self, opts: Options, clock: Callable[[], float] = time.time, out: Any = sys.stdout):
        self.opts = opts
        self.clock = clock
        self.out = out
        self.rng = random.Random(opts.seed)
        self.fleet = Fleet(opts.nodes, opts.accelerators, opts.interval, opts.prefix, self.rng)
        self.servers = Servers(opts.servers)
        self.stats = Stats()
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.urgent: deque[Item] = deque()  # fault reports, sent before anything scheduled
        self.backlog: dict[int, deque[tuple[int, bytes, float]]] = {}  # node → reports waiting behind one in flight
        self.xids = default_xids()
        self.fault_probability = opts.faults_per_hour * opts.interval / 3600.0 / max(1, opts.nodes)
        self.scheduling = True
        self._injected_event: dict[str, Any] | None = None

    # -- scheduling -------------------------------------------------------------------------------

    def due(self, start: float, now: float, done: int) -> int:
        """How many reports are due by `now`: report j goes to node j % N at start + j·S/N."""
        return int((now - start) * self.opts.nodes / self.opts.interval) + 1 if now >= start else done

    async def schedule(self, start: float) -> None:
        opts, done = self.opts, 0
        end = start + opts.duration
        injected = opts.inject_at is None
        while True:
            now = self.clock()
            if now >= end:
                break
            target = self.due(start, now, done)
            while done < target:
                index = done % opts.nodes
                events = None
                if self.fault_probability and self.rng.random() < self.fault_probability:
                    events = [self.fleet.fault(index, now, self.xids)]
                    self.stats.faults += 1
                self.queue.put_nowait((index, start + done * opts.interval / opts.nodes, events))
                done += 1
            if not injected and now >= start + (opts.inject_at or 0.0):
                injected = True
                event = self.fleet.fault(0, now, self.xids, kind="xid", xid=79, accelerator=0)
                self._injected_event = event
                self.stats.injected = {"node": self.fleet.name(0), "uuid": event["accelerator_uuid"], "xid": 79}
                self.urgent.append((0, now, [event]))  # pushed at once, ahead of the schedule, like the agent does
            self.stats.offered = done
            await asyncio.sleep(0.005)
        self.scheduling = False

    # -- sending ----------------------------------------------------------------------------------

    async def sender(self) -> None:
        conn: Connection | None = None
        server = -1
        while True:
            try:
                index, due_at, events = self.urgent.popleft() if self.urgent else self.queue.get_nowait()
            except asyncio.QueueEmpty:
                if not self.scheduling:
                    break
                try:
                    index, due_at, events = await asyncio.wait_for(self.queue.get(), 0.1)
                except TimeoutError:
                    continue
            now = self.clock()
            self.stats.lag_seconds = max(0.0, now - due_at)
            self.stats.max_lag_seconds = max(self.stats.max_lag_seconds, self.stats.lag_seconds)
            seq = self.fleet.next_seq(index)
            body = self.fleet.body(index, seq, now, events)
            if events is not None and events[0] is self._injected_event:
                self.stats.injected.update(seq=seq, sent_at=now)
            waiting = self.backlog.get(index)
            if waiting is not None:  # an older report of this node is still being sent: keep seq order
                waiting.append((seq, body, now))
                continue
            waiting = self.backlog[index] = deque([(seq, body, now)])
            while waiting:
                seq, body, _ = waiting[0]
                if conn is None or server != self.servers.current:
                    if conn is not None:
                        conn.close()
                    server = self.servers.current
                    conn = Connection(*self.servers.address(), self.opts.timeout)
                conn, server = await self.deliver(conn, server, index, seq, body)
                waiting.popleft()
            del self.backlog[index]
        if conn is not None:
            conn.close()

    async def deliver(self, conn: Connection, server: int, index: int, seq: int,
                      body: bytes) -> tuple[Connection, int]:
        """Send one report until the server has it (or refuses it for good); a failure is retried with backoff.
        Returns the connection (and the index of its server) to use next."""
        node = self.fleet.name(index)
        path = f"/api/v1/nodes/{node}/reports"
        backoff = 0.1
        while True:
            if server != self.servers.current:
                conn.close()
                server = self.servers.current
                conn = Connection(*self.servers.address(), self.opts.timeout)
            started = time.perf_counter()
            self.stats.sent += 1
            try:
                status, answer = await conn.request("POST", path, self.opts.token, body)
            except HttpError as exc:
                self.stats.error(exc.args[0].split(":")[0])
                self.servers.fail(server)
                status, answer = 0, b""
            if status == 200:
                elapsed = time.perf_counter() - started
                self.stats.latencies.append(elapsed)
                self.stats.window.append(elapsed)
                if b'"status":"duplicate"' in answer:
                    self.stats.duplicates += 1
                else:
                    self.stats.acked += 1
                return conn, server
            if status:
                self.stats.error(str(status))
            if status in (404, 422) and b"not registered" in answer:
                with contextlib.suppress(HttpError):
                    await self.register(conn, index)
            elif status and 400 <= status < 500 and status not in (401, 403, 408, 429):
                self.stats.lost += 1
                if self.stats.lost <= 5:
                    print(f"report refused for good: node={node} seq={seq} {status} {answer[:300]!r}",
                          file=sys.stderr)
                return conn, server
            if status == 503:
                self.servers.fail(server)
            self.stats.failed += 1
            await asyncio.sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(self.opts.max_backoff_seconds, backoff * 2)

    async def register(self, conn: Connection, index: int) -> None:
        """Register a node (again); its seqs continue from what the server has."""
        reg = registration(self.fleet.name(index), self.opts.accelerators, self.opts.interval)
        status, answer = await conn.request("POST", "/api/v1/nodes/register", self.opts.token,
                                            reg.model_dump_json().encode())
        if status != 200:
            raise Refused(status, f"registering {reg.name}: {answer[:300]!r}")
        last = int(json.loads(answer).get("last_seq", 0))
        self.fleet.seqs[index] = max(self.fleet.seqs[index], last)

    async def register_all(self) -> None:
        pending = deque(range(self.opts.nodes))

        async def worker() -> None:
            conn: Connection | None = None
            server, backoff = -1, 0.1
            while pending:
                index = pending.popleft()
                if conn is None or server != self.servers.current:
                    server = self.servers.current
                    conn = Connection(*self.servers.address(), self.opts.timeout)
                try:
                    await self.register(conn, index)
                    self.stats.registered += 1
                    backoff = 0.1
                except HttpError as exc:
                    pending.append(index)
                    status = exc.status if isinstance(exc, Refused) else 0
                    self.stats.error(f"register {status or type(exc.__cause__).__name__}")
                    if 400 <= status < 500 and status not in (408, 429):
                        raise
                    if status in (0, 503):
                        self.servers.fail(server)
                    await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                    backoff = min(self.opts.max_backoff_seconds, backoff * 2)
            if conn is not None:
                conn.close()

        await asyncio.gather(*(worker() for _ in range(min(self.opts.connections, 32))))

    # -- reporting --------------------------------------------------------------------------------

    async def progress(self, start: float) -> None:
        last_acked, last_at = 0, self.clock()
        while True:
            await asyncio.sleep(PROGRESS_SECONDS)
            now = self.clock()
            window = list(self.stats.window)
            self.stats.window = array("d")
            rate = (self.stats.acked - last_acked) / max(1e-9, now - last_at)
            last_acked, last_at = self.stats.acked, now
            s = self.stats
            print(f"[simulate {now - start:6.0f}s] offered={s.offered} sent={s.sent} acked={s.acked} "
                  f"failed={s.failed} lost={s.lost} queued={self.queue.qsize() + len(self.backlog)} "
                  f"rate={rate:.0f}/s lag={s.lag_seconds:.2f}s p50={percentile(window, 0.5) * 1e3:.1f}ms "
                  f"p99={percentile(window, 0.99) * 1e3:.1f}ms", file=self.out, flush=True)

    async def agent_token(self) -> None:
        """With an admin token, mint an agent token bound to `PREFIX*` whose rate limit fits the fleet
        (2·N/S requests/s) and use it; otherwise, or where the server cannot, keep the token given."""
        rate = max(10.0, 2.0 * self.opts.nodes / self.opts.interval)
        label = "".join(c if c.isalnum() else "-" for c in self.opts.prefix)
        name = f"simulate-{label}{self.rng.randrange(16**6):06x}"
        spec = {"name": name, "role": "agent", "node": self.opts.prefix + "*", "rate_limit_per_second": rate}
        conn = Connection(*self.servers.address(), self.opts.timeout)
        try:
            status, answer = await conn.request("POST", "/api/v1/tokens", self.opts.token, json.dumps(spec).encode())
        except HttpError as exc:
            status, answer = 0, str(exc).encode()
        finally:
            conn.close()
        if status == 201:
            self.opts.token = json.loads(answer)["token"]
            print(f"[simulate] using agent token {name!r}: nodes {spec['node']}, {rate:g} requests/s",
                  file=self.out, flush=True)
        else:
            print(f"[simulate] no agent token minted ({status or answer.decode()}); sending with the token given",
                  file=self.out, flush=True)

    async def run(self) -> dict[str, Any]:
        began = self.clock()
        if self.opts.mint_agent_token:
            await self.agent_token()
        await self.register_all()
        registered_seconds = self.clock() - began
        print(f"[simulate] registered {self.stats.registered} nodes x {self.opts.accelerators} accelerators in "
              f"{registered_seconds:.1f}s", file=self.out, flush=True)
        if self.opts.register_only:
            return self.summary(0.0, 0.0, registered_seconds, 0)
        start = self.clock()
        progress = asyncio.create_task(self.progress(start))
        senders = [asyncio.create_task(self.sender()) for _ in range(self.opts.connections)]
        await self.schedule(start)
        sending_ended = self.clock()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*senders), self.opts.drain_seconds)
        for task in senders:
            task.cancel()
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*senders, progress, return_exceptions=True)
        unsent = self.queue.qsize() + len(self.urgent) + sum(len(w) for w in self.backlog.values())
        return self.summary(sending_ended - start, self.clock() - start, registered_seconds, unsent)

    def summary(self, scheduled: float, elapsed: float, registered_seconds: float, unsent: int) -> dict[str, Any]:
        s = self.stats
        lat = sorted(s.latencies)
        return {
            "nodes": self.opts.nodes, "accelerators": self.opts.nodes * self.opts.accelerators,
            "interval_seconds": self.opts.interval, "duration_seconds": scheduled, "elapsed_seconds": elapsed,
            "registered": s.registered, "register_seconds": registered_seconds,
            "offered": s.offered, "offered_per_second": s.offered / scheduled if scheduled else 0.0,
            "acked": s.acked, "acked_per_second": s.acked / scheduled if scheduled else 0.0,
            "duplicates": s.duplicates, "sent": s.sent, "failed_attempts": s.failed, "lost": s.lost,
            "unsent": unsent, "faults": s.faults, "failovers": self.servers.failovers,
            "p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3,
            "max_ms": (lat[-1] * 1e3) if lat else float("nan"), "max_lag_seconds": s.max_lag_seconds,
            "errors": dict(s.errors), "injected": s.injected,
        }


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
    p = sub.add_parser("simulate", help="drive a synthetic fleet against a running server")
    remote(p)
    p.add_argument("--nodes", type=int, default=100, help="simulated nodes (default 100)")
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
    p.add_argument("--json", default=None, help="also write the summary to this file")
    p.set_defaults(fn=cmd_simulate)
