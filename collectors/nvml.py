"""NVIDIA accelerators read through NVML (nvidia-ml-py), plus a thread that pushes XID/ECC events.

Counters differ between boards and drivers, so every query is optional: one that NVML refuses
(NotSupported, NoPermission, ...) leaves its field None and is logged once, never failing the sample.
Only a device that is gone (GPU lost) is dropped, with one "offline" event.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.base import Collector, EmitEvent, Readings, SourceUnavailable, register
from sentinel.telemetry.schemas import (
    AcceleratorInfo,
    AcceleratorSample,
    Assignment,
    EventKind,
    HardwareEvent,
    ProcessMemory,
)

log = logging.getLogger(__name__)

EVENT_WAIT_MS = 500  # how long one nvmlEventSetWait blocks, and so the most close() waits for the thread
MAX_XID = 100_000  # the wire schema's bound on HardwareEvent.xid
MAX_PROCESSES = 256  # the wire schema's bound on AcceleratorSample.processes
NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong, in a raw process-info struct

# Clock-event bits (nvml.h nvmlClocksEventReason*) that mean the clocks are held down. GpuIdle,
# ApplicationsClocksSetting and DisplayClockSetting are left out: they are settings, not throttling.
THROTTLE_REASONS: dict[int, str] = {
    0x0004: "sw_power_cap",
    0x0008: "hw_slowdown",
    0x0010: "sync_boost",
    0x0020: "sw_thermal_slowdown",
    0x0040: "hw_thermal_slowdown",
    0x0080: "hw_power_brake_slowdown",
    0x0200: "board_limit",
    0x0400: "reliability",
}

EVENT_SINGLE_BIT_ECC = 0x0001  # nvmlEventTypeSingleBitEccError
EVENT_DOUBLE_BIT_ECC = 0x0002  # nvmlEventTypeDoubleBitEccError
EVENT_XID = 0x0008  # nvmlEventTypeXidCriticalError
WATCHED_EVENTS = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC

THROTTLE_GETTERS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")

# Errors that mean the device itself is gone rather than one counter missing.
_LOST_ERROR_NAMES = ("NVMLError_GpuIsLost", "NVMLError_Unknown", "NVMLError_GpuNotFound")


def utilization_ratio(utilization: Any) -> float:
    """c_nvmlUtilization_t.gpu is a percentage of the last sample period."""
    return min(max(int(utilization.gpu) / 100.0, 0.0), 1.0)


def memory_used_total(memory: Any) -> tuple[int, int]:
    """c_nvmlMemory_t → (used, total) bytes."""
    return int(memory.used), int(memory.total)


def process_memory(info: Any) -> ProcessMemory:
    """A process-info struct or pynvml's friendly object; memory NVML cannot report becomes 0."""
    used = info.usedGpuMemory
    if used is None or int(used) == NOT_AVAILABLE_ULL:
        used = 0
    return ProcessMemory(pid=int(info.pid), used_bytes=int(used))


def decode_throttle_reasons(mask: int) -> list[str]:
    """The clocks-event bitmask → short names of the reasons that are real throttling."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def event_from_nvml(
    event_type: int, event_data: int, accelerator_uuid: str | None, observed_at: float
) -> HardwareEvent | None:
    """One c_nvmlEventData_t → the wire event; None for event types Sentinel does not watch."""
    kind: EventKind
    xid: int | None = None
    if event_type & EVENT_XID:
        kind, xid, message = "xid", int(event_data), f"XID {int(event_data)}"
    elif event_type & EVENT_DOUBLE_BIT_ECC:
        kind, message = "ecc", "double-bit ECC error"
    elif event_type & EVENT_SINGLE_BIT_ECC:
        kind, message = "ecc", "single-bit ECC error"
    else:
        return None
    if xid is not None and not 0 <= xid <= MAX_XID:
        xid = None  # kept in the message; the wire field is bounded
    return HardwareEvent(kind=kind, accelerator_uuid=accelerator_uuid, xid=xid, message=message,
                         observed_at=observed_at)


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as error:
        raise SourceUnavailable(f"nvml: nvidia-ml-py is not installed: {error}") from error
    return pynvml


def _text(value: str | bytes) -> str:
    """pynvml returns str from its string getters, older releases bytes."""
    return value.decode() if isinstance(value, bytes) else value


def _handle_key(handle: Any) -> Any:
    """ctypes device pointers compare by identity; their address is what identifies the device."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


class _DeviceLost(Exception):
    """Raised inside one device's sample when NVML says the device is gone."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str
    memory_total_bytes: int
    memory_peak_bytes: int = 0
    lost: bool = False
    xid_counts: dict[str, int] = field(default_factory=dict)


class NvmlCollector(Collector):
    """Every NVIDIA device on the node. `nvml` is the pynvml module, injectable for tests."""

    name = "nvml"

    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.time) -> None:
        nvml = nvml if nvml is not None else _import_pynvml()
        self._nvml = nvml
        self._clock = clock
        # pynvml raises this non-NVMLError when an unversioned getter is missing from an old driver.
        self._errors = (nvml.NVMLError, getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError))
        self._lost_errors = tuple(getattr(nvml, name) for name in _LOST_ERROR_NAMES if hasattr(nvml, name))
        self._lock = threading.Lock()
        self._logged: set[tuple[str, str]] = set()
        self._emit: EmitEvent | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._closed = False
        self._init_library()
        try:
            self._devices = self._enumerate()
        except nvml.NVMLError as error:
            self._quietly(nvml.nvmlShutdown)
            raise SourceUnavailable(f"nvml: cannot list devices: {error}") from error
        if not self._devices:
            self._quietly(nvml.nvmlShutdown)
            raise SourceUnavailable("nvml: the driver reports no NVIDIA devices on this node")
        self._by_handle = {_handle_key(device.handle): device for device in self._devices}

    def _init_library(self) -> None:
        """nvmlInit, with the one message an operator needs when it fails."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            if isinstance(error, getattr(nvml, "NVMLError_LibraryNotFound", ())):
                reason = "NVIDIA driver library not found (no GPU on this node?)"
            elif isinstance(error, getattr(nvml, "NVMLError_DriverNotLoaded", ())):
                reason = "NVIDIA driver not loaded"
            else:
                reason = "cannot initialise NVML"
            raise SourceUnavailable(f"nvml: {reason}: {error}") from error

    def _enumerate(self) -> list[_Device]:
        """A device that is already broken is left out, so one bad board does not hide the others."""
        nvml = self._nvml
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                device = _Device(index, handle, _text(nvml.nvmlDeviceGetUUID(handle)), "NVIDIA GPU", 0)
                name = self._query(device, "nvmlDeviceGetName")
                memory = self._query(device, "nvmlDeviceGetMemoryInfo")
            except (nvml.NVMLError, _DeviceLost) as error:
                log.warning("nvml: leaving out device %d: %s", index, error)
                continue
            device.model = _text(name) if name else device.model
            device.memory_total_bytes = memory_used_total(memory)[1] if memory is not None else 0
            devices.append(device)
        return devices

    def accelerators(self) -> list[AcceleratorInfo]:
        return [AcceleratorInfo(uuid=device.uuid, index=device.index, model=device.model, source="nvml",
                                memory_total_bytes=device.memory_total_bytes, simulated=False)
                for device in self._devices]

    def _query(self, device: _Device, function: str, *args: Any) -> Any:
        """Call one NVML getter on the device; None when NVML refuses it, logged once per kind."""
        try:
            return getattr(self._nvml, function)(device.handle, *args)
        except self._errors as error:
            if isinstance(error, self._lost_errors):
                raise _DeviceLost(str(error)) from error
            if (device.uuid, function) not in self._logged:
                self._logged.add((device.uuid, function))
                log.info("nvml: %s: %s unavailable: %s", device.uuid, function, error)
            return None

    def collect(self, assignments: list[Assignment]) -> Readings:
        """All live devices; every process NVML sees is reported, attribution is the server's job."""
        samples = []
        for device in self._devices:
            if device.lost:
                continue
            try:
                sample = self._sample(device)
            except _DeviceLost as lost:
                self._mark_lost(device, str(lost))
                continue
            if sample is not None:
                samples.append(sample)
        return Readings(accelerators=samples)

    def _sample(self, device: _Device) -> AcceleratorSample | None:
        nvml = self._nvml
        memory = self._query(device, "nvmlDeviceGetMemoryInfo")
        if memory is None:
            return None  # used/total are required on the wire; skip this interval
        used, total = memory_used_total(memory)
        device.memory_peak_bytes = max(device.memory_peak_bytes, used)
        # Required on the wire: a board that cannot report it (MIG) reads as idle.
        utilization = self._query(device, "nvmlDeviceGetUtilizationRates")
        power_mw = self._query(device, "nvmlDeviceGetPowerUsage")
        temperature = self._query(device, "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
        sm_clock_mhz = self._query(device, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
        throttle_mask = self._throttle_mask(device)
        remapped = self._query(device, "nvmlDeviceGetRemappedRows")
        processes = self._query(device, "nvmlDeviceGetComputeRunningProcesses") or []
        with self._lock:
            xid_counts = dict(device.xid_counts)
        return AcceleratorSample(
            uuid=device.uuid,
            utilization_ratio=utilization_ratio(utilization) if utilization is not None else 0.0,
            memory_used_bytes=used,
            memory_total_bytes=total,
            memory_peak_bytes=device.memory_peak_bytes,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            sm_clock_hz=sm_clock_mhz * 1e6 if sm_clock_mhz is not None else None,
            throttle_reasons=decode_throttle_reasons(throttle_mask) if throttle_mask is not None else [],
            ecc_corrected_total=self._ecc_total(device, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_uncorrected_total=self._ecc_total(device, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            retired_pages_total=self._retired_pages(device),
            remapped_rows_total=int(remapped[0]) + int(remapped[1]) if remapped is not None else None,
            remap_failure=bool(remapped[3]) if remapped is not None else None,
            pcie_replay_total=self._query(device, "nvmlDeviceGetPcieReplayCounter"),
            nvlink_errors_total=self._nvlink_errors(device),
            xid_errors_total=xid_counts,
            processes=[process_memory(info) for info in processes[:MAX_PROCESSES]],
        )

    def _throttle_mask(self, device: _Device) -> int | None:
        """ClocksEventReasons is the current name; ClocksThrottleReasons serves older drivers."""
        for function in THROTTLE_GETTERS:
            if hasattr(self._nvml, function):
                mask = self._query(device, function)
                if mask is not None:
                    return int(mask)
        return None

    def _ecc_total(self, device: _Device, error_type: int) -> int | None:
        """Aggregate (lifetime, kept in the infoROM) rather than volatile: it survives driver reloads,
        so a board's error history follows it from one boot to the next."""
        return self._query(device, "nvmlDeviceGetTotalEccErrors", error_type, self._nvml.NVML_AGGREGATE_ECC)

    def _retired_pages(self, device: _Device) -> int | None:
        """Pages retired for either cause (pre-Ampere boards; newer ones remap rows instead)."""
        causes = (self._nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                  self._nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pages = [self._query(device, "nvmlDeviceGetRetiredPages", cause) for cause in causes]
        return None if any(p is None for p in pages) else sum(len(p) for p in pages)

    def _nvlink_errors(self, device: _Device) -> int | None:
        """All error counters summed over active links; None when no active link reports any."""
        nvml = self._nvml
        total: int | None = None
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            if self._query(device, "nvmlDeviceGetNvLinkState", link) != nvml.NVML_FEATURE_ENABLED:
                continue
            for counter in range(nvml.NVML_NVLINK_ERROR_COUNT):
                value = self._query(device, "nvmlDeviceGetNvLinkErrorCounter", link, counter)
                if value is not None:
                    total = (total or 0) + int(value)
        return total

    def _mark_lost(self, device: _Device, reason: str) -> None:
        """A lost GPU needs a reset and a new NVML session, so it is reported offline once and dropped."""
        device.lost = True
        log.warning("nvml: %s is gone: %s", device.uuid, reason)
        self._send(HardwareEvent(kind="offline", accelerator_uuid=device.uuid, observed_at=self._clock(),
                                 message=f"NVML lost the device: {reason}"))

    def _send(self, event: HardwareEvent) -> None:
        """A failing sink must not stop the watcher; without one (start not called) the event is logged."""
        if self._emit is None:
            log.warning("nvml: event with no sink: %s", event.model_dump_json())
            return
        try:
            self._emit(event)
        except Exception:
            log.exception("nvml: emitting %s failed", event.kind)

    def start(self, emit_event: EmitEvent) -> None:
        """Register every device for XID/ECC events and watch them in a daemon thread."""
        self._emit = emit_event
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.warning("nvml: no fault events on this node: nvmlEventSetCreate: %s", error)
            return
        registered = [device.uuid for device in self._devices if self._register(device)]
        if not registered:
            log.warning("nvml: no device accepts fault events; XIDs will not be pushed")
        self._thread = threading.Thread(target=self._watch_events, name="nvml-events", daemon=True)
        self._thread.start()

    def _register(self, device: _Device) -> bool:
        """Ask only for the event types the board supports; old drivers may not say, so try XID alone."""
        nvml = self._nvml
        try:
            supported = self._query(device, "nvmlDeviceGetSupportedEventTypes")
            wanted = WATCHED_EVENTS & int(supported) if supported is not None else EVENT_XID
            if not wanted:
                return False
            nvml.nvmlDeviceRegisterEvents(device.handle, wanted, self._event_set)
        except (nvml.NVMLError, _DeviceLost) as error:
            log.warning("nvml: %s: cannot watch fault events: %s", device.uuid, error)
            return False
        return True

    def _watch_events(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, EVENT_WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as error:
                log.warning("nvml: waiting for events failed: %s", error)
                self._stop.wait(EVENT_WAIT_MS / 1000.0)
                continue
            self._handle_event(data)

    def _handle_event(self, data: Any) -> None:
        device = self._by_handle.get(_handle_key(data.device)) if data.device else None
        event = event_from_nvml(int(data.eventType), int(data.eventData), device.uuid if device else None,
                                self._clock())
        if event is None:
            return
        if event.kind == "xid" and device is not None:
            with self._lock:
                key = str(int(data.eventData))
                device.xid_counts[key] = device.xid_counts.get(key, 0) + 1
        self._send(event)

    def close(self) -> None:
        """Stop the watcher (within one wait period), then free the event set and shut NVML down."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * EVENT_WAIT_MS / 1000.0 + 1.0)
        if self._event_set is not None and not (self._thread and self._thread.is_alive()):
            self._quietly(self._nvml.nvmlEventSetFree, self._event_set)
        self._quietly(self._nvml.nvmlShutdown)

    def _quietly(self, call: Callable[..., Any], *args: Any) -> None:
        """Teardown goes on past errors: the process is leaving NVML either way."""
        try:
            call(*args)
        except self._nvml.NVMLError as error:
            log.debug("nvml: during close: %s", error)


register("nvml", lambda _argument, _node: NvmlCollector())
