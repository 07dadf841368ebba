"""SGLang's `/metrics` read as ServingStats (collectors/engines/sglang.py).

The fixtures (fixtures/sglang_*.txt) are written from SGLang's documented metric definitions, not captured
from a running engine. Their scheduler series repeat for tp_rank 0 and 1 with the same counts (the same
requests on each rank); between the two readings: four more requests (one aborted), two retractions, four KV
transfers (one failed) of 48 MB in all.
"""

from __future__ import annotations

import pytest

from sentinel.sdk.buckets import bucket
from sentinel.telemetry.serving import ServingStats
from tests.collectors.engines.pages import interval, page

STAGE_BOUNDS = [round(0.001 * 1.62**i, 8) for i in range(14)]  # the fixture's per-stage buckets




@pytest.fixture(scope="module")
def stats() -> ServingStats:
    return interval("sglang", page("sglang_before.txt"), page("sglang_after.txt"))


def test_the_tokenizer_histograms_and_counters(stats: ServingStats) -> None:
    assert stats.histograms["ttft"] == {bucket(0.4): 4}
    assert stats.histograms["itl"] == {bucket(0.015): 100}
    assert stats.histograms["e2e"] == {bucket(4): 4}
    assert (stats.requests, stats.failed) == (4, {"cancelled": 1})
    assert (stats.prompt_tokens, stats.output_tokens) == (4000, 400)


def test_series_repeated_per_tp_rank_count_once(stats: ServingStats) -> None:
    assert 'tp_rank="1"' in page("sglang_after.txt")
    assert stats.histograms["queue"] == {bucket(0.1): 4}
    assert stats.preemptions == 2
    assert stats.kv_transfer_failures == 1
    assert stats.kv_transfer_bytes == 48_000_000  # 48 MB once, not once per rank
    assert stats.running == 3 and stats.waiting == 0  # the same requests on both ranks: not 6


def test_token_usage_is_the_largest_rank(stats: ServingStats) -> None:
    assert stats.kv_cache_usage_ratio == 0.55  # rank 0 says 0.50, rank 1 0.55


def test_kv_transfer_latency_in_ms_lands_in_seconds(stats: ServingStats) -> None:
    assert stats.histograms["kv_transfer"] == {bucket(0.050): 4}
    assert stats.sums["kv_transfer"] == pytest.approx(4 * 0.9 * 0.050)


def test_the_stage_histogram_gives_the_prefill_and_decode_steps_themselves(stats: ServingStats) -> None:
    # prefill_forward, not chunked_prefill (8 more chunks) nor request_process
    assert stats.histograms["prefill"] == {bucket(STAGE_BOUNDS[7]): 4}
    assert stats.histograms["decode"] == {bucket(STAGE_BOUNDS[12]): 4}
    assert "encode" not in stats.histograms


def _stage_page(stage: str, n: int) -> str:
    return ("# TYPE sglang:per_stage_req_latency_seconds histogram\n"
            f'sglang:per_stage_req_latency_seconds_bucket{{stage="{stage}",tp_rank="0",le="0.5"}} {n}\n'
            f'sglang:per_stage_req_latency_seconds_bucket{{stage="{stage}",tp_rank="0",le="+Inf"}} {n}\n')


def test_a_stage_named_after_a_step_stands_in_where_the_step_itself_is_absent() -> None:
    stats = interval("sglang", _stage_page("encode_mm", 1), _stage_page("encode_mm", 3))
    assert stats.histograms == {"encode": {bucket(0.5): 2}}
    stats = interval("sglang",
                     _stage_page("prefill_forward", 1) + _stage_page("prefill_bootstrap", 1).split("\n", 1)[1],
                     _stage_page("prefill_forward", 2) + _stage_page("prefill_bootstrap", 9).split("\n", 1)[1])
    assert stats.histograms == {"prefill": {bucket(0.5): 1}}  # the step is there: bootstrap is not read


def _ranks_page(counts: dict[tuple[str, str], int], usage: dict[tuple[str, str], float]) -> str:
    lines = ["# TYPE sglang:num_retracted_requests_total counter"]
    lines += [f'sglang:num_retracted_requests_total{{dp_rank="{dp}",tp_rank="{tp}"}} {n}'
              for (dp, tp), n in counts.items()]
    lines += ["# TYPE sglang:token_usage gauge"]
    lines += [f'sglang:token_usage{{dp_rank="{dp}",tp_rank="{tp}"}} {u}' for (dp, tp), u in usage.items()]
    lines += ["# TYPE sglang:num_running_reqs gauge"]
    lines += [f'sglang:num_running_reqs{{dp_rank="{dp}",tp_rank="{tp}"}} 4' for (dp, tp) in usage]
    return "\n".join(lines) + "\n"


def test_the_lowest_tp_rank_is_read_and_data_parallel_ranks_add_up() -> None:
    usage = {("0", "0"): 0.1, ("0", "1"): 0.3, ("1", "2"): 0.2, ("1", "10"): 0.2}
    before = _ranks_page({("0", "0"): 1, ("0", "1"): 1, ("1", "2"): 1, ("1", "10"): 1}, usage)
    # dp 0: rank 0 +2 (rank 1 disagrees, +5: not read); dp 1: rank 2 (lower than 10, as a number) +3
    after = _ranks_page({("0", "0"): 3, ("0", "1"): 6, ("1", "2"): 4, ("1", "10"): 100}, usage)
    stats = interval("sglang", before, after)
    assert stats.preemptions == 5
    assert stats.running == 8  # 4 per data-parallel rank, each repeated on two tp ranks
    assert stats.kv_cache_usage_ratio == 0.3


def test_kv_transfer_figures_exposed_as_gauges_are_not_read() -> None:
    gauges = ("# TYPE sglang:kv_transfer_latency_ms gauge\nsglang:kv_transfer_latency_ms{tp_rank=\"0\"} 12.5\n"
              "# TYPE sglang:kv_transfer_total_mb gauge\nsglang:kv_transfer_total_mb{tp_rank=\"0\"} 30.0\n"
              "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank=\"0\"} 1\n")
    stats = interval("sglang", gauges, gauges.replace("12.5", "14.0").replace("30.0", "60.0"))
    assert "kv_transfer" not in stats.histograms and stats.kv_transfer_bytes == 0
