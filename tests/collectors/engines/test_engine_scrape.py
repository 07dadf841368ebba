"""The generic engine scraper (collectors/engines/scrape.py): deltas, resets, bad pages, real HTTP.

The exposition fixtures in fixtures/ are written from the engines' documented metric definitions, not
captured from a running engine.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from collectors.engines import EngineScraper
from collectors.engines.scrape import EngineMap, Rule, bucket_delta, counter_delta
from sentinel.sdk.buckets import bucket

FIXTURES = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- the arithmetic ------------------------------------------------------------------------------------------

def test_a_counter_gives_what_it_gained_and_a_reset_gives_its_new_value() -> None:
    assert counter_delta(10.0, 7.0) == 3.0
    assert counter_delta(2.0, 7.0) == 2.0  # went down: the engine restarted
    assert counter_delta(5.0, None) == 5.0  # a series born since the previous reading


def test_a_cumulative_histogram_becomes_per_bucket_gains() -> None:
    before = {0.1: 1.0, 0.5: 3.0, float("inf"): 3.0}
    after = {0.1: 1.0, 0.5: 5.0, float("inf"): 6.0}
    assert bucket_delta(after, before) == [(0.1, 0), (0.5, 2), (float("inf"), 1)]


def test_a_histogram_that_went_down_or_changed_bounds_counts_in_full() -> None:
    before = {0.1: 4.0, 0.5: 9.0, float("inf"): 9.0}
    restarted = {0.1: 1.0, 0.5: 2.0, float("inf"): 2.0}
    assert bucket_delta(restarted, before) == [(0.1, 1), (0.5, 1), (float("inf"), 0)]
    rebounded = {0.2: 5.0, float("inf"): 10.0}
    assert bucket_delta(rebounded, before) == [(0.2, 5), (float("inf"), 5)]


# -- readings --------------------------------------------------------------------------------------------------

def test_the_first_reading_is_the_baseline_with_gauges_and_no_counts() -> None:
    scraper = EngineScraper("vllm", "http://unused")
    stats = scraper.from_text(page("vllm_before.txt"), now=100.0)
    assert stats is not None
    assert (stats.running, stats.waiting, stats.kv_cache_usage_ratio) == (4, 1, 0.31)
    assert stats.requests == 0 and stats.histograms == {} and stats.sums == {} and stats.prompt_tokens == 0
    assert scraper.last_reading_at == 100.0 and scraper.last_error is None


def test_replica_and_stage_travel_with_the_stats() -> None:
    scraper = EngineScraper("vllm", "http://unused", replica="prefill-0", stage="prefill")
    scraper.from_text(page("vllm_before.txt"), now=1.0)
    stats = scraper.from_text(page("vllm_after.txt"), now=2.0)
    assert stats is not None
    assert (stats.source, stats.replica, stats.stage) == ("vllm", "prefill-0", "prefill")


@pytest.mark.parametrize("garbage", [
    "<html><body>502 Bad Gateway</body></html>",
    "hello world",
    "",
    'vllm:time_to_first_token_seconds_bucket{le="soon"} 3',
    "# TYPE other_metric counter\nother_metric_total 5\n",  # exposition text, but nothing of this engine
    "\x00\xff\xfe",
])
def test_a_garbage_page_gives_none_and_says_why(garbage: str) -> None:
    scraper = EngineScraper("vllm", "http://engine:8000/metrics")
    assert scraper.from_text(garbage, now=1.0) is None
    assert scraper.last_error is not None and "http://engine:8000/metrics" in scraper.last_error


def test_a_garbage_page_keeps_the_last_good_baseline() -> None:
    scraper = EngineScraper("vllm", "http://unused")
    scraper.from_text(page("vllm_before.txt"), now=1.0)
    assert scraper.from_text("<html>oops</html>", now=2.0) is None
    stats = scraper.from_text(page("vllm_after.txt"), now=3.0)
    assert stats is not None and stats.requests == 3  # against the first page, not a fresh baseline
    assert scraper.last_error is None


def test_a_page_the_wire_model_refuses_gives_none_not_an_exception() -> None:
    scraper = EngineScraper("vllm", "http://unused")
    assert scraper.from_text('vllm:num_requests_running{engine="0"} -3\n', now=1.0) is None
    assert scraper.last_error is not None and "running" in scraper.last_error


def test_rules_with_an_unknown_target_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown target"):
        EngineMap("vllm", (Rule("x_seconds", "histogram", "latency"),))
    with pytest.raises(ValueError, match="unknown target"):
        EngineMap("vllm", (Rule("x_total", "counter", "failed:exploded"),))


def test_an_unknown_engine_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        EngineScraper("tgi", "http://unused")  # type: ignore[arg-type]


# -- over HTTP -----------------------------------------------------------------------------------------------

def test_a_real_scrape_reports_the_interval(server: tuple[str, dict[str, str]]) -> None:
    base, pages = server
    scraper = EngineScraper("vllm", f"{base}/metrics", replica="vllm-0")
    pages["/metrics"] = page("vllm_before.txt")
    first = scraper.scrape()
    assert first is not None and first.requests == 0 and first.running == 4
    pages["/metrics"] = page("vllm_after.txt")
    second = scraper.scrape(now=50.0)
    assert second is not None and second.requests == 3
    assert second.histograms["ttft"] == {bucket(0.08): 3}
    assert scraper.last_error is None and scraper.last_reading_at == 50.0


def test_a_non_200_answer_gives_none(server: tuple[str, dict[str, str]]) -> None:
    base, _ = server
    scraper = EngineScraper("vllm", f"{base}/broken")
    assert scraper.scrape() is None
    assert scraper.last_error is not None and "HTTP 500" in scraper.last_error


def test_a_refused_connection_gives_none() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scraper = EngineScraper("sglang", f"http://127.0.0.1:{port}/metrics", timeout_seconds=1.0)
    assert scraper.scrape() is None
    assert scraper.last_error is not None and "refused" in scraper.last_error.lower()


def test_an_engine_that_never_answers_times_out() -> None:
    with socket.socket() as listener:  # accepts the connection (the kernel does) and never says a word
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        scraper = EngineScraper("dynamo", f"http://127.0.0.1:{listener.getsockname()[1]}/metrics",
                                timeout_seconds=0.2)
        assert scraper.scrape() is None
    assert scraper.last_error is not None and "timed out" in scraper.last_error.lower()


def _ttft_page(bounds: dict[str, int], seconds: float) -> str:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {n}' for le, n in bounds.items()]
    lines += [f"vllm:time_to_first_token_seconds_sum {seconds}"]
    return "\n".join(lines) + "\n"


def test_a_histogram_sum_restarts_with_its_buckets() -> None:
    """Restarted with other bounds, the engine's sum has already passed the old one: it is new all the same,
    or the mean would mix two engines' requests."""
    scraper = EngineScraper("vllm", "http://unused")
    scraper.from_text(_ttft_page({"0.1": 2, "+Inf": 2}, 0.15), now=1.0)
    stats = scraper.from_text(_ttft_page({"0.2": 3, "+Inf": 3}, 0.45), now=2.0)
    assert stats is not None
    assert stats.histograms == {"ttft": {bucket(0.2): 3}}
    assert stats.sums == {"ttft": pytest.approx(0.45)}
