"""The push pipeline: one thread sends spooled reports in seq order and removes each once acknowledged.

Outcomes per report: 200 accepted/duplicate → removed; 404 unknown node or 422 unknown accelerator →
register again, then retry; other 4xx → the server will never take it: dropped and counted;
401/403, 5xx, connection errors → kept, retried with backoff. Nothing is lost while the server is away.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

import httpx

from collectors.spool import Spool
from collectors.wire import LinkError, ReportLink
from sentinel.telemetry.schemas import NodeRegistration, ReportAck

log = logging.getLogger("sentinel.agent.push")

# Applies an acknowledgement; applying one that repeats the last one (seq aside) with no commands and nothing
# cleared must change nothing, as the Pusher does not hand such a repeat on (see _repeats_last_ack).
OnAck = Callable[[ReportAck], None]
SEQ_FIELD = re.compile(rb'"seq":\s*\d+')


class Pusher:
    def __init__(self, *, client: httpx.Client, link: ReportLink, node: str, spool: Spool,
                 registration: Callable[[], NodeRegistration], on_ack: OnAck,
                 on_registered: Callable[[int], None], max_backoff_seconds: float = 5.0):
        self._client = client  # registration
        self._link = link  # reports (collectors/wire.py)
        self._node = node
        self._spool = spool
        self._registration = registration
        self._on_ack = on_ack
        self._on_registered = on_registered
        self._max_backoff = max_backoff_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._registered = False
        self._thread = threading.Thread(target=self._run, name="sentinel-agent-push", daemon=True)
        self.sent_total = 0
        self.rejected_total = 0
        self.failures_total = 0
        self.connected = False
        self._last_ack = b""  # the last acknowledgement applied, without its seq

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, drain_seconds: float = 0.0) -> None:
        """Stop; with `drain_seconds`, first give the spool that long to empty."""
        if drain_seconds > 0:
            deadline = threading.Event()
            for _ in range(int(drain_seconds * 20)):
                if len(self._spool) == 0:
                    break
                self.wake()
                deadline.wait(0.05)
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def register(self) -> bool:
        try:
            reg = self._registration()
            response = self._client.post("/api/v1/nodes/register", content=reg.model_dump_json(),
                                         headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            self._unreachable(exc)
            return False
        if response.status_code != 200:
            log.error("registration refused: node=%s status=%d %s", self._node, response.status_code,
                      response.text[:300])
            return False
        last_seq = int(response.json().get("last_seq", 0))
        self._registered = True
        self._on_registered(last_seq)
        log.info("registered with server: node=%s accelerators=%d server_last_seq=%d", self._node,
                 len(reg.accelerators), last_seq)
        return True

    def _repeats_last_ack(self, content: bytes) -> bool:
        """Whether this acknowledgement says what the last one applied said, apart from its seq, and carries no
        commands and nothing cleared: the same assignments and probe targets, which applying again changes
        nothing (parsing and applying it was a tenth of the push's CPU a cycle)."""
        unsequenced = SEQ_FIELD.sub(b"", content, count=1)
        if b'"commands":[]' not in content or b'"cleared":[]' not in content:
            self._last_ack = b""
            return False
        if unsequenced == self._last_ack:
            return True
        self._last_ack = unsequenced
        return False

    def _unreachable(self, exc: BaseException) -> None:
        if self.connected:
            log.warning("server unreachable, spooling reports to disk: node=%s error=%s", self._node, exc)
        self.connected = False
        self._last_ack = b""  # the last acknowledgement applied, without its seq
        self.failures_total += 1

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            if not self._registered and not self.register():
                self._sleep(backoff)
                backoff = min(self._max_backoff, backoff * 2)
                continue
            item = self._spool.oldest()
            if item is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            if self._send(*item):
                backoff = 0.2
            else:
                self._sleep(backoff)
                backoff = min(self._max_backoff, backoff * 2)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _send(self, seq: int, body: bytes) -> bool:
        """True when the report left the spool (acknowledged or refused for good)."""
        try:
            response = self._link.post(f"/api/v1/nodes/{self._node}/reports", body)
        except LinkError as exc:
            self._unreachable(exc.__cause__ or exc)
            return False
        if not self.connected:
            log.info("server reachable: node=%s spooled=%d replaying from seq=%d", self._node, len(self._spool), seq)
            self.connected = True
        status = response.status_code
        if status == 200:
            self._spool.remove(seq)
            self.sent_total += 1
            try:
                if not self._repeats_last_ack(response.content):
                    self._on_ack(ReportAck.model_validate_json(response.content))
            except Exception:
                self._last_ack = b""
                log.exception("could not apply the server's acknowledgement: node=%s seq=%d", self._node, seq)
            return True
        text = response.text[:300]
        if status == 404 or (status == 422 and "not registered" in text):
            log.warning("server does not know this node or an accelerator (%d); registering again: node=%s",
                        status, self._node)
            self._registered = False
            return False
        if status in (401, 403, 429) or status >= 500:
            log.error("report not accepted yet: node=%s seq=%d status=%d %s", self._node, seq, status, text)
            self.failures_total += 1
            return False
        self._spool.remove(seq)
        self.rejected_total += 1
        log.error("report refused for good, dropped: node=%s seq=%d status=%d %s", self._node, seq, status, text)
        return True
