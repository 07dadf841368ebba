from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class EventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    severity: str
    node_id: int | None
    accelerator_uuid: str | None
    job_id: int | None
    message: str
    data: dict[str, Any]
    observed_at: datetime
    recorded_at: datetime
