"""The latest sample per accelerator, and a short fixed-size window of key values for detection.

Windows are ring buffers of floats (not sample objects) so 100,000 accelerators fit in ~100 MB.
"""

from __future__ import annotations

import threading
from array import array

from sentinel.telemetry.schemas import AcceleratorSample

WINDOW_FIELDS = ("time", "utilization_ratio", "memory_used_bytes", "power_watts", "temperature_celsius")


class RingWindow:
    def __init__(self, size: int):
        self.size = size
        self.count = 0
        self._next = 0
        self._columns = {name: array("d", bytes(8 * size)) for name in WINDOW_FIELDS}

    def append(self, at: float, sample: AcceleratorSample) -> None:
        i = self._next
        cols = self._columns
        cols["time"][i] = at
        cols["utilization_ratio"][i] = sample.utilization_ratio
        cols["memory_used_bytes"][i] = float(sample.memory_used_bytes)
        cols["power_watts"][i] = sample.power_watts if sample.power_watts is not None else float("nan")
        temp = sample.temperature_celsius
        cols["temperature_celsius"][i] = temp if temp is not None else float("nan")
        self._next = (i + 1) % self.size
        self.count = min(self.count + 1, self.size)

    def values(self, name: str) -> list[float]:
        """Oldest first."""
        col = self._columns[name]
        if self.count < self.size:
            return list(col[: self.count])
        return list(col[self._next :]) + list(col[: self._next])


class SampleStore:
    def __init__(self, window_samples: int):
        self._window_samples = window_samples
        self._latest: dict[str, tuple[float, AcceleratorSample]] = {}
        self._windows: dict[str, RingWindow] = {}
        self._lock = threading.Lock()

    def add(self, at: float, samples: list[AcceleratorSample]) -> None:
        with self._lock:
            for sample in samples:
                self._latest[sample.uuid] = (at, sample)
                window = self._windows.get(sample.uuid)
                if window is None:
                    window = self._windows[sample.uuid] = RingWindow(self._window_samples)
                window.append(at, sample)

    def latest(self, uuid: str) -> tuple[float, AcceleratorSample] | None:
        with self._lock:
            return self._latest.get(uuid)

    def window(self, uuid: str) -> RingWindow | None:
        with self._lock:
            return self._windows.get(uuid)
