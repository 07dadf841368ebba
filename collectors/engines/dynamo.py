"""NVIDIA Dynamo's frontend `/metrics` names (`dynamo_frontend_*`, docs "Metrics"), onto Sentinel's serving
signals.

Series carry `model` (and `endpoint`, `request_type`, `status`): they add up across models. The frontend
sees requests end to end; it has no KV cache gauge and no per-stage timing.
"""

from __future__ import annotations

from collectors.engines.scrape import EngineMap, Labels, Rule


def _not_success(labels: Labels) -> bool:
    return "status" in labels and labels["status"] != "success"


RULES = (
    Rule("dynamo_frontend_time_to_first_token_seconds", "histogram", "ttft"),
    Rule("dynamo_frontend_inter_token_latency_seconds", "histogram", "itl"),
    Rule("dynamo_frontend_request_duration_seconds", "histogram", "e2e"),
    Rule("dynamo_frontend_requests_total", "counter", "requests"),  # finished ones, by status
    Rule("dynamo_frontend_requests_total", "counter", "failed:error", when=_not_success),
    Rule("dynamo_frontend_inflight_requests", "gauge", "running"),
    Rule("dynamo_frontend_queued_requests", "gauge", "waiting"),
    Rule("dynamo_frontend_output_tokens_total", "counter", "output_tokens"),
    # histograms of tokens per request: their sums count the tokens (output: where the counter is absent)
    Rule("dynamo_frontend_output_sequence_tokens", "sum", "output_tokens", rank=1),
    Rule("dynamo_frontend_input_sequence_tokens", "sum", "prompt_tokens"),
)

MAP = EngineMap("dynamo", RULES)
