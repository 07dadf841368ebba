"""The Notifier contract (sentinel/alerting/notifiers/), run against every kind in `NOTIFIERS`.

What the dispatcher relies on: every kind takes a trigger, renders exactly the events `sends()` names and
refuses the rest, renders purely (same input, same request; the incident untouched), declares its JSON,
keeps secrets out of URLs, headers, reprs and error text, and is delivered byte for byte over real HTTP.
Each kind's own payload format is tested in tests/alerting/test_alert_payloads.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import inspect
from sqlalchemy.orm import sessionmaker

from sentinel.alerting import notifiers
from sentinel.alerting.dispatcher import Dispatcher
from sentinel.alerting.notifiers.common import EVENTS as INCIDENT_EVENTS
from sentinel.config import Settings
from sentinel.incidents.models import Incident
from tests.alerting.alerting_helpers import LoopbackReceiver, deliver, incident, receiver
from tests.conftest import FakeClock
from tests.contracts.conftest import implementations

NOW = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
ROUTING_KEY = "R" * 32
SECRET = "contract-secret-5f2b9c"  # long enough for the dispatcher to scrub (>= 8 characters)
SECRET_PATH = "/services/T000/B000/XXXXSECRETXXXX"  # a Slack webhook's path is its secret

each_notifier = pytest.mark.parametrize("kind", implementations(notifiers.NOTIFIERS))


def incident_for(event: str, **overrides: Any) -> Incident:
    """An incident in the state `event` leaves it in, every time fixed: two built alike are equal."""
    at = NOW - timedelta(minutes=5)
    states: dict[str, dict[str, Any]] = {
        "trigger": {"state": "open"},
        "acknowledge": {"state": "acknowledged", "acknowledged_at": NOW, "acknowledged_by": "operator:alice"},
        "resolve": {"state": "resolved", "resolved_at": NOW, "resolved_by": "operator:bob",
                    "resolve_reason": "GPU replaced"},
    }
    fields = {"id": 5, "opened_at": at, "observed_at": at, "last_seen_at": at,
              "actions": [{"at": at.isoformat(), "text": "quarantined GPU-1"}], **states[event], **overrides}
    return incident(**fields)


def events_sent(kind: str) -> list[str]:
    return [event for event in INCIDENT_EVENTS if notifiers.sends(kind, event)]


def columns(item: Incident) -> dict[str, Any]:
    return copy.deepcopy({attr.key: getattr(item, attr.key) for attr in inspect(Incident).column_attrs})


@pytest.fixture
def dispatcher(tmp_path: Path) -> Iterator[Dispatcher]:
    """The real sender. `send()` touches no database, so the session factory is bound to none."""
    sender = Dispatcher(sessionmaker(), Settings(data_dir=tmp_path), FakeClock())
    yield sender
    sender.stop()


@each_notifier
def test_every_notifier_posts_json_for_each_event_it_takes(kind):
    with LoopbackReceiver() as rx:
        rcv = receiver(kind, rx.url + "/in", secret=ROUTING_KEY)
        for event in ("trigger", "acknowledge", "resolve"):
            item = incident(id=5, state={"trigger": "open", "acknowledge": "acknowledged"}.get(event, "resolved"),
                            resolved_at=NOW)
            if not notifiers.sends(kind, event):
                with pytest.raises(ValueError, match=event):
                    notifiers.render(rcv, item, event, NOW)
                continue
            got = deliver(notifiers.render(rcv, item, event, NOW), rx)
            assert got.headers["content-type"] == "application/json"
            assert isinstance(got.json(), (dict, list))
    assert notifiers.sends("alertmanager", "acknowledge") is False
    assert notifiers.sends("carrier-pigeon", "trigger") is False


@each_notifier
def test_the_kind_can_be_configured_as_a_receiver(kind):
    configured = receiver(kind, "http://127.0.0.1:1/in", secret=SECRET)
    assert configured.kind == kind


@each_notifier
def test_every_notifier_takes_a_trigger_and_only_incident_events(kind):
    taken = notifiers.NOTIFIERS[kind].events
    assert "trigger" in taken and notifiers.sends(kind, "trigger")
    assert set(taken) <= set(INCIDENT_EVENTS), f"{kind} names events no incident has: {taken}"
    assert len(set(taken)) == len(taken)


@each_notifier
def test_an_unknown_event_is_refused_with_its_name_and_without_the_url_or_secret(kind):
    rcv = receiver(kind, "http://127.0.0.1:1" + SECRET_PATH, secret=SECRET)
    assert not notifiers.sends(kind, "escalate")
    with pytest.raises(ValueError, match="escalate") as refused:
        notifiers.render(rcv, incident_for("trigger"), "escalate", NOW)
    for secret in (SECRET, SECRET_PATH, rcv.url):
        assert secret not in str(refused.value)


@each_notifier
def test_rendering_is_deterministic_and_leaves_the_incident_as_it_was(kind):
    rcv = receiver(kind, "http://127.0.0.1:1/in", secret=SECRET)
    for event in events_sent(kind):
        first_item, second_item = incident_for(event), incident_for(event)
        before = columns(first_item)
        first = notifiers.render(rcv, first_item, event, NOW)
        again = notifiers.render(rcv, first_item, event, NOW)
        alike = notifiers.render(rcv, second_item, event, NOW)
        assert (first.url, first.headers, first.body) == (again.url, again.headers, again.body), event
        assert (first.url, first.headers, first.body) == (alike.url, alike.headers, alike.body), event
        assert columns(first_item) == before, f"{kind} changed the incident while rendering {event}"


@each_notifier
def test_a_request_is_an_http_url_with_one_json_content_type_and_a_json_body(kind):
    rcv = receiver(kind, "http://127.0.0.1:1/in", secret=SECRET)
    for event in events_sent(kind):
        request = notifiers.render(rcv, incident_for(event), event, NOW)
        target = urlsplit(request.url)
        assert target.scheme in ("http", "https") and target.netloc, request.url
        types = [value for name, value in request.headers.items() if name.lower() == "content-type"]
        assert types == ["application/json"], (event, types)
        assert isinstance(request.body, bytes)
        assert isinstance(json.loads(request.body), (dict, list))


@each_notifier
def test_secrets_stay_out_of_the_url_the_headers_and_the_repr(kind):
    rcv = receiver(kind, "http://127.0.0.1:1" + SECRET_PATH, secret=SECRET)
    for event in events_sent(kind):
        request = notifiers.render(rcv, incident_for(event), event, NOW)
        assert SECRET not in request.url
        assert all(SECRET not in value for value in request.headers.values()), event
        shown = repr(request)
        for secret in (SECRET, SECRET_PATH, request.url):
            assert secret not in shown, (event, "a request's repr reaches logs")


@each_notifier
def test_the_dispatcher_delivers_each_rendered_request_over_http_byte_for_byte(kind, dispatcher):
    with LoopbackReceiver() as rx:
        rcv = receiver(kind, rx.url + "/in", secret=SECRET)
        for event in events_sent(kind):
            request = notifiers.render(rcv, incident_for(event), event, NOW)
            outcome = dispatcher.send(rcv, request)
            assert outcome.ok and outcome.status_code == 200 and outcome.error == "", (event, outcome)
            got = rx.requests[-1]
            assert got.method == "POST" and got.path == urlsplit(request.url).path and got.body == request.body
            for name, value in request.headers.items():
                assert got.headers[name.lower()] == value, (event, name)
        assert len(rx.requests) == len(events_sent(kind))


@each_notifier
def test_error_text_of_a_refused_delivery_carries_neither_the_url_nor_the_secret(kind, dispatcher):
    with LoopbackReceiver(default=400, echo=True) as rx:  # the answer quotes the request body back
        rcv = receiver(kind, rx.url + SECRET_PATH, secret=SECRET)
        # the worst case: the incident quotes both early on, so the start of every kind's body (the part
        # an error quotes) carries them
        quote = f"posted to {rcv.url} with {SECRET}"
        item = incident_for("trigger", title=quote, fingerprint=quote)
        outcome = dispatcher.send(rcv, notifiers.render(rcv, item, "trigger", NOW))
    assert outcome.status_code == 400 and not outcome.ok
    assert outcome.error.startswith("HTTP 400") and "<redacted>" in outcome.error, "the answer was quoted, scrubbed"
    for secret in (SECRET, SECRET_PATH, rcv.url):
        assert secret not in outcome.error, outcome.error
