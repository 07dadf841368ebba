"""NVIDIA Dynamo's frontend `/metrics` read as ServingStats (collectors/engines/dynamo.py).

The fixtures (fixtures/dynamo_*.txt) are written from Dynamo's documented frontend metric definitions, not
captured from a running deployment. Two models; between the readings three more requests: two for model A,
one for model B, which failed.
"""

from __future__ import annotations

import pytest

from sentinel.sdk.buckets import bucket
from sentinel.telemetry.serving import ServingStats
from tests.collectors.engines.pages import interval, page, without


@pytest.fixture(scope="module")
def stats() -> ServingStats:
    return interval("dynamo", page("dynamo_before.txt"), page("dynamo_after.txt"))


def test_histograms_add_up_across_models(stats: ServingStats) -> None:
    assert stats.histograms == {
        "ttft": {bucket(0.25): 2, bucket(0.5): 1},
        "itl": {bucket(0.02): 50},
        "e2e": {bucket(2.5): 2, bucket(5.0): 1},
    }
    assert stats.sums["e2e"] == pytest.approx(0.9 * (2 * 2.5 + 5.0))


def test_requests_and_failures_come_from_the_status_label(stats: ServingStats) -> None:
    assert stats.requests == 3
    assert stats.failed == {"error": 1}


def test_tokens_are_counted_once(stats: ServingStats) -> None:
    # output_tokens_total, not also the _sum of output_sequence_tokens (which says the same 400)
    assert stats.output_tokens == 400
    assert stats.prompt_tokens == 2000  # the _sum of input_sequence_tokens


def test_without_the_output_counter_the_sequence_histogram_counts_the_tokens() -> None:
    stats = interval("dynamo", *(without(page(n), "dynamo_frontend_output_tokens_total")
                       for n in ("dynamo_before.txt", "dynamo_after.txt")))
    assert stats.output_tokens == 400


def test_the_gauges_add_up_across_models(stats: ServingStats) -> None:
    assert (stats.running, stats.waiting, stats.kv_cache_usage_ratio) == (2, 1, None)


def test_requests_without_a_status_label_are_not_failures() -> None:
    line = "# TYPE dynamo_frontend_requests_total counter\ndynamo_frontend_requests_total{{model=\"m\"}} {n}\n"
    stats = interval("dynamo", line.format(n=5), line.format(n=9))
    assert (stats.requests, stats.failed) == (4, {})
