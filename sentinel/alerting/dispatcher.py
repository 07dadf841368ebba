"""Sends the notification outbox: due rows out over HTTP, with retries, a record of every try, and counters.

Delivery is at-least-once. The outbox row is written with the incident change; a row is marked
delivered only after the receiver answered 2xx, in a separate commit. A crash between the send and
that commit re-sends the message once after restart; PagerDuty folds it into the same alert by
`dedup_key`, Alertmanager by the alert's labels, and webhook receivers can drop it by `Idempotency-Key`.

Timing: the background thread runs a pass at least every second (sooner on `wake()`), sending up to
`batch_size` due rows, oldest first. A failed try is retried after 1, 2, 4 … s (capped at 300 s, plus up
to 25 % jitter, or the receiver's Retry-After), up to `notify_max_attempts` tries. A 4xx other than 408
and 429 fails at once: the receiver refused the payload and will refuse it again. When a receiver
does not answer at all, its other due rows wait for its next try, so one dead receiver neither costs a
timeout per row nor holds up the others. An ack or resolve waits for its trigger to be delivered.

Logs carry ids, receiver names and status codes, never a URL (a Slack URL is a secret) or a key.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from sentinel.alerting import notifiers, service
from sentinel.alerting.models import DeliveryAttempt, Notification, Silence
from sentinel.alerting.notifiers import OutboundRequest, alertmanager
from sentinel.clock import Clock, to_datetime
from sentinel.config import ReceiverConfig, Settings
from sentinel.db import transaction
from sentinel.incidents import render as prose
from sentinel.incidents.lifecycle import Owed
from sentinel.incidents.models import Incident

log = logging.getLogger("sentinel.alerting")

BACKOFF_CAP_SECONDS = 300.0
RETRYABLE_4XX = (408, 429)
REFRESH_CHUNK = 500


@dataclass(frozen=True)
class Outcome:
    """What one HTTP try gave: a status (None when no answer came), error text (secrets removed), timing."""

    status_code: int | None
    error: str
    duration_seconds: float
    retry_after_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    @property
    def permanent(self) -> bool:
        code = self.status_code
        return code is not None and 400 <= code < 500 and code not in RETRYABLE_4XX


@dataclass(frozen=True)
class Prepared:
    """A due row, rendered and ready to send (read in one transaction, sent outside any)."""

    notification_id: int
    incident_id: int
    receiver: ReceiverConfig
    event: str
    attempt: int
    request: OutboundRequest


class Dispatcher:
    """Owns every send. `run_once()` is one pass (tests call it directly); `start()` runs passes in a thread."""

    def __init__(self, factory: sessionmaker[Session], settings: Settings, clock: Clock, *,
                 client: httpx.Client | None = None, external_url: str | None = None, batch_size: int = 50,
                 rng: random.Random | None = None):
        self.factory = factory
        self.settings = settings
        self.clock = clock
        self.receivers = {r.name: r for r in settings.receivers}
        self.external_url = external_url or notifiers.DEFAULT_EXTERNAL_URL
        self.batch_size = batch_size
        self.counts: dict[tuple[str, str, str], int] = {}
        self.loop_errors = 0
        self._busy = False  # the last pass filled its batch: run the next one without waiting
        self._rng = rng or random.Random()
        self._client = client or httpx.Client(follow_redirects=False)
        self._own_client = client is None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="sentinel-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._own_client:
            self._client.close()

    def wake(self) -> None:
        """Send now rather than at the next tick (call after committing new rows)."""
        self._wake.set()

    # --- the outbox Incidents is given (incidents/lifecycle.py: Outbox) ----------------------------------

    def owe(self, session: Session, incident: Incident, event: str, now: datetime) -> list[Notification]:
        """Queue what `event` on `incident` owes to the receivers, in the caller's transaction."""
        return service.notify(session, incident, event, self.settings, now)

    def ring(self, rows: Sequence[Owed]) -> None:
        """After the commit of the transaction that queued `rows`."""
        self.enqueued(rows)

    def enqueued(self, rows: Iterable[Owed]) -> None:
        """Call after the transaction that created `rows` (from `service.notify`) committed: counts the ones
        born silenced and wakes the sender for the rest."""
        for row in rows:
            if row.state == "silenced":
                self._count(row.receiver, row.event, "silenced")
        self.wake()

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        """A copy of `counts`, safe to read from another thread (the metrics scrape)."""
        with self._lock:
            return dict(self.counts)

    def _loop(self) -> None:
        while not self._stop.is_set():
            busy = False
            try:
                self.run_once()
                busy = self._busy
            except Exception:
                self.loop_errors += 1
                log.exception("notification pass failed; retrying in 1 s")
            if not busy:
                self._wake.wait(1.0)
            self._wake.clear()

    # --- one pass ------------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Release ended silences, then try every due row once. Returns how many sends were tried."""
        now = to_datetime(self.clock.time())
        with transaction(self.factory) as session:
            released = service.unsilence_expired(session, now)
            silences = service.active_silences(session, now)
            due = session.execute(
                select(Notification.id, Notification.event)
                .where(Notification.state == "pending", Notification.next_attempt_at <= now)
                .order_by(Notification.next_attempt_at, Notification.id).limit(self.batch_size)).all()
        # triggers first, so a follow-up due in the same pass finds its trigger settled
        due = sorted(due, key=lambda item: item.event != "trigger")
        for row in released:
            log.info("silence ended, notification queued: notification=%d incident=%d receiver=%s event=%s",
                     row.id, row.incident_id, row.receiver, row.event)
        tried = 0
        down: dict[str, datetime] = {}  # unreachable receivers → when their failed row is retried
        held: dict[datetime, list[int]] = {}
        for notification_id, _event in due:
            prepared = self._prepare(notification_id, now, silences)
            if prepared is None:
                continue
            if prepared.receiver.name in down:
                # do not wait out its timeout for every row, and let other receivers' rows move up the queue
                held.setdefault(down[prepared.receiver.name], []).append(notification_id)
                continue
            outcome = self.send(prepared.receiver, prepared.request)
            tried += 1
            next_at = self._record(prepared, outcome, now)
            if outcome.status_code is None:
                down[prepared.receiver.name] = next_at or now + timedelta(seconds=1)
        if held:
            self._postpone(held)
        self._busy = len(due) >= self.batch_size and not down
        return tried

    def _postpone(self, held: dict[datetime, list[int]]) -> None:
        """Move rows of an unreachable receiver to its next try, without counting an attempt."""
        with transaction(self.factory) as session:
            for until, ids in held.items():
                session.execute(update(Notification).where(Notification.id.in_(ids), Notification.state == "pending")
                                .values(next_attempt_at=until))

    def _prepare(self, notification_id: int, now: datetime, silences: Sequence[Silence]) -> Prepared | None:
        """Read and render one row, or settle it without a send (silenced, waiting, impossible)."""
        with transaction(self.factory) as session:
            row = session.get(Notification, notification_id)
            if row is None or row.state != "pending" or row.next_attempt_at > now:
                return None
            incident = session.get(Incident, row.incident_id)
            receiver = self.receivers.get(row.receiver)
            if incident is None:
                return self._fail_unsent(row, "the incident is gone")
            if receiver is None:
                return self._fail_unsent(row, f"receiver {row.receiver!r} is no longer configured")
            if row.event == "trigger":
                silence = service.first_match(silences, prose.labels(incident))
                if silence is not None:
                    return self._silence(row, silence.id)
            else:
                trigger = session.scalar(select(Notification).where(
                    Notification.incident_id == row.incident_id, Notification.receiver == row.receiver,
                    Notification.event == "trigger"))
                if trigger is not None and trigger.state != "delivered":
                    return self._hold_follow_up(row, trigger)
            try:
                request = notifiers.render(receiver, incident, row.event, now, external_url=self.external_url,
                                           resend_seconds=self.settings.alert_resend_seconds, cell=self.settings.cell)
            except ValueError as exc:
                return self._fail_unsent(row, f"cannot render: {exc}")
            return Prepared(row.id, row.incident_id, receiver, row.event, row.attempts + 1, request)

    def _silence(self, row: Notification, silence_id: int | None) -> Prepared | None:
        """A silence made after the row was queued still mutes it, as in Alertmanager."""
        row.state, row.silence_id = "silenced", silence_id
        self._count(row.receiver, row.event, "silenced")
        log.info("notification silenced: notification=%d incident=%d receiver=%s event=%s silence=%s",
                 row.id, row.incident_id, row.receiver, row.event, silence_id)
        return None

    def _hold_follow_up(self, row: Notification, trigger: Notification) -> Prepared | None:
        """An ack or resolve goes only after its trigger was delivered: it waits for a pending trigger,
        is muted with a silenced one and fails with a failed one."""
        if trigger.state == "pending":
            row.next_attempt_at = max(row.next_attempt_at, trigger.next_attempt_at)
            return None
        if trigger.state == "silenced":
            return self._silence(row, trigger.silence_id)
        return self._fail_unsent(row, "its trigger was never delivered")

    def _fail_unsent(self, row: Notification, problem: str) -> Prepared | None:
        row.state, row.last_error = "failed", problem[:1024]
        self._count(row.receiver, row.event, "failed")
        log.error("notification failed without a send: notification=%d incident=%d receiver=%s event=%s error=%s",
                  row.id, row.incident_id, row.receiver, row.event, problem)
        return None

    def send(self, receiver: ReceiverConfig, request: OutboundRequest) -> Outcome:
        """One POST. Never raises; errors come back with secrets and the URL removed."""
        started = time.monotonic()
        try:
            response = self._client.post(request.url, content=request.body, headers=request.headers,
                                         timeout=receiver.timeout_seconds)
        except Exception as exc:
            return Outcome(None, _scrub(f"{type(exc).__name__}: {exc}", receiver, request),
                           time.monotonic() - started)
        duration = time.monotonic() - started
        code = response.status_code
        if 200 <= code < 300:
            return Outcome(code, "", duration)
        error = _scrub(f"HTTP {code}: {response.text[:300]}".strip(), receiver, request)
        return Outcome(code, error, duration, _retry_after(response.headers.get("retry-after")))

    def _record(self, prepared: Prepared, outcome: Outcome, now: datetime) -> datetime | None:
        """Store the try and its consequence; returns when the row is tried next (None: settled)."""
        with transaction(self.factory) as session:
            row = session.get(Notification, prepared.notification_id)
            if row is None:
                return None
            session.add(DeliveryAttempt(notification_id=row.id, at=now, status_code=outcome.status_code,
                                        error=outcome.error, duration_seconds=outcome.duration_seconds))
            row.attempts = prepared.attempt
            row.last_error = outcome.error[:1024]
            if outcome.ok:
                row.state, row.delivered_at, result = "delivered", now, "delivered"
            elif outcome.permanent or row.attempts >= self.settings.notify_max_attempts:
                row.state, result = "failed", "failed"
            else:
                delay = self.backoff_seconds(row.attempts, outcome.retry_after_seconds)
                row.next_attempt_at, result = now + timedelta(seconds=delay), "retry"
        self._count(prepared.receiver.name, prepared.event, result)
        next_at = row.next_attempt_at if result == "retry" else None
        _log_outcome(prepared, outcome, result, next_at)
        return next_at

    def backoff_seconds(self, attempts: int, retry_after: float | None = None) -> float:
        """1, 2, 4 … s after the 1st, 2nd, 3rd … failure, capped at 300 s, plus up to 25 % jitter."""
        base = min(BACKOFF_CAP_SECONDS, 2.0 ** (attempts - 1))
        delay = min(BACKOFF_CAP_SECONDS, base + self._rng.uniform(0, base * 0.25))
        if retry_after is not None:
            delay = max(delay, min(retry_after, BACKOFF_CAP_SECONDS))
        return delay

    def _count(self, receiver: str, event: str, result: str) -> None:
        with self._lock:
            key = (receiver, event, result)
            self.counts[key] = self.counts.get(key, 0) + 1

    # --- Alertmanager refresh ------------------------------------------------------------------------

    def refresh_alertmanager(self, now: datetime | None = None) -> int:
        """Re-post every unresolved incident already delivered to each Alertmanager receiver, before its
        `endsAt` passes (schedule every `alert_resend_seconds`). Returns how many alerts were posted."""
        now = now or to_datetime(self.clock.time())
        posted = 0
        for receiver in self.receivers.values():
            if receiver.kind != "alertmanager":
                continue
            with self.factory() as session:
                incidents = list(session.scalars(
                    select(Incident).join(Notification, Notification.incident_id == Incident.id)
                    .where(Notification.receiver == receiver.name, Notification.event == "trigger",
                           Notification.state == "delivered", Incident.state != "resolved")
                    .order_by(Incident.id)))
                requests = [(len(chunk), alertmanager.alerts_request(
                                receiver, chunk, now, external_url=self.external_url,
                                resend_seconds=self.settings.alert_resend_seconds, cell=self.settings.cell))
                            for chunk in _chunks(incidents, REFRESH_CHUNK)]
            for size, request in requests:
                outcome = self.send(receiver, request)
                if outcome.ok:
                    posted += size
                    log.debug("alertmanager refresh: receiver=%s alerts=%d status=%s", receiver.name, size,
                              outcome.status_code)
                else:
                    log.warning("alertmanager refresh failed: receiver=%s alerts=%d status=%s error=%s",
                                receiver.name, size, outcome.status_code, outcome.error)
        return posted


def _chunks(items: Sequence[Incident], size: int) -> list[Sequence[Incident]]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def _scrub(text: str, receiver: ReceiverConfig, request: OutboundRequest) -> str:
    """Error text may quote the URL (a Slack webhook URL is a secret) or echo a key: take them out."""
    for secret in (request.url, receiver.url, receiver.resolved_secret()):
        if len(secret) >= 8:
            text = text.replace(secret, "<redacted>")
    return text


def _retry_after(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value else None
    except ValueError:
        return None  # an HTTP date: rare from these receivers; our own backoff applies


def _log_outcome(prepared: Prepared, outcome: Outcome, result: str, next_at: datetime | None) -> None:
    args = (prepared.notification_id, prepared.incident_id, prepared.receiver.name, prepared.event, prepared.attempt,
            outcome.status_code, outcome.duration_seconds)
    where = "notification=%d incident=%d receiver=%s event=%s attempt=%d status=%s duration=%.3fs"
    if result == "delivered":
        log.info("notification delivered: " + where, *args)
    elif result == "retry":
        log.warning("notification not delivered, will retry: " + where + " next=%s error=%s", *args,
                    next_at.isoformat() if next_at else "", outcome.error)
    else:
        log.error("notification failed for good: " + where + " error=%s", *args, outcome.error)
