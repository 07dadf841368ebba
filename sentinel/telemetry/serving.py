"""What a serving replica says about its requests over one interval, on the wire (SDK → agent → server).

The SDK (`sentinel.sdk.serving`) and the engine adapters (`collectors/engines/`) fill it; the agent sums it
per task over its interval; the server sums it over a window per replica and per job (sentinel/serving/signals).
Latencies travel as sparse histograms on the shared buckets (sentinel/sdk/buckets.py), so sums stay exact.
Pydantic alone, like the rest of the wire contract.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from sentinel.sdk.buckets import MAX_BUCKET
from sentinel.telemetry.defaults import empty_dict, empty_list

# per request: time to first token, inter-token latency (per token), time per output token (after the first),
# end to end, waiting in the queue; per stage of a request (EPD disaggregation); the KV cache moved between stages
SIGNALS = ("ttft", "itl", "tpot", "e2e", "queue", "kv_transfer", "encode", "prefill", "decode")
Signal = Literal["ttft", "itl", "tpot", "e2e", "queue", "kv_transfer", "encode", "prefill", "decode"]
STAGES = ("encode", "prefill", "decode")
Stage = Literal["encode", "prefill", "decode", "mixed"]
FAILURE_REASONS = ("error", "empty", "truncated", "timeout", "cancelled", "rejected", "kv_transfer")
FailureReason = Literal["error", "empty", "truncated", "timeout", "cancelled", "rejected", "kv_transfer"]
SOURCES = ("sdk", "vllm", "sglang", "dynamo")

BucketIndex = Annotated[int, Field(ge=0, le=MAX_BUCKET)]
Count = Annotated[int, Field(ge=0, le=2**62)]
# JSON keys are strings: the schema says which (a bucket index 0..255, as buckets.MAX_BUCKET), so clients and
# schema-driven fuzzing know a key is a number
BUCKET_KEY = r"^(0|[1-9][0-9]?|1[0-9]{2}|2[0-4][0-9]|25[0-5])$"
Histogram = Annotated[dict[BucketIndex, Count], Field(max_length=MAX_BUCKET + 1, json_schema_extra={
    "propertyNames": {"pattern": BUCKET_KEY}})]
# a request's (TTFT bucket, TPOT bucket), "i:j": SLO attainment needs both of one request, not two marginals
JointKey = Annotated[str, Field(min_length=3, max_length=7, pattern=r"^[0-9]{1,3}:[0-9]{1,3}$")]
Seconds = Annotated[float, Field(ge=0.0, le=1e9)]
UnixTime = Annotated[float, Field(ge=0.0, le=4_102_444_800.0)]
# a replica's name, as `ServingStats.replica` spells it: the peer a KV cache came from is one
ReplicaName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
MAX_KV_PEERS = 64  # peers a replica's KV transfers are summed by, per interval (the rest count without one)


class KvPeer(BaseModel):
    """The KV transfers from one peer replica (the prefill replica the cache came from) over one interval."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seconds: Seconds = 0.0
    count: Count = 0
    failures: Count = 0
    bytes: Count = 0


class CanaryResult(BaseModel):
    """One active probe of a replica (collectors/engines/canary.py): a real completion of a few tokens, streamed
    and read to its end. `reason` says how it failed: error (no answer, or not 200), empty (200 and no token),
    truncated (the stream stopped before its end), timeout (no byte for too long: frozen mid-stream)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    at: UnixTime  # when it finished, on the agent's clock
    ok: bool
    reason: Literal["error", "empty", "truncated", "timeout"] | None = None
    status: Annotated[int, Field(ge=0, le=999)] | None = None  # the HTTP status, when one came
    tokens: Count = 0  # tokens streamed back
    seconds: Seconds = 0.0  # from sending to the end (or the failure)
    ttft_seconds: Seconds | None = None
    detail: Annotated[str, Field(max_length=300)] = ""


ENGINE_STATES = ("healthy", "unhealthy", "dead", "paused", "unknown")


class EngineRankState(BaseModel):
    """One engine core (a data-parallel rank) as the engine's fault-tolerance status says it: `unhealthy` (vLLM)
    or `paused` (SGLang) waits for an instruction; `dead` cannot take a retry; `fault` is what failed (vLLM's
    `fault_info`: the exception's type), `error` why its last instruction failed (vLLM's `ft_error`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rank: Annotated[int, Field(ge=0, le=65535)]
    state: Literal["healthy", "unhealthy", "dead", "paused", "unknown"]
    fault: Annotated[str, Field(max_length=200)] = ""
    error: Annotated[str, Field(max_length=300)] = ""


class FaultToleranceStatus(BaseModel):
    """A replica's `GET /fault_tolerance/status`, read by the agent (collectors/engines/fault_tolerance.py), where
    the engine exposes the fault-tolerance API (vLLM `--enable-fault-tolerance`, SGLang's framework)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    at: UnixTime  # when it was read, on the agent's clock
    engines: Annotated[list[EngineRankState], Field(max_length=64)] = empty_list()

    @property
    def waiting(self) -> list[EngineRankState]:
        """The engine cores that failed and wait for an instruction (or are dead)."""
        return [e for e in self.engines if e.state in ("unhealthy", "paused", "dead")]


class ServingStats(BaseModel):
    """One replica's requests over one interval. Counts and histograms add; gauges are the latest reading."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    source: Literal["sdk", "vllm", "sglang", "dynamo"] = "sdk"
    replica: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")] | None = None
    stage: Stage = "mixed"  # the replica's role where encode / prefill / decode run on separate replica groups
    requests: Count = 0  # finished in the interval, well or not
    failed: Annotated[dict[FailureReason, Count], Field(max_length=len(FAILURE_REASONS))] = empty_dict()
    output_tokens: Count = 0
    prompt_tokens: Count = 0
    histograms: Annotated[dict[Signal, Histogram], Field(max_length=len(SIGNALS))] = empty_dict()
    sums: Annotated[dict[Signal, Seconds], Field(max_length=len(SIGNALS))] = empty_dict()  # seconds in all, per signal
    # absent where a source has only marginals
    joint: Annotated[dict[JointKey, Count], Field(max_length=1024)] = empty_dict()
    kv_transfer_bytes: Count = 0
    kv_transfer_failures: Count = 0
    # the same transfers by the replica they came from, where the source says (the SDK's `peer`; engines do not)
    kv_transfer_peers: Annotated[dict[ReplicaName, KvPeer], Field(max_length=MAX_KV_PEERS)] = empty_dict()
    preemptions: Count = 0
    # the latest reading (None: the source does not say)
    kv_cache_usage_ratio: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    running: Count | None = None
    waiting: Count | None = None
    # requests in flight when the interval closed: how many, how old the oldest, when a token last came out
    oldest_inflight_seconds: Seconds | None = None
    # of those, how many have streamed their first token (mid-stream: a silence now is a frozen decode, not a
    # long prefill); None where the source cannot tell (a scraped engine's /metrics has no per-request state)
    streaming: Count | None = None
    last_token_at: UnixTime | None = None
    batch_limit: Annotated[int, Field(ge=1, le=1_000_000)] | None = None  # the engine's current admission limit
    canary: CanaryResult | None = None  # the latest active probe finished in the interval (engine targets only)
    fault_tolerance: FaultToleranceStatus | None = None  # the engine's fault-tolerance status (engine targets only)


def add_stats(into: ServingStats, other: ServingStats) -> ServingStats:
    """`other` summed into `into` (a later interval): counts add, gauges take the later reading."""
    for reason, n in other.failed.items():
        into.failed[reason] = into.failed.get(reason, 0) + n
    for signal, hist in other.histograms.items():
        mine = into.histograms.setdefault(signal, {})
        for k, n in hist.items():
            mine[k] = mine.get(k, 0) + n
    for signal, seconds in other.sums.items():
        into.sums[signal] = into.sums.get(signal, 0.0) + seconds
    for key, n in other.joint.items():
        if key in into.joint or len(into.joint) < 1024:
            into.joint[key] = into.joint.get(key, 0) + n
    into.requests += other.requests
    into.output_tokens += other.output_tokens
    into.prompt_tokens += other.prompt_tokens
    into.kv_transfer_bytes += other.kv_transfer_bytes
    into.kv_transfer_failures += other.kv_transfer_failures
    for peer, kv in other.kv_transfer_peers.items():
        summed = into.kv_transfer_peers.get(peer)
        if summed is None and len(into.kv_transfer_peers) < MAX_KV_PEERS:
            into.kv_transfer_peers[peer] = kv.model_copy()
        elif summed is not None:
            summed.seconds, summed.count = summed.seconds + kv.seconds, summed.count + kv.count
            summed.failures, summed.bytes = summed.failures + kv.failures, summed.bytes + kv.bytes
    into.preemptions += other.preemptions
    for name in ("kv_cache_usage_ratio", "running", "waiting", "oldest_inflight_seconds", "streaming",
                 "last_token_at", "batch_limit", "canary", "fault_tolerance"):
        value = getattr(other, name)
        if value is not None:
            setattr(into, name, value)
    into.source, into.stage = other.source, other.stage
    into.replica = other.replica or into.replica
    return into
