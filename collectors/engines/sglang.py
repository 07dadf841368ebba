"""SGLang's `/metrics` names (python/sglang/srt/metrics/collector.py, docs "Production Metrics"), onto
Sentinel's serving signals.

The scheduler's series repeat once per parallel rank (`tp_rank`, `pp_rank`, `moe_ep_rank`, ...: every rank
of one replica sees the same requests), so the lowest rank's series is read and a gauge takes its largest
rank. `dp_rank` is not such a label: data-parallel ranks serve different requests, and their series add up.

`per_stage_req_latency_seconds{stage}` times many stages of a request, several of them per prefill or per
decode (bootstrap, waiting, transfer, per chunk); the stage that is the step itself is read (prefill_forward,
decode_loop), and only where SGLang shows none of those, any stage named after the step.

KV transfer (prefill/decode disaggregation): a `kv_transfer_latency_ms` histogram has its bounds in ms,
a `kv_transfer_total_mb` histogram its sum in MB. Versions that expose either as a gauge (the latest
transfer only) give neither: the latest value of a gauge cannot be turned into counts over an interval.
"""

from __future__ import annotations

from collections.abc import Callable

from collectors.engines.scrape import EngineMap, Labels, Rule

METRIC = "sglang:per_stage_req_latency_seconds"
STEP_STAGES = {"prefill": ("prefill_forward",), "decode": ("decode_loop",), "encode": ("encode_forward",)}


def is_rank_label(name: str) -> bool:
    return name.endswith("_rank") and name != "dp_rank"


def _stage_is(*names: str) -> Callable[[Labels], bool]:
    return lambda labels: labels.get("stage") in names


def _stage_has(word: str) -> Callable[[Labels], bool]:
    return lambda labels: word in labels.get("stage", "")


def _stage_rules() -> tuple[Rule, ...]:
    rules: list[Rule] = []
    for signal, names in STEP_STAGES.items():
        rules.append(Rule(METRIC, "histogram", signal, when=_stage_is(*names)))
        rules.append(Rule(METRIC, "histogram", signal, rank=1, when=_stage_has(signal)))
    return tuple(rules)


RULES = (
    Rule("sglang:time_to_first_token_seconds", "histogram", "ttft"),
    Rule("sglang:inter_token_latency_seconds", "histogram", "itl"),
    Rule("sglang:e2e_request_latency_seconds", "histogram", "e2e"),
    Rule("sglang:queue_time_seconds", "histogram", "queue"),
    *_stage_rules(),
    Rule("sglang:num_running_reqs", "gauge", "running"),
    Rule("sglang:num_queue_reqs", "gauge", "waiting"),
    Rule("sglang:token_usage", "gauge", "kv_cache_usage_ratio"),
    Rule("sglang:num_retracted_requests_total", "counter", "preemptions"),
    Rule("sglang:prompt_tokens_total", "counter", "prompt_tokens"),
    Rule("sglang:generation_tokens_total", "counter", "output_tokens"),
    Rule("sglang:num_requests_total", "counter", "requests"),
    Rule("sglang:num_aborted_requests_total", "counter", "failed:cancelled"),
    Rule("sglang:kv_transfer_latency_ms", "histogram", "kv_transfer", scale=1e-3),
    Rule("sglang:num_transfer_failed_reqs_total", "counter", "kv_transfer_failures"),
    Rule("sglang:kv_transfer_total_mb", "sum", "kv_transfer_bytes", scale=1e6),
)

MAP = EngineMap("sglang", RULES, is_rank_label=is_rank_label)
