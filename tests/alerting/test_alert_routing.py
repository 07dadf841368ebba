"""Routes and silence matchers: pure functions, no database."""

from __future__ import annotations

import pytest

from sentinel.alerting.service import matcher_matches, normalise_matchers, routes
from sentinel.config import ReceiverConfig

LABELS = {"alertname": "SentinelXid", "severity": "warning", "detector": "xid", "layer": "hardware",
          "node": "node-a", "job": "7"}


def rcv(**extra: object) -> ReceiverConfig:
    return ReceiverConfig.model_validate({"name": "r", "kind": "webhook", "url": "http://127.0.0.1:1/", **extra})


def test_routes_by_severity_and_matchers():
    assert routes(rcv(), LABELS)
    assert not routes(rcv(min_severity="critical"), LABELS)
    assert routes(rcv(min_severity="info"), {**LABELS, "severity": "info"})
    assert not routes(rcv(), {**LABELS, "severity": "info"})
    assert routes(rcv(match={"layer": "interconnect|hardware"}), LABELS)
    assert not routes(rcv(match={"layer": "interconnect|compute"}), LABELS)
    assert not routes(rcv(match={"rank": "0"}), LABELS)  # absent label never equals a value
    assert routes(rcv(match={"detector": "xid", "node": "node-a"}), LABELS)


def test_matchers_behave_like_alertmanager():
    def m(name: str, value: str, is_regex: bool = False, is_equal: bool = True) -> dict:
        return {"name": name, "value": value, "is_regex": is_regex, "is_equal": is_equal}

    assert matcher_matches(m("node", "node-a"), LABELS)
    assert not matcher_matches(m("node", "node-a", is_equal=False), LABELS)
    assert matcher_matches(m("node", "node-.*", is_regex=True), LABELS)
    assert not matcher_matches(m("node", "node", is_regex=True), LABELS)  # anchored: a full match
    assert matcher_matches(m("node", "node-b|node-a", is_regex=True), LABELS)
    assert matcher_matches(m("rank", ""), LABELS)  # absent label is the empty string
    assert matcher_matches(m("node", "node-b", is_regex=True, is_equal=False), LABELS)


def test_matcher_validation_messages():
    with pytest.raises(ValueError, match=r"invalid regular expression '\(unclosed'"):
        normalise_matchers([{"name": "node", "value": "(unclosed", "is_regex": True}])
    with pytest.raises(ValueError, match="label name '9lives'"):
        normalise_matchers([{"name": "9lives", "value": "x"}])
    with pytest.raises(ValueError, match="at least one matcher"):
        normalise_matchers([])
    with pytest.raises(ValueError, match="at most 32"):
        normalise_matchers([{"name": "node", "value": str(i)} for i in range(33)])
    with pytest.raises(ValueError, match="must not match the empty string"):
        normalise_matchers([{"name": "node", "value": ".*", "is_regex": True}])
    assert normalise_matchers([{"name": "node", "value": "node-a"}]) == [
        {"name": "node", "value": "node-a", "is_regex": False, "is_equal": True}]
