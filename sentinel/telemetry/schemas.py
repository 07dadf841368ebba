"""The wire contract between a node agent and the central service.

Imported by the agent as well as the server, so it depends on pydantic alone. Every float
rejects NaN and Inf, every list and string is bounded: validation happens at the edge.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sentinel.telemetry.defaults import empty_dict, empty_list
from sentinel.telemetry.serving import ServingStats

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
Uuid = Annotated[str, Field(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Bytes = Annotated[int, Field(ge=0, le=2**63 - 1)]
Label = Annotated[str, Field(max_length=256)]
# A wall-clock time in Unix seconds, up to 2100-01-01: every one converts to a datetime (1e300 did not, and
# a report carrying it failed in ingest with a 503 the agent retried for ever).
UnixTime = Annotated[float, Field(ge=0.0, le=4_102_444_800.0)]


def _iso_only(value: object) -> object:
    if isinstance(value, int | float):  # pydantic would read it as Unix time; the schema promises a string
        raise ValueError("expected an ISO 8601 date-time string with a time zone")
    return value


# A request's date-time: ISO 8601 text with a zone, as its JSON schema says; a bare number is refused.
IsoDateTime = Annotated[AwareDatetime, BeforeValidator(_iso_only)]

EVENT_KINDS = ("xid", "ecc", "thermal", "power", "offline", "hang", "slow", "remap", "clear", "probe", "link_down",
               "link_up", "other")
EventKind = Literal["xid", "ecc", "thermal", "power", "offline", "hang", "slow", "remap", "clear", "probe",
                    "link_down", "link_up", "other"]
# An RDMA port as "<device>/<port>" (sysfs /sys/class/infiniband/<device>/ports/<port>)
NicName = Annotated[str, Field(min_length=3, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*/[0-9]{1,4}$")]


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=False)


class AcceleratorInfo(WireModel):
    """What an accelerator is: sent once at registration."""

    uuid: Uuid
    index: Annotated[int, Field(ge=0, le=1023)]
    model: Annotated[str, Field(min_length=1, max_length=128)]
    memory_total_bytes: Bytes
    source: Annotated[str, Field(min_length=1, max_length=32)]
    simulated: bool = False
    peak_flops: Annotated[float, Field(gt=0.0, le=1e18)] | None = None


class NodeRegistration(WireModel):
    name: Name
    hostname: Annotated[str, Field(max_length=255)] = ""
    interval_seconds: Annotated[float, Field(gt=0.0, le=3600.0)] = 10.0
    agent_version: Annotated[str, Field(max_length=64)] = ""
    sources: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] = empty_list()
    accelerators: Annotated[list[AcceleratorInfo], Field(max_length=64)] = empty_list()
    labels: Annotated[dict[Label, Label], Field(max_length=32)] = empty_dict()


class ProcessMemory(WireModel):
    pid: Annotated[int, Field(ge=0, le=2**31 - 1)]
    used_bytes: Bytes


class HostMetrics(WireModel):
    cpu_ratio: Ratio
    load1: Annotated[float, Field(ge=0.0, le=1e6)] = 0.0
    memory_used_bytes: Bytes
    memory_total_bytes: Bytes
    disk_used_bytes: Bytes = 0
    disk_total_bytes: Bytes = 0
    net_rx_bytes_total: Count = 0
    net_tx_bytes_total: Count = 0
    task_memory: Annotated[list[ProcessMemory], Field(max_length=1024)] = empty_list()


class AcceleratorSample(WireModel):
    """One reading of one accelerator. Optional fields are those a source may not have."""

    uuid: Uuid
    utilization_ratio: Ratio
    memory_used_bytes: Bytes
    memory_total_bytes: Bytes
    memory_peak_bytes: Bytes | None = None
    power_watts: Annotated[float, Field(ge=0.0, le=1e5)] | None = None
    temperature_celsius: Annotated[float, Field(ge=-273.15, le=1000.0)] | None = None
    sm_clock_hz: Annotated[float, Field(ge=0.0, le=1e12)] | None = None
    throttle_reasons: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] = empty_list()
    ecc_corrected_total: Count | None = None
    ecc_uncorrected_total: Count | None = None
    retired_pages_total: Count | None = None
    remapped_rows_total: Count | None = None
    remap_failure: bool | None = None
    pcie_replay_total: Count | None = None
    nvlink_errors_total: Count | None = None
    xid_errors_total: Annotated[dict[str, Count], Field(max_length=64)] = empty_dict()
    processes: Annotated[list[ProcessMemory], Field(max_length=256)] = empty_list()


class HardwareEvent(WireModel):
    """A fault seen on a node, pushed at once rather than at the next interval."""

    kind: EventKind
    accelerator_uuid: Uuid | None = None
    xid: Annotated[int, Field(ge=0, le=100_000)] | None = None
    message: Annotated[str, Field(max_length=1024)] = ""
    observed_at: UnixTime
    # probe: achieved ÷ expected performance of the accelerator (None: this source cannot probe)
    value: Annotated[float, Field(ge=0.0, le=1e6)] | None = None
    # the same event seen `count` times, the first at `observed_at`, the last at `last_observed_at`
    # (the agent folds repeats into one event; NVSentinel #1120: ~800,000 duplicate XID lines, 29 distinct)
    count: Annotated[int, Field(ge=1, le=2**31)] = 1
    last_observed_at: UnixTime | None = None
    nic: NicName | None = None  # link_down / link_up: the port that changed


Seconds = Annotated[float, Field(ge=0.0, le=1e9)]
# a serving engine on the task's own node: KIND@URL[#REPLICA[:STAGE]], loopback only (the agent scrapes what the
# server names, so the server can point it at nothing beyond the node's own engines)
EngineSpec = Annotated[str, Field(max_length=300, pattern=(
    r"^(vllm|sglang|dynamo)@http://(127\.0\.0\.1|localhost|\[::1\]):[0-9]{1,5}(/[A-Za-z0-9._~/-]*)?"
    r"(#[A-Za-z0-9][A-Za-z0-9._-]{0,63}(:(encode|prefill|decode|mixed))?)?$"))]
JobId = Annotated[int, Field(ge=1, le=2**31 - 1)]  # the jobs.id INTEGER column
Rank = Annotated[int, Field(ge=0, le=10_000_000)]
Pid = Annotated[int, Field(ge=1, le=2**31 - 1)]  # the tasks.pid INTEGER column


CounterName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_]+$")]
PerSecond = Annotated[float, Field(ge=0.0, le=1e15)]


class NicPort(WireModel):
    """One RDMA port (InfiniBand or RoCE) as the `rdma` source read it from sysfs (collectors/rdma.py).

    `counters` are totals the agent keeps monotonic: a 32- or 64-bit counter that wrapped, or was reset
    (`perfquery -R`), is folded in, so a total never goes down while the agent runs. `port_xmit_data` and
    `port_rcv_data` are converted from the kernel's 4-octet units into bytes. `rates` are per second over
    the last collection window (absent on the first reading and for a counter that just wrapped past
    recognition). A field the kernel did not give (missing, empty, "N/A", unreadable) is left out.
    """

    device: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
    port: Annotated[int, Field(ge=0, le=9999)]
    state: Annotated[str, Field(max_length=32)] | None = None  # ACTIVE, DOWN, INIT, ARMED, ...
    state_id: Annotated[int, Field(ge=0, le=15)] | None = None
    phys_state: Annotated[str, Field(max_length=32)] | None = None  # LinkUp, Disabled, Polling, ...
    phys_state_id: Annotated[int, Field(ge=0, le=15)] | None = None
    rate_bytes_per_second: Annotated[float, Field(ge=0.0, le=1e15)] | None = None
    link_layer: Annotated[str, Field(max_length=32)] | None = None  # InfiniBand | Ethernet
    counters: Annotated[dict[CounterName, Count], Field(max_length=128)] = empty_dict()
    rates: Annotated[dict[CounterName, PerSecond], Field(max_length=128)] = empty_dict()
    link_flaps_total: Count = 0  # ACTIVE → not ACTIVE transitions the agent saw since it started
    saturated: Annotated[list[CounterName], Field(max_length=128)] = empty_list()  # counters stuck at their maximum

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool | None:
        return None if self.state is None else self.state == "ACTIVE"


class ProbeResult(WireModel):
    """What one agent measured probing one peer over the last window (collectors/probes.py)."""

    target: Name
    sent: Annotated[int, Field(ge=1, le=1_000_000)]
    received: Annotated[int, Field(ge=0, le=1_000_000)]
    rtt_p50_seconds: Annotated[float, Field(ge=0.0, le=60.0)] | None = None  # None: nothing came back
    rtt_p99_seconds: Annotated[float, Field(ge=0.0, le=60.0)] | None = None
    rtt_max_seconds: Annotated[float, Field(ge=0.0, le=60.0)] | None = None
    started_at: UnixTime
    ended_at: UnixTime

    @model_validator(mode="after")
    def _consistent(self) -> ProbeResult:
        if self.received > self.sent:
            raise ValueError(f"received {self.received} probes of {self.sent} sent")
        if self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")
        return self

    @property
    def loss_ratio(self) -> float:
        return max(0.0, 1.0 - self.received / self.sent)


ExperimentId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")]


class ExperimentResult(WireModel):
    """What an agent measured for an experiment the server asked for (collectors/experiments.py). `value` is in
    `unit`; `error` says why there is no value (failed, timed out, not possible here): never a made-up result."""

    id: ExperimentId
    kind: Annotated[str, Field(min_length=1, max_length=32)]
    value: Annotated[float, Field(ge=0.0, le=1e18)] | None = None
    unit: Annotated[str, Field(max_length=32)] = ""
    detail: Annotated[str, Field(max_length=1024)] = ""
    error: Annotated[str, Field(max_length=1024)] | None = None
    started_at: UnixTime
    ended_at: UnixTime


class CollectiveTotals(WireModel):
    count: Count
    seconds: Seconds
    bytes: Count = 0


class TaskFailure(WireModel):
    """An uncaught exception the SDK saw before the process died."""

    type: Annotated[str, Field(max_length=128)]
    message: Annotated[str, Field(max_length=1024)] = ""


class TaskPause(WireModel):
    """The rank is between steps on purpose since `since` (its wall clock): a checkpoint save, an evaluation
    (SDK `Telemetry.pause`). The hang detector gives it hang_pause_seconds instead of its step cadence."""

    reason: Annotated[str, Field(min_length=1, max_length=32)]
    since: UnixTime


class TaskModel(WireModel):
    """What MFU needs from the job: FLOPs per token and, where the job knows it, the peak."""

    flops_per_token: Annotated[float, Field(gt=0.0, le=1e18)]
    peak_flops_per_accelerator: Annotated[float, Field(gt=0.0, le=1e18)] | None = None
    accelerators_per_rank: Annotated[int, Field(ge=1, le=64)] = 1
    dtype: Annotated[str, Field(max_length=16)] = "bf16"
    accelerator_model: Annotated[str, Field(max_length=128)] | None = None


# A named part of a step the SDK timed (`Telemetry.phase`, `Telemetry.data`, `pause`): data_wait, checkpoint,
# host, all_to_all, evaluation, or a job's own name
PhaseName = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_]*$")]


class ExpertLoad(WireModel):
    """Mixture-of-experts routing over an interval (SDK `Telemetry.record_experts`): max ÷ mean tokens per expert
    (1.0 is perfectly balanced) and the tokens dropped for capacity."""

    imbalance: Annotated[float, Field(ge=1.0, le=1e6)]
    routed_tokens: Count = 0
    dropped_tokens: Count = 0


class TaskTelemetry(WireModel):
    """One task's (rank's) telemetry over one agent interval, summed from the SDK's batches."""

    job_id: JobId
    rank: Rank
    attempt: Annotated[int, Field(ge=0, le=100_000)] = 0
    pid: Pid
    steps: Count = 0
    last_step: Count | None = None
    first_step_at: UnixTime | None = None  # wall time the interval's first step ended
    step_seconds: Annotated[list[Seconds], Field(max_length=1024)] = empty_list()
    tokens: Count = 0
    busy_seconds: Seconds = 0.0
    collective_seconds: Seconds = 0.0
    exposed_collective_seconds: Seconds | None = None
    collectives: Annotated[dict[Annotated[str, Field(max_length=64)], CollectiveTotals],
                           Field(max_length=32)] = empty_dict()
    memory_peak_bytes: Bytes | None = None
    memory_source: Annotated[str, Field(max_length=16)] | None = None
    device_memory_bytes: Bytes | None = None
    model: TaskModel | None = None
    failure: TaskFailure | None = None
    dropped_batches: Count = 0
    pause: TaskPause | None = None  # as the interval's latest batch said; None: not paused
    # step-time decomposition (sentinel/diagnosis): wall time from one step's end to the next's, summed over
    # `iterations` steps; named phases' seconds, and the part of them spent inside steps; MoE routing
    iterations: Count = 0
    iteration_seconds: Seconds = 0.0
    phases: Annotated[dict[PhaseName, Seconds], Field(max_length=16)] = empty_dict()
    phases_in_step_seconds: Seconds = 0.0
    experts: ExpertLoad | None = None
    # of the time the task's threads were runnable, the share spent waiting for a CPU (/proc/<pid>/schedstat)
    cpu_wait_ratio: Ratio | None = None
    serving: ServingStats | None = None  # a serving replica's requests (SDK or an engine adapter)


class TaskExit(WireModel):
    """A watched task process ended: exit code, or the signal that killed it."""

    job_id: JobId | None = None
    rank: Rank | None = None
    pid: Pid
    exit_code: Annotated[int, Field(ge=0, le=255)] | None = None
    signal: Annotated[int, Field(ge=1, le=128)] | None = None
    observed_at: UnixTime


class NodeReport(WireModel):
    """Everything one node says in one interval; `seq` only grows, per node."""

    node: Name
    seq: Annotated[int, Field(ge=1, le=2**62)]
    sent_at: UnixTime
    interval_seconds: Annotated[float, Field(gt=0.0, le=3600.0)] = 10.0
    host: HostMetrics | None = None
    accelerators: Annotated[list[AcceleratorSample], Field(max_length=64)] = empty_list()
    events: Annotated[list[HardwareEvent], Field(max_length=256)] = empty_list()
    tasks: Annotated[list[TaskTelemetry], Field(max_length=256)] = empty_list()
    task_exits: Annotated[list[TaskExit], Field(max_length=256)] = empty_list()
    nics: Annotated[list[NicPort], Field(max_length=64)] = empty_list()
    probes: Annotated[list[ProbeResult], Field(max_length=256)] = empty_list()
    experiments: Annotated[list[ExperimentResult], Field(max_length=16)] = empty_list()
    # the agent's last report before a stop on purpose (systemctl stop, Ctrl-C): its silence is no fault
    leaving: bool = False


class SdkBatch(WireModel):
    """What `sentinel.sdk.Telemetry` posts to the local agent (`POST /v1/telemetry`)."""

    job_id: JobId
    rank: Rank
    attempt: Annotated[int, Field(ge=0, le=100_000)] = 0
    pid: Pid
    # (step index, started at, duration s, tokens, collective s, exposed collective s)
    steps: Annotated[list[tuple[Count, UnixTime, Seconds, Count | None, Seconds,
                                Seconds | None]], Field(max_length=20_000)] = empty_list()
    collectives: Annotated[dict[Annotated[str, Field(max_length=64)],
                                tuple[Count, Seconds, Count]], Field(max_length=32)] = empty_dict()
    model: TaskModel | None = None
    failure: TaskFailure | None = None
    memory_peak_bytes: Bytes | None = None
    memory_source: Annotated[str, Field(max_length=16)] | None = None
    dropped_batches: Count = 0
    pause: TaskPause | None = None  # sent only while paused, so an older agent refuses only those batches
    # phase → (seconds, of which inside steps); sent only when timed, so an older agent refuses only those
    phases: Annotated[dict[PhaseName, tuple[Seconds, Seconds]], Field(max_length=16)] = empty_dict()
    experts: ExpertLoad | None = None
    serving: ServingStats | None = None  # sent only by a serving process, so an older agent refuses only those


class Assignment(BaseModel):
    """A task placed on this node, so the agent can watch its process and drive sim load; `engine`: the serving
    engine whose /metrics speaks for it (collectors/engines/watch.py), as its launcher registered it."""

    job_id: int
    rank: int
    pid: int | None
    accelerators: list[str]
    engine: str | None = None


class NodeCommand(BaseModel):
    """An instruction for the agent, e.g. a fault drill on a simulated accelerator."""

    id: str
    kind: Literal["inject", "probe", "experiment"]
    accelerator_index: int
    fault: str
    argument: float | None = None
    # kind "experiment": what to measure (collectors/experiments.py), e.g. {"kind": "cpu", "pids": [..]}
    spec: dict[str, Any] | None = None


class ProbeTarget(BaseModel):
    """A registered agent this node is to probe, at the address it registered (label `probe_addr`)."""

    node: str
    address: str  # host:port (UDP)


class ReportAck(BaseModel):
    status: Literal["accepted", "duplicate"]
    node: str
    seq: int
    assignments: list[Assignment] = empty_list()
    commands: list[NodeCommand] = empty_list()
    cleared: list[str] = empty_list()  # accelerators released or recovered since: their fault gauges return to 0
    probe_targets: list[ProbeTarget] | None = None  # None: keep the current ones; []: probe no one

