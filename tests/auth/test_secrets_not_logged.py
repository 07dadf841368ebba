"""A live server at DEBUG with every kind of secret in its configuration: after tokens are made, calls
succeed and fail (401, 403, 429) and alerts go out, no secret and no token appears in its log."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.alerting.alerting_helpers import LoopbackReceiver
from tests.conftest import bearer, fresh_postgres_database
from tests.factories import registration, report
from tests.live import LiveServer, wait_for

WEBHOOK_SECRET = "whsec-" + uuid.uuid4().hex
PAGERDUTY_KEY = "pdkey" + uuid.uuid4().hex
DB_PASSWORD = "dbpw-" + uuid.uuid4().hex
ORDER_SECRET = "ordersec-" + uuid.uuid4().hex
SLACK_PATH = "/services/T0/B0/" + uuid.uuid4().hex  # a Slack webhook URL is a secret in itself


@pytest.fixture
def database_with_password(postgres_admin: str):  # type: ignore[no-untyped-def]
    """A PostgreSQL URL carrying a password (the test server trusts local connections, so any works)."""
    for url in fresh_postgres_database(postgres_admin):
        yield make_url(url).set(password=DB_PASSWORD).render_as_string(hide_password=False)


def test_no_secret_or_token_reaches_the_log(tmp_path: Path, database_with_password: str):
    with LoopbackReceiver() as hook, LoopbackReceiver(default=500, echo=True) as pagerduty, \
            LoopbackReceiver(default=404, echo=True) as slack:
        receivers = [{"name": "hook", "kind": "webhook", "url": hook.url + "/in", "secret": WEBHOOK_SECRET,
                      "min_severity": "info"},
                     {"name": "pd", "kind": "pagerduty", "url": pagerduty.url + "/v2/enqueue",
                      "secret": PAGERDUTY_KEY, "min_severity": "info"},
                     {"name": "chat", "kind": "slack", "url": slack.url + SLACK_PATH, "min_severity": "info"}]
        server = LiveServer(tmp_path / "server", database_with_password, {
            "SENTINEL_LOG_LEVEL": "DEBUG", "SENTINEL_RECEIVERS": json.dumps(receivers),
            "SENTINEL_ORDER_WEBHOOK_SECRET": ORDER_SECRET, "SENTINEL_RATE_LIMIT_PER_SECOND": "2",
            "SENTINEL_RATE_LIMIT_BURST": "30", "SENTINEL_NOTIFY_MAX_ATTEMPTS": "2"}).start()
        try:
            tokens = exercise(server)
            wait_for(lambda: hook.requests and pagerduty.requests and slack.requests, timeout=30,
                     what="every receiver paged")
            time.sleep(1.0)  # let the failed PagerDuty delivery be logged
        finally:
            server.stop()
    log = server.log_path.read_text()
    assert "DEBUG" in log and "token created" in log, "the log was captured at DEBUG"
    for secret in (WEBHOOK_SECRET, PAGERDUTY_KEY, DB_PASSWORD, ORDER_SECRET, SLACK_PATH, server.admin_token,
                   *tokens):
        assert secret not in log, f"a secret reached the log: {secret[:8]}…"


def exercise(server: LiveServer) -> list[str]:
    """Tokens made over REST and by the CLI; calls that pass, and ones refused with 401, 403 and 429."""
    made: list[str] = []
    with server.api() as api:
        for name, role, node in (("agent-a", "agent", "node-a"), ("viewer-1", "viewer", None)):
            body = {"name": name, "role": role, **({"node": node} if node else {})}
            made.append(api.post("/tokens", json=body).json()["token"])
    made.append(server.token("operator", "cli-operator"))
    agent, viewer, operator = (bearer(t) for t in made)
    wrong = "snt_" + uuid.uuid4().hex
    made.append(wrong)
    with httpx.Client(base_url=server.url + "/api/v1", timeout=10) as api:
        assert api.post("/nodes/register", json=registration("node-a"), headers=agent).status_code == 200
        event = {"kind": "xid", "accelerator_uuid": "SIM-node-a-0", "xid": 79, "message": "XID 79",
                 "observed_at": time.time()}
        assert api.post("/nodes/node-a/reports", json=report("node-a", 1, events=[event]),
                        headers=agent).status_code == 200
        assert api.get("/nodes", headers=bearer(wrong)).status_code == 401
        assert api.post("/nodes/register", json=registration("node-b"), headers=agent).status_code == 403
        assert api.post("/nodes/node-a/cordon", headers=viewer).status_code == 403
        assert api.post("/nodes/node-a/cordon", json={"reason": "drill"}, headers=operator).status_code == 200
        codes = [api.get("/nodes", headers=viewer).status_code for _ in range(40)]
        assert 429 in codes
    return made


def test_settings_repr_hides_every_secret():
    from sentinel.config import Settings

    settings = Settings(database_url=f"postgresql+psycopg://sentinel:{DB_PASSWORD}@db/sentinel",
                        order_webhook_secret=ORDER_SECRET,
                        receivers=[{"name": "pd", "kind": "pagerduty", "secret": PAGERDUTY_KEY},
                                   {"name": "hook", "kind": "webhook", "url": "http://x/in", "secret": WEBHOOK_SECRET}])
    shown = repr(settings) + str(settings)
    assert not any(s in shown for s in (DB_PASSWORD, ORDER_SECRET, PAGERDUTY_KEY, WEBHOOK_SECRET))
