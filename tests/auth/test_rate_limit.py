"""Per-token rate limits: a token bucket per token on the server's clock, 429 with Retry-After, counted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from sentinel.app import create_app
from sentinel.auth.ratelimit import RateLimited, RateLimiter
from tests.conftest import FakeClock, bearer


@pytest.fixture
def limited(settings, clock: FakeClock) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    app = create_app(settings.model_copy(update={"rate_limit_per_second": 1.0, "rate_limit_burst": 3.0}), clock,
                     run_scheduler=False)
    with TestClient(app) as client:
        yield client


def new_token(client: TestClient, name: str, role: str = "viewer", **fields: object) -> dict[str, str]:
    admin = client.app.state.runtime.settings.admin_token_file.read_text().strip()  # type: ignore[attr-defined]
    # the admin's own bucket is spent by these calls too: move on a little each time
    client.app.state.runtime.clock.advance(1.0)  # type: ignore[attr-defined]
    response = client.post("/api/v1/tokens", json={"name": name, "role": role, **fields}, headers=bearer(admin))
    assert response.status_code == 201, response.text
    return bearer(response.json()["token"])


def test_over_the_burst_is_429_with_retry_after_until_the_bucket_refills(limited, clock):
    viewer, other = new_token(limited, "dash"), new_token(limited, "other")
    assert [limited.get("/api/v1/nodes", headers=viewer).status_code for _ in range(3)] == [200, 200, 200]
    refused = limited.get("/api/v1/nodes", headers=viewer)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert "token 'dash'" in refused.json()["detail"] and "limit of 1 requests/s" in refused.json()["detail"]
    assert limited.get("/api/v1/nodes", headers=other).status_code == 200, "buckets are per token"
    clock.advance(1.0)
    assert limited.get("/api/v1/nodes", headers=viewer).status_code == 200
    assert limited.get("/api/v1/nodes", headers=viewer).status_code == 429
    registry = limited.app.state.registry  # type: ignore[attr-defined]
    assert registry.get_sample_value("sentinel_rate_limited_total", {"role": "viewer"}) == 2


def test_a_token_override_wins_and_zero_is_unlimited(limited, clock):
    unlimited = new_token(limited, "fleet-sim", role="agent", node="*", rate_limit_per_second=0)
    assert all(limited.get("/api/v1/nodes/x/commands", headers=unlimited).status_code == 404 for _ in range(20))
    fast = new_token(limited, "fast", rate_limit_per_second=10)  # burst: at least one second's worth
    assert [limited.get("/api/v1/nodes", headers=fast).status_code for _ in range(11)].count(429) == 1


def test_rate_limits_can_be_switched_off(client, make_token):
    # the default settings allow 20/s with a burst of 200; the test clock does not move
    viewer = bearer(make_token("viewer"))
    codes = [client.get("/api/v1/nodes", headers=viewer).status_code for _ in range(201)]
    assert codes.count(429) == 1 and codes[-1] == 429
    limiter = RateLimiter()
    for _ in range(1000):
        limiter.take(1, role="agent", now=0.0, rate=0.0, burst=0.0)


def test_the_bucket_refills_at_its_rate():
    limiter = RateLimiter()
    for _ in range(5):
        limiter.take(7, role="launcher", now=100.0, rate=2.0, burst=5.0)
    with pytest.raises(RateLimited) as refused:
        limiter.take(7, role="launcher", now=100.0, rate=2.0, burst=5.0)
    assert refused.value.retry_after_seconds == pytest.approx(0.5)
    limiter.take(7, role="launcher", now=100.5, rate=2.0, burst=5.0)
    assert limiter.snapshot() == {"launcher": 1}


def test_a_rate_that_is_not_a_number_is_refused(limited):
    """`false` is no rate: lax parsing had made it 0, an unlimited token (found by the schema fuzzer)."""
    admin = limited.app.state.runtime.settings.admin_token_file.read_text().strip()
    for bad in (False, True, "10"):
        response = limited.post("/api/v1/tokens", json={"name": "x", "role": "viewer", "rate_limit_per_second": bad},
                                headers=bearer(admin))
        assert response.status_code == 422 and "rate_limit_per_second" in response.text, (bad, response.text)
