from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from sentinel.telemetry.schemas import AcceleratorSample


class AcceleratorOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    uuid: str
    node: str = ""
    index: int
    model: str
    memory_total_bytes: int
    source: str
    simulated: bool
    health: str
    health_reason: str
    health_incident_id: int | None = None
    health_changed_at: datetime | None = None
    present: bool
    sampled_at: datetime | None = None
    latest: AcceleratorSample | None = None


class NodeReliability(BaseModel):
    node: str
    hardware_faults: int
    accelerator_days: float
    faults_per_1000_accelerator_days: float | None


class FleetReliability(BaseModel):
    """Hardware faults (XID, uncorrectable ECC, remap failures, devices lost) per 1,000 accelerator-days."""

    hardware_faults: int
    accelerator_days: float
    faults_per_1000_accelerator_days: float | None
    nodes: list[NodeReliability]
