"""vLLM's `/metrics` names (docs.vllm.ai "Production Metrics"; V1 engine), onto Sentinel's serving signals.

Series carry `model_name` and, with data parallelism, `engine`: they add up (the ratio gauge takes the
largest). Older vLLM names are read only where the newer one is absent, so a version that shows both (a
deprecated name kept visible) does not count twice.
"""

from __future__ import annotations

from collectors.engines.scrape import EngineMap, Labels, Rule


def _aborted(labels: Labels) -> bool:
    return labels.get("finished_reason") == "abort"


def _errored(labels: Labels) -> bool:
    return labels.get("finished_reason") == "error"


RULES = (
    Rule("vllm:time_to_first_token_seconds", "histogram", "ttft"),
    Rule("vllm:inter_token_latency_seconds", "histogram", "itl"),
    Rule("vllm:time_per_output_token_seconds", "histogram", "itl", rank=1),  # its name before inter_token_latency
    Rule("vllm:request_time_per_output_token_seconds", "histogram", "tpot"),
    Rule("vllm:e2e_request_latency_seconds", "histogram", "e2e"),
    Rule("vllm:request_queue_time_seconds", "histogram", "queue"),
    Rule("vllm:request_prefill_time_seconds", "histogram", "prefill"),
    Rule("vllm:request_decode_time_seconds", "histogram", "decode"),
    Rule("vllm:num_requests_running", "gauge", "running"),
    Rule("vllm:num_requests_waiting", "gauge", "waiting"),
    Rule("vllm:kv_cache_usage_perc", "gauge", "kv_cache_usage_ratio"),  # a 0-1 ratio despite the name
    Rule("vllm:gpu_cache_usage_perc", "gauge", "kv_cache_usage_ratio", rank=1),
    Rule("vllm:num_preemptions_total", "counter", "preemptions"),
    Rule("vllm:prompt_tokens_total", "counter", "prompt_tokens"),
    Rule("vllm:generation_tokens_total", "counter", "output_tokens"),
    # one series per finished_reason (stop, length, abort, ...): every one finished, abort as a cancellation
    Rule("vllm:request_success_total", "counter", "requests"),
    Rule("vllm:request_success_total", "counter", "failed:cancelled", when=_aborted),
    Rule("vllm:request_success_total", "counter", "failed:error", when=_errored),
    # NIXL, the KV connector of prefill/decode disaggregation (on the side that pulls the KV cache)
    Rule("vllm:nixl_xfer_time_seconds", "histogram", "kv_transfer"),
    Rule("vllm:nixl_bytes_transferred", "sum", "kv_transfer_bytes"),  # a histogram of bytes per transfer
    Rule("vllm:nixl_num_failed_transfers", "counter", "kv_transfer_failures"),
)

MAP = EngineMap("vllm", RULES)
