"""The NVML collector against a real NVIDIA driver; skipped where nvmlInit cannot succeed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pynvml
import pytest

from collectors.nvml import NvmlCollector
from sentinel.telemetry.schemas import AcceleratorSample, HardwareEvent


def _gpu_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return bool(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_present(), reason="needs an NVIDIA GPU and driver"),
]


@pytest.fixture
def collector() -> Iterator[NvmlCollector]:
    source = NvmlCollector()
    yield source
    source.close()


def test_accelerators_are_the_real_devices(collector: NvmlCollector) -> None:
    infos = collector.accelerators()
    assert infos
    assert [i.index for i in infos] == list(range(len(infos)))
    for info in infos:
        assert info.uuid.startswith(("GPU-", "MIG-"))
        assert info.memory_total_bytes > 0
        assert info.model and info.source == "nvml" and not info.simulated


def test_collect_reads_plausible_values(collector: NvmlCollector) -> None:
    collector.collect([])
    samples = collector.collect([]).accelerators
    assert [s.uuid for s in samples] == [i.uuid for i in collector.accelerators()]
    for sample in samples:
        assert 0.0 <= sample.utilization_ratio <= 1.0
        assert 0 < sample.memory_used_bytes <= sample.memory_total_bytes
        assert sample.memory_peak_bytes is not None and sample.memory_peak_bytes >= sample.memory_used_bytes
        assert sample.temperature_celsius is not None and 5.0 < sample.temperature_celsius < 110.0
        assert sample.power_watts is None or 0.0 < sample.power_watts < 2000.0
        assert sample.sm_clock_hz is None or 1e8 < sample.sm_clock_hz < 5e9
        assert AcceleratorSample.model_validate_json(sample.model_dump_json()) == sample


def test_event_thread_starts_and_closes_within_two_seconds() -> None:
    events: list[HardwareEvent] = []
    source = NvmlCollector()
    source.start(events.append)
    assert [t for t in threading.enumerate() if t.name == "nvml-events"]
    time.sleep(0.7)  # let it go through at least one idle wait
    began = time.monotonic()
    source.close()
    assert time.monotonic() - began < 2.0
    assert not [t for t in threading.enumerate() if t.name == "nvml-events"]
    assert all(e.kind in ("xid", "ecc") for e in events)
