"""A serving job's replicas on this machine, behind the router: the local executor (sentinel/launcher/local.py)
with each rank a replica on its own port, replaced one at a time, and the batch limit applied.

Each rank gets `SENTINEL_REPLICA_PORT` (a free port) and `SENTINEL_REPLICA` (`r<rank>`, `r<rank>.a<attempt>`
for a replacement, so the server's per-replica windows do not mix the old process with the new). The router
(router.py) routes to a replica once its `GET /v1/models` answers.

A `replace_replica` order replaces the ranks its placement marks `replace` (all of them when none is marked),
one at a time, as DESIGN §6 says: drain the old replica (the router routes nothing new to it; the others take
the traffic at once), start the replacement from the same command (the weights it loads are the catalog's),
wait until it answers, cut over (the router routes to it), give the old replica's requests in flight
`drain_seconds` to finish (none once they have sent nothing for a second: a frozen replica), then stop it
(a stream cut by the stop is resumed or retried elsewhere by the router). The order's result says how long
each step took and what became of the requests in flight.

An `adjust` order sets the batch limit: a replica that takes `POST /sentinel/batch_limit` (the project's demo
engine) applies it itself, and queues (and reports its queue) as an engine's own limit does; for one that
does not (vLLM has no such call), the router admits at most that many requests to it at once.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

from sentinel.launcher.local import LocalProcesses, Rank, free_port
from sentinel.remediation.executors.base import Action, Outcome
from sentinel.serving.router import Router

READY_SECONDS = 300.0  # a replica loading its weights: vLLM on CPU takes ~75 s here
DRAIN_SECONDS = 30.0  # the longest a healthy replica's requests in flight get to finish before its stop
STALLED_SECONDS = 1.0  # a replica whose requests in flight send nothing this long is not waited for


def replica_name(rank: int, attempt: int) -> str:
    return f"r{rank}" if attempt == 0 else f"r{rank}.a{attempt}"


class ServingProcesses(LocalProcesses):
    def __init__(self, *args: Any, router: Router, ready_seconds: float = READY_SECONDS,
                 drain_seconds: float = DRAIN_SECONDS, engine: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.router = router
        self.engine = engine  # vllm, sglang, dynamo: the node's agent scrapes each replica's /metrics
        self.ready_seconds, self.drain_seconds = ready_seconds, drain_seconds
        self.names: dict[int, str] = {}  # rank → its replica's name (the router's backend)
        self.ports: dict[int, int] = {}
        self.batch_limit: int | None = router.limit

    def rank_env(self, slot: dict[str, Any], attempt: int, port: int) -> dict[str, str]:
        rank = int(slot["rank"])
        self.ports[rank], self.names[rank] = free_port(), replica_name(rank, attempt)
        return {**super().rank_env(slot, attempt, port), "SENTINEL_REPLICA_PORT": str(self.ports[rank]),
                "SENTINEL_REPLICA": self.names[rank]}

    def task_fields(self, rank: int) -> dict[str, Any]:
        """The replica's engine for the node's agent to scrape (and canary), on the port this replica serves."""
        if self.engine is None or rank not in self.ports:
            return {}
        return {"engine": f"{self.engine}@http://127.0.0.1:{self.ports[rank]}/metrics#{self.names[rank]}"}

    def start_attempt(self, placement: list[dict[str, Any]], attempt: int) -> list[Rank]:
        started = super().start_attempt(placement, attempt)
        for r in started:
            backend = self.router.add(self.names[r.rank], self.ports[r.rank])
            threading.Thread(target=self._announce, args=(backend, r.proc), daemon=True).start()
        return started

    def _announce(self, backend: Any, proc: Any) -> None:
        started = time.monotonic()
        if self.router.wait_ready(backend, self.ready_seconds, alive=lambda: proc.poll() is None):
            self.say(f"replica {backend.name} ready on port {backend.port} after {time.monotonic() - started:.1f}s")
            if self.batch_limit is not None and tell(backend.port, self.batch_limit):
                self.router.set_limit(None, {backend.name})

    def close(self, grace_seconds: float = 5.0) -> None:
        super().close(grace_seconds)
        self.router.close()

    # -- orders ---------------------------------------------------------------------------------------
    def execute(self, action: Action) -> Outcome:
        order = action.order
        if action.kind == "order" and order is not None and order.get("kind") == "adjust":
            if int(order.get("job_id", -1)) != self.job_id:
                return Outcome(False, f"order {order.get('id')} is for job {order.get('job_id')}, not {self.job_id}")
            return self.adjust(order)
        return super().execute(action)

    def adjust(self, order: dict[str, Any]) -> Outcome:
        if "fault_tolerance" in (order.get("params") or {}):  # an instruction to the engines: retry, scale_down
            from sentinel.launcher.fault_tolerance import apply_order
            return apply_order(order, self.names, self.ports)
        limit = int((order.get("params") or {}).get("batch_limit", 0))
        if limit < 1:
            return Outcome(False, f"order {order.get('id')}: adjust without a batch_limit of 1 or more")
        before, self.batch_limit = self.batch_limit, limit
        self.router.set_limit(limit)
        took = {name for rank, name in self.names.items() if rank in self.ports and tell(self.ports[rank], limit)}
        self.router.set_limit(None, took)  # a replica that takes it queues itself (and reports its queue)
        self.say(f"batch limit {before or 'none'} → {limit} per replica ({order.get('reason', '')})")
        return Outcome(True, f"order {order.get('id')}: batch limit {before or 'none'} → {limit} per replica "
                             f"({len(took)} of {len(self.ports)} replica(s) took it; the router holds the "
                             "others to it)")

    def _replace(self, slot: dict[str, Any], attempt: int) -> str:
        rank = int(slot["rank"])
        begun = time.monotonic()
        before = dict(self.router.counts)
        old = next((r for r in self.ranks if r.rank == rank), None)
        old_name = self.names.get(rank, replica_name(rank, 0))
        drained = self.router.drain(old_name)
        in_flight = drained.in_flight if drained is not None else 0
        proc = self._start(self.rank_env(slot, attempt, free_port()))
        new = Rank(rank, slot["node"], list(slot["accelerators"]), slot.get("agent_url"), proc)
        backend = self.router.add(self.names[rank], self.ports[rank])
        if not self.router.wait_ready(backend, self.ready_seconds, alive=lambda: proc.poll() is None):
            self.stop_ranks([new])
            self.router.remove(backend)
            if drained is not None:
                drained.draining = False  # no replacement: the old one is better than none
            raise OSError(f"replica {backend.name} did not answer within {self.ready_seconds:g}s "
                          f"(exit {proc.poll()})")
        ready = time.monotonic() - begun
        if self.batch_limit is not None and tell(backend.port, self.batch_limit):
            self.router.set_limit(None, {backend.name})
        self.on_started([new], attempt)
        # its requests in flight finish on it, unless no byte of theirs comes for a second: frozen
        finished = drained is not None and self.router.wait_drained(drained, self.drain_seconds, STALLED_SECONDS)
        if old is not None:
            self.stop_ranks([old])
        if drained is not None:
            self.router.wait_drained(drained, 5.0)  # the streams its stop cut: resumed or retried, and counted
            self.router.remove(drained)
        self.ranks = sorted([r for r in self.ranks if r.rank != rank] + [new], key=lambda r: r.rank)
        took = time.monotonic() - begun
        delta = {k: self.router.counts[k] - before.get(k, 0) for k in ("retried", "resumed", "failed")}
        self.say(f"replica {old_name} → {backend.name} (pid {proc.pid}, port {backend.port}) in {took:.2f}s")
        return (f"replica {old_name} → {backend.name} in {took:.2f}s (answering after {ready:.2f}s); "
                f"{in_flight} request(s) in flight at the drain, "
                + ("all finished on it" if finished else "the rest cut at its stop")
                + f"; meanwhile {delta['retried']} retried, {delta['resumed']} resumed elsewhere, "
                  f"{delta['failed']} failed")


def tell(port: int, limit: int) -> bool:
    """The replica's own batch limit, where it takes one (`POST /sentinel/batch_limit`); False where not."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("POST", "/sentinel/batch_limit", body=json.dumps({"limit": limit}),
                     headers={"content-type": "application/json"})
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
