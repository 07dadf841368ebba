"""vLLM's `/metrics` read as ServingStats (collectors/engines/vllm.py).

The fixtures (fixtures/vllm_*.txt) are written from vLLM's documented metric definitions, not captured from a
running engine. Between vllm_before and vllm_after: three more requests (one aborted), a preemption, five
NIXL transfers (one failed); vllm_restarted is the page of an engine that came back.
"""

from __future__ import annotations

import pytest

from collectors.engines import EngineScraper
from sentinel.sdk.buckets import bucket, count, quantile
from sentinel.telemetry.serving import ServingStats
from tests.collectors.engines.pages import interval, page, without


@pytest.fixture(scope="module")
def stats() -> ServingStats:
    return interval("vllm", page("vllm_before.txt"), page("vllm_after.txt"))


def test_each_histogram_gains_what_the_interval_observed(stats: ServingStats) -> None:
    assert stats.histograms == {
        "ttft": {bucket(0.08): 3},
        "itl": {bucket(0.05): 50, bucket(0.075): 10},
        "tpot": {bucket(0.075): 3},
        "e2e": {bucket(2.0): 3},
        "queue": {bucket(0.3): 3},
        "prefill": {bucket(0.06): 3},
        "decode": {bucket(2.0): 3},
        "kv_transfer": {bucket(0.01): 2, bucket(0.05): 3},
    }


def test_quantiles_read_back_near_the_engine_buckets(stats: ServingStats) -> None:
    assert quantile(stats.histograms["ttft"], 0.5) == pytest.approx(0.08, rel=0.1)
    assert quantile(stats.histograms["itl"], 0.5) == pytest.approx(0.05, rel=0.1)
    assert quantile(stats.histograms["itl"], 0.95) == pytest.approx(0.075, rel=0.1)


def test_the_sums_are_the_seconds_the_interval_added(stats: ServingStats) -> None:
    # the fixture puts each observation at 0.9 of its bucket's bound
    assert stats.sums["ttft"] == pytest.approx(3 * 0.9 * 0.08)
    assert stats.sums["itl"] == pytest.approx(0.9 * (50 * 0.05 + 10 * 0.075))


def test_the_counters_give_their_deltas(stats: ServingStats) -> None:
    assert stats.requests == 3  # every finished_reason: stop +2, abort +1
    assert stats.failed == {"cancelled": 1}
    assert (stats.prompt_tokens, stats.output_tokens) == (3000, 600)
    assert stats.preemptions == 1
    assert stats.kv_transfer_bytes == 300_000_000  # the _sum of nixl_bytes_transferred
    assert stats.kv_transfer_failures == 1
    assert stats.joint == {}  # engines expose only marginals


def test_the_gauges_are_the_latest_reading(stats: ServingStats) -> None:
    assert (stats.running, stats.waiting, stats.kv_cache_usage_ratio) == (2, 0, 0.42)


def test_a_deprecated_name_shown_beside_its_successor_counts_once(stats: ServingStats) -> None:
    assert "vllm:time_per_output_token_seconds" in page("vllm_after.txt")
    assert count(stats.histograms["itl"]) == 60


def test_an_older_vllm_is_read_through_its_old_names() -> None:
    before, after = (without(without(page(n), "vllm:inter_token_latency_seconds"), "vllm:kv_cache_usage_perc")
                     for n in ("vllm_before.txt", "vllm_after.txt"))
    old_cache = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.77\n"
    stats = interval("vllm", before, after + old_cache)
    assert stats.histograms["itl"] == {bucket(0.05): 50, bucket(0.075): 10}
    assert stats.kv_cache_usage_ratio == 0.77


def test_an_engine_restart_counts_the_new_values_as_the_delta() -> None:
    scraper = EngineScraper("vllm", "http://unused")
    for name in ("vllm_before.txt", "vllm_after.txt"):
        scraper.from_text(page(name), now=1.0)
    stats = scraper.from_text(page("vllm_restarted.txt"), now=3.0)
    assert stats is not None
    assert stats.histograms["ttft"] == {bucket(0.04): 1}
    assert stats.histograms["itl"] == {bucket(0.025): 20}
    assert (stats.requests, stats.prompt_tokens, stats.output_tokens, stats.preemptions) == (1, 500, 20, 0)
    assert "kv_transfer" not in stats.histograms and stats.kv_transfer_bytes == 0
    assert stats.running == 1


def test_a_finished_reason_that_appears_later_counts_in_full() -> None:
    before = without(page("vllm_before.txt"), 'finished_reason="abort"')
    stats = interval("vllm", before, page("vllm_after.txt"))
    assert stats.failed == {"cancelled": 1} and stats.requests == 3
