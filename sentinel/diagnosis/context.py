"""What the diagnosis engine reads of the server's live state: the detectors' context has all of it
(sentinel/detection/base.py DetectionContext); named here as a protocol so this package does not depend on
detection, which depends on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sentinel.live.fleet import Fleet
from sentinel.live.jobs import JobTelemetry
from sentinel.live.samples import SampleStore
from sentinel.network.view import NetworkView
from sentinel.telemetry.schemas import Assignment


class LiveContext(Protocol):
    fleet: Fleet
    samples: SampleStore
    jobs: JobTelemetry
    network: NetworkView | None

    @property
    def assignments(self) -> Callable[[], dict[int, list[Assignment]]]: ...

    def placement(self, job_id: int, rank: int) -> tuple[str | None, list[str]]: ...
