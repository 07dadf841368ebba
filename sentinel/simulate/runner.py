"""The simulator: senders that spread each node's reports evenly over the interval, retry in seq order
like the agent's spool, and count what was accepted, duplicated, refused and lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sentinel.simulate.fleet import Fleet, default_xids, registration
from sentinel.simulate.wire import Connection, HttpError, Refused, Servers

PROGRESS_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 5.0


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
