"""The NVML collector without a GPU: the real pynvml module where it can run here, a fake beneath it."""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from typing import Any

import pynvml
import pytest

from collectors.base import SourceUnavailable, create
from collectors.nvml import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    THROTTLE_REASONS,
    NvmlCollector,
    decode_throttle_reasons,
    event_from_nvml,
    memory_used_total,
    process_memory,
    utilization_ratio,
)
from sentinel.telemetry.schemas import HardwareEvent
from tests.live import wait_for

GIB = 2**30


def _gpu_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


# ---- the real library on a machine without a driver ----


@pytest.mark.skipif(_gpu_present(), reason="an NVIDIA driver is present; test_nvml_gpu.py covers it")
def test_real_pynvml_without_driver_is_unavailable_with_one_clear_message() -> None:
    began = time.monotonic()
    with pytest.raises(SourceUnavailable, match=r"^nvml: NVIDIA driver library not found \(no GPU") as raised:
        create("nvml", "node-a")
    assert "NVML Shared Library Not Found" in str(raised.value)
    assert time.monotonic() - began < 2.0


# ---- pure conversions, fed NVML's own ctypes structs and constants ----


def test_memory_struct_gives_used_and_total() -> None:
    memory = pynvml.c_nvmlMemory_t(total=80 * GIB, free=30 * GIB, used=50 * GIB)
    assert memory_used_total(memory) == (50 * GIB, 80 * GIB)


def test_utilization_struct_is_a_ratio() -> None:
    assert utilization_ratio(pynvml.c_nvmlUtilization_t(gpu=37, memory=5)) == pytest.approx(0.37)
    assert utilization_ratio(pynvml.c_nvmlUtilization_t(gpu=100, memory=0)) == 1.0
    assert utilization_ratio(pynvml.c_nvmlUtilization_t(gpu=0, memory=0)) == 0.0


def test_process_info_raw_and_friendly() -> None:
    raw = pynvml.c_nvmlProcessInfo_t(pid=4242, usedGpuMemory=3 * GIB)
    assert process_memory(raw).model_dump() == {"pid": 4242, "used_bytes": 3 * GIB}
    not_available = pynvml.c_nvmlProcessInfo_t(pid=7, usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)
    assert process_memory(not_available).used_bytes == 0
    friendly = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(pid=9, usedGpuMemory=5))
    friendly.usedGpuMemory = None  # what pynvml's getter does with NVML_VALUE_NOT_AVAILABLE
    assert process_memory(friendly).model_dump() == {"pid": 9, "used_bytes": 0}


def test_throttle_table_matches_pynvml_constants() -> None:
    expected = {
        "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
        "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
        "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
        "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
        "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
        "board_limit": pynvml.nvmlClocksThrottleReasonBoardLimit,
        "reliability": pynvml.nvmlClocksThrottleReasonReliability,
    }
    assert {name: bit for bit, name in THROTTLE_REASONS.items()} == expected


def test_throttle_mask_decodes_only_real_throttling() -> None:
    mask = (
        pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        | pynvml.nvmlClocksEventReasonGpuIdle
        | pynvml.nvmlClocksEventReasonApplicationsClocksSetting
        | pynvml.nvmlClocksEventReasonDisplayClockSetting
    )
    assert decode_throttle_reasons(mask) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(pynvml.nvmlClocksEventReasonNone) == []
    assert decode_throttle_reasons(pynvml.nvmlClocksEventReasonGpuIdle) == []


def test_event_types_match_pynvml_and_convert() -> None:
    assert pynvml.nvmlEventTypeXidCriticalError == EVENT_XID
    assert pynvml.nvmlEventTypeDoubleBitEccError == EVENT_DOUBLE_BIT_ECC
    assert pynvml.nvmlEventTypeSingleBitEccError == EVENT_SINGLE_BIT_ECC
    xid = event_from_nvml(pynvml.nvmlEventTypeXidCriticalError, 79, "GPU-a", 12.5)
    assert xid == HardwareEvent(kind="xid", accelerator_uuid="GPU-a", xid=79, message="XID 79", observed_at=12.5)
    ecc = event_from_nvml(pynvml.nvmlEventTypeDoubleBitEccError, 0, "GPU-a", 1.0)
    assert ecc is not None and ecc.kind == "ecc" and ecc.xid is None and "double-bit" in ecc.message
    assert event_from_nvml(pynvml.nvmlEventTypePState, 0, "GPU-a", 1.0) is None
    huge = event_from_nvml(pynvml.nvmlEventTypeXidCriticalError, 2**40, None, 1.0)
    assert huge is not None and huge.xid is None and huge.message == f"XID {2**40}"


# ---- the collector over a fake NVML ----


class FakeNvml:
    """Test double for the pynvml module: real constants, error classes and structs, canned readings.

    Handles are real c_nvmlDevice_t pointers, and each event carries a fresh pointer object to the same
    address, as NVML's do, so identity-based lookups would fail here as they would on a GPU.
    """

    BASE_ADDRESS = 0x5000

    def __init__(self, devices: int = 1) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.count = devices
        self.init_error: pynvml.NVMLError | None = None
        self.unsupported: set[str] = set()  # function names that raise NotSupported
        self.lost: set[int] = set()  # device indexes whose every call raises GpuIsLost
        self.memory_used = {index: 10 * GIB for index in range(devices)}
        self.throttle_mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonGpuIdle
        self.processes: list[Any] = []
        self.events: queue.Queue[tuple[int, int, int]] = queue.Queue()
        self.registered: dict[int, int] = {}
        self.calls: list[str] = []

    def _device(self, function: str, handle: Any) -> int:
        self.calls.append(function)
        index = int(ctypes.cast(handle, ctypes.c_void_p).value or 0) - self.BASE_ADDRESS
        if index in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if function in self.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return index

    def _handle(self, index: int) -> Any:
        return ctypes.cast(self.BASE_ADDRESS + index, pynvml.c_nvmlDevice_t)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._handle(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        index = self._device("nvmlDeviceGetUUID", handle)
        uuid = f"GPU-fake-{index}"
        return uuid.encode() if index % 2 else uuid  # older pynvml releases return bytes

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._device("nvmlDeviceGetName", handle)
        return "NVIDIA Fake H200"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        used = self.memory_used[self._device("nvmlDeviceGetMemoryInfo", handle)]
        return pynvml.c_nvmlMemory_t(total=141 * GIB, free=141 * GIB - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._device("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=64, memory=20)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._device("nvmlDeviceGetPowerUsage", handle)
        return 312_500  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._device("nvmlDeviceGetTemperature", handle)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 47

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._device("nvmlDeviceGetClockInfo", handle)
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980  # MHz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self.throttle_mask

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        self._device("nvmlDeviceGetTotalEccErrors", handle)
        assert counter_type == pynvml.NVML_AGGREGATE_ECC
        return 3 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._device("nvmlDeviceGetRetiredPages", handle)
        return [0x1000] if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else [0x2000, 0x3000]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._device("nvmlDeviceGetRemappedRows", handle)
        return (2, 1, 0, 1)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._device("nvmlDeviceGetPcieReplayCounter", handle)
        return 7

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._device("nvmlDeviceGetNvLinkState", handle)
        if link >= 3:
            raise pynvml.NVMLError_InvalidArgument()  # the board has three links
        return pynvml.NVML_FEATURE_ENABLED if link < 2 else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        self._device("nvmlDeviceGetNvLinkErrorCounter", handle)
        if counter == pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA:
            raise pynvml.NVMLError_NotSupported()
        return 100 if link == 2 else 1  # link 2 is down and must not count

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        return self.processes

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._device("nvmlDeviceGetSupportedEventTypes", handle)
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: str) -> None:
        self.registered[self._device("nvmlDeviceRegisterEvents", handle)] = event_types

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        try:
            index, event_type, event_data = self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        return pynvml.c_nvmlEventData_t(device=self._handle(index), eventType=event_type, eventData=event_data)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls.append("nvmlEventSetFree")


class EventSink:
    """Collects emitted events and lets a test wait for them."""

    def __init__(self) -> None:
        self.events: list[HardwareEvent] = []
        self._arrived = threading.Condition()

    def __call__(self, event: HardwareEvent) -> None:
        with self._arrived:
            self.events.append(event)
            self._arrived.notify_all()

    def wait_for(self, count: int, timeout_seconds: float = 2.0) -> list[HardwareEvent]:
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.events) >= count, timeout=timeout_seconds)
            return list(self.events)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(devices=2)


def test_init_failure_is_one_source_unavailable(fake: FakeNvml) -> None:
    fake.init_error = pynvml.NVMLError_DriverNotLoaded()
    with pytest.raises(SourceUnavailable, match=r"^nvml: NVIDIA driver not loaded: Driver Not Loaded$"):
        NvmlCollector(nvml=fake)


def test_no_devices_is_unavailable_and_shuts_nvml_down(fake: FakeNvml) -> None:
    fake.count = 0
    with pytest.raises(SourceUnavailable, match="no NVIDIA devices"):
        NvmlCollector(nvml=fake)
    assert fake.calls[-1] == "nvmlShutdown"


def test_accelerators_take_uuid_as_str_or_bytes(fake: FakeNvml) -> None:
    infos = NvmlCollector(nvml=fake).accelerators()
    assert [(i.uuid, i.index, i.model, i.memory_total_bytes) for i in infos] == [
        ("GPU-fake-0", 0, "NVIDIA Fake H200", 141 * GIB),
        ("GPU-fake-1", 1, "NVIDIA Fake H200", 141 * GIB),
    ]
    assert all(i.source == "nvml" and not i.simulated for i in infos)


def test_collect_converts_every_field(fake: FakeNvml) -> None:
    fake.processes = [
        pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(pid=4242, usedGpuMemory=3 * GIB)),
        pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(pid=4243, usedGpuMemory=0)),
    ]
    fake.processes[1].usedGpuMemory = None
    sample = NvmlCollector(nvml=fake).collect([]).accelerators[0]
    assert sample.model_dump() == {
        "uuid": "GPU-fake-0",
        "utilization_ratio": pytest.approx(0.64),
        "memory_used_bytes": 10 * GIB,
        "memory_total_bytes": 141 * GIB,
        "memory_peak_bytes": 10 * GIB,
        "power_watts": 312.5,
        "temperature_celsius": 47.0,
        "sm_clock_hz": 1980e6,
        "throttle_reasons": ["sw_power_cap"],
        "ecc_corrected_total": 3,
        "ecc_uncorrected_total": 1,
        "retired_pages_total": 3,
        "remapped_rows_total": 3,
        "remap_failure": True,
        "pcie_replay_total": 7,
        "nvlink_errors_total": 8,  # links 0 and 1 active, four supported counters each
        "xid_errors_total": {},
        "processes": [{"pid": 4242, "used_bytes": 3 * GIB}, {"pid": 4243, "used_bytes": 0}],
    }


def test_unsupported_counters_leave_only_their_fields_empty(fake: FakeNvml) -> None:
    fake.unsupported = {
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetComputeRunningProcesses",
    }
    sample = NvmlCollector(nvml=fake).collect([]).accelerators[0]
    assert sample.retired_pages_total is None
    assert sample.power_watts is None
    assert sample.throttle_reasons == []
    assert sample.nvlink_errors_total is None
    assert sample.processes == []
    assert sample.temperature_celsius == 47.0 and sample.pcie_replay_total == 7
    assert sample.ecc_uncorrected_total == 1


def test_peak_memory_is_the_highest_seen_per_device(fake: FakeNvml) -> None:
    collector = NvmlCollector(nvml=fake)
    peaks = []
    for used in (50 * GIB, 80 * GIB, 30 * GIB):
        fake.memory_used[0] = used
        sample = collector.collect([]).accelerators[0]
        peaks.append((sample.memory_used_bytes, sample.memory_peak_bytes))
    assert peaks == [(50 * GIB, 50 * GIB), (80 * GIB, 80 * GIB), (30 * GIB, 80 * GIB)]
    assert collector.collect([]).accelerators[1].memory_peak_bytes == 10 * GIB


def test_lost_device_goes_offline_once_and_the_rest_keep_reporting(fake: FakeNvml) -> None:
    collector = NvmlCollector(nvml=fake, clock=lambda: 1000.0)
    sink = EventSink()
    collector.start(sink)
    try:
        fake.lost.add(1)
        first = collector.collect([])
        second = collector.collect([])
    finally:
        collector.close()
    assert [s.uuid for s in first.accelerators] == ["GPU-fake-0"]
    assert [s.uuid for s in second.accelerators] == ["GPU-fake-0"]
    offline = [e for e in sink.events if e.kind == "offline"]
    assert len(offline) == 1
    assert offline[0].accelerator_uuid == "GPU-fake-1" and offline[0].observed_at == 1000.0


def test_event_thread_emits_xid_and_counts_it(fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    collector = NvmlCollector(nvml=fake, clock=lambda: 1234.5)
    sink = EventSink()
    collector.start(sink)
    try:
        time.sleep(0.6)  # at least one idle wait: NVML's Timeout is the normal case, not a failure
        wait_for(lambda: len(fake.registered) == 2, timeout=10, what="both devices registered")
        assert fake.registered == {
            0: pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError,
            1: pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError,
        }
        fake.events.put((1, pynvml.nvmlEventTypeXidCriticalError, 79))
        fake.events.put((1, pynvml.nvmlEventTypeDoubleBitEccError, 0))
        events = sink.wait_for(2)
        samples = {s.uuid: s for s in collector.collect([]).accelerators}
    finally:
        began = time.monotonic()
        collector.close()
        closed_in_seconds = time.monotonic() - began
    assert events[0] == HardwareEvent(
        kind="xid", accelerator_uuid="GPU-fake-1", xid=79, message="XID 79", observed_at=1234.5
    )
    assert events[1].kind == "ecc" and events[1].accelerator_uuid == "GPU-fake-1"
    assert samples["GPU-fake-1"].xid_errors_total == {"79": 1}
    assert samples["GPU-fake-0"].xid_errors_total == {}
    assert closed_in_seconds < 2.0
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert not [t for t in threading.enumerate() if t.name == "nvml-events"]
    assert fake.calls[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]


def test_a_device_refusing_events_does_not_stop_the_others(fake: FakeNvml) -> None:
    original = fake.nvmlDeviceRegisterEvents

    def refuse_device_zero(handle: Any, event_types: int, event_set: str) -> None:
        if ctypes.cast(handle, ctypes.c_void_p).value == FakeNvml.BASE_ADDRESS:
            raise pynvml.NVMLError_NotSupported()
        original(handle, event_types, event_set)

    fake.nvmlDeviceRegisterEvents = refuse_device_zero  # type: ignore[method-assign]
    collector = NvmlCollector(nvml=fake)
    sink = EventSink()
    collector.start(sink)
    try:
        fake.events.put((1, pynvml.nvmlEventTypeXidCriticalError, 48))
        assert [e.xid for e in sink.wait_for(1)] == [48]
    finally:
        collector.close()
    assert list(fake.registered) == [1]


def test_a_failing_sink_does_not_kill_the_watcher(fake: FakeNvml) -> None:
    collector = NvmlCollector(nvml=fake)
    sink = EventSink()
    calls = []

    def flaky(event: HardwareEvent) -> None:
        calls.append(event)
        if len(calls) == 1:
            raise RuntimeError("push queue full")
        sink(event)

    collector.start(flaky)
    try:
        fake.events.put((0, pynvml.nvmlEventTypeXidCriticalError, 31))
        fake.events.put((0, pynvml.nvmlEventTypeXidCriticalError, 43))
        assert [e.xid for e in sink.wait_for(1)] == [43]
    finally:
        collector.close()
