"""What the diagnosis API and the MCP tools answer (DESIGN §7: `GET /jobs/{id}/diagnosis`,
`POST /jobs/{id}/experiments`). The MCP server's tool schemas are generated from these models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Layer = Literal["compute", "interconnect", "input_pipeline", "checkpoint_io", "host", "hardware", "software"]
ExperimentKind = Literal["gemm", "cpu", "memory_bandwidth", "disk_write", "collective", "data_loader",
                         "rank_compare"]
Verdict = Literal["confirmed", "refuted", "inconclusive"]


class ComponentChange(BaseModel):
    component: str
    before_seconds: float  # per step, the job's baseline (the rank named, or the mean over ranks)
    after_seconds: float
    share_before: float  # of the iteration (wall time per step)
    share_after: float


class RuledOut(BaseModel):
    what: str
    why: str


class ExperimentProposal(BaseModel):
    kind: ExperimentKind
    node: str | None = None
    accelerator: str | None = None
    peer: str | None = None
    rank: int | None = None
    why: str
    expect: str  # what result confirms the diagnosis, and what refutes it


class ExperimentRequest(BaseModel):
    """Run an experiment for a job: the diagnosis's proposal when nothing else is given."""

    model_config = ConfigDict(extra="forbid")

    kind: ExperimentKind | None = None
    node: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    accelerator: Annotated[str, Field(min_length=1, max_length=96)] | None = None
    peer: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    rank: Annotated[int, Field(ge=0, le=10_000_000)] | None = None


class ExperimentOut(BaseModel):
    id: str
    job_id: int
    kind: ExperimentKind
    node: str | None
    target: str  # what it measured, in words
    state: Literal["pending", "done", "failed", "timed_out"]
    value: float | None = None
    unit: str = ""
    detail: str = ""
    error: str | None = None
    expected: float | None = None  # the reference it is compared with (calibration, peers, or the baseline)
    expected_from: str = ""
    ratio: float | None = None  # value ÷ expected
    verdict: Verdict | None = None
    summary: str = ""  # one line: "confirmed: n1↔n2 bus bandwidth 0.31× its calibration"
    calibration: bool = False  # run to learn a reference while the job was healthy
    created_at: float
    finished_at: float | None = None


class Diagnosis(BaseModel):
    """Which layer a job's slowdown comes from, with the evidence, what was ruled out, and an experiment."""

    job_id: int
    layer: Layer
    component: str
    title: str
    straggler: bool = False  # a few ranks slow, the rest waiting for them
    ranks: list[int]
    nodes: list[str]
    slowdown: float  # iteration time ÷ baseline − 1
    iteration_before_seconds: float
    iteration_after_seconds: float
    onset_at: float
    diagnosed_at: float
    changes: list[ComponentChange]
    signals: dict[str, Any]  # correlated node signals: throttle, clocks, CPU wait, memory, NIC / mesh verdicts
    ruled_out: list[RuledOut]
    proposed_experiment: ExperimentProposal
    status: Literal["suspected", "confirmed", "refuted"] = "suspected"
    confirmation: str = ""
    experiments: list[ExperimentOut] = []
    next_steps: list[str] = []


class DiagnosisOut(BaseModel):
    job_id: int
    state: Literal["learning", "healthy", "slowdown"]
    detail: str
    baseline_iteration_seconds: float | None = None
    current_iteration_seconds: float | None = None
    diagnosis: Diagnosis | None = None
    components: dict[str, dict[str, float]] = {}  # rank → component → seconds per step, over the recent window


class RankRow(BaseModel):
    rank: int
    node: str
    iteration_seconds: float
    components: dict[str, float]
    baseline: dict[str, float] = {}
    cpu_wait_ratio: float | None = None
    expert_imbalance: float | None = None


class TimelinePoint(BaseModel):
    at: float
    iteration_seconds: float  # mean over ranks
    components: dict[str, float]  # mean over ranks, seconds per step
