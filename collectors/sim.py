"""`sim:N` — N simulated accelerators that stand in for NVML where there is no GPU.

Readings follow real load: the CPU share and resident memory of the task processes the server
placed on an accelerator drive its utilization, memory, power and temperature. Faults injected
with `sentinel inject` are reported the way NVML would (an XID event, ECC counters, thermal
throttling, the device going missing); a `slow` accelerator really slows the tasks on it (a SIGSTOP/SIGCONT duty
cycle to 1/factor), so the job's own timings show it. Everything it reports says `sim` in its uuid and model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from collectors.base import Collector, EmitEvent, Readings, register
from collectors.procfs import read_small
from sentinel.sdk.flops import measure_cpu_peak_flops
from sentinel.telemetry.schemas import AcceleratorInfo, AcceleratorSample, Assignment, HardwareEvent, ProcessMemory

log = logging.getLogger("sentinel.agent.sim")

SIM_MODEL = "sim-h100-80gb"
SIM_MEMORY_BYTES = 80 * 2**30
IDLE_WATTS, MAX_WATTS = 70.0, 700.0
BASE_MEMORY_BYTES = 512 * 2**20
FAULTS = ("xid", "ecc", "thermal", "hang", "slow", "offline", "clear")


@dataclass
class SimFaults:
    xid_counts: dict[str, int] = field(default_factory=dict)
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    thermal: bool = False
    hang: bool = False
    slow_factor: float = 1.0
    offline: bool = False


def cpu_core_peak_flops() -> float:
    """A simulated accelerator stands for one CPU core: the whole CPU's measured GEMM peak ÷ cores."""
    return measure_cpu_peak_flops() / max(1, os.cpu_count() or 1)


def descendants(pid: int, proc_root: str = "/proc") -> list[int]:
    """`pid` and all its descendants, read from /proc/<pid>/task/*/children.

    psutil's children() scans every process on the machine; this reads only the task's own tree,
    which keeps a cycle's cost flat however many processes the node runs.
    """
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"{proc_root}/{current}/task")
        except OSError:
            if current == pid and not os.path.exists(f"{proc_root}/{pid}"):
                raise psutil.NoSuchProcess(pid) from None
            continue
        for tid in tasks:
            try:
                queue.extend(int(child) for child in read_small(f"{proc_root}/{current}/task/{tid}/children").split())
            except (OSError, ValueError):
                continue
    return found



class ProcessLoad:
    """CPU share (0-1 per core) and RSS of a process and its children; (0, 0) once it is gone.

    One read of /proc/<pid>/stat per process gives both (utime + stime, and rss in pages): what psutil's
    cpu_percent() and memory_info() give, for a third of the reads and without psutil's per-call machinery.
    CPU is measured between two readings of the same pid (the first reading gives 0), like cpu_percent(None).
    """

    def __init__(self, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self._root = proc_root
        self._clock = clock
        self._last: dict[int, tuple[float, int]] = {}  # pid → (when, CPU clock ticks) at its last reading
        self._threads: dict[int, list[str]] = {}  # pid → its thread ids as last listed
        self._tick = 1.0 / os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _read(self, pid: int) -> tuple[int, int, int] | None:
        """(utime + stime in clock ticks, rss in bytes, threads), or None when it is gone."""
        try:
            stat = read_small(f"{self._root}/{pid}/stat")
            fields = stat[stat.rfind(b")") + 2:].split()
            return int(fields[11]) + int(fields[12]), int(fields[21]) * self._page, int(fields[17])
        except (OSError, ValueError, IndexError):
            return None

    def _children(self, pid: int, threads: int) -> list[int]:
        """`pid`'s children, from each of its threads' children file. The thread ids are listed again only when
        the process's thread count changed or a listed thread is gone (a thread that ended and one that started
        leave the count as it was, but the ended one's file is missing): a directory listing per process per
        interval was a third of the source's CPU."""
        tids = self._threads.get(pid)
        if tids is None or len(tids) != threads:
            tids = self._list_threads(pid)
        children, stale = self._read_children(pid, tids)
        if stale:
            tids = self._list_threads(pid)
            children, _ = self._read_children(pid, tids)
        if len(self._threads) >= 4096 and pid not in self._threads:  # pids long gone: forget them all
            self._threads.clear()
        self._threads[pid] = tids
        return children

    def _list_threads(self, pid: int) -> list[str]:
        try:
            return os.listdir(f"{self._root}/{pid}/task")
        except OSError:
            return []

    def _read_children(self, pid: int, tids: list[str]) -> tuple[list[int], bool]:
        children: list[int] = []
        stale = False
        for tid in tids:
            try:
                children.extend(int(child) for child in read_small(f"{self._root}/{pid}/task/{tid}/children").split())
            except FileNotFoundError:
                stale = True
            except (OSError, ValueError):
                continue
        return children, stale

    def __call__(self, pid: int) -> tuple[float, int]:
        """The process and its descendants, found as descendants() finds them, in the same order."""
        cpu, rss = 0.0, 0
        queue = [pid]
        while queue:
            p = queue.pop()
            now, reading = self._clock(), self._read(p)
            if reading is None:
                self._last.pop(p, None)
                self._threads.pop(p, None)
                if p == pid:
                    return 0.0, 0
                continue
            ticks, resident, threads = reading
            before = self._last.get(p)
            if before is None and len(self._last) >= 4096:  # pids long gone, never read as gone: forget them all
                self._last.clear()
            self._last[p] = (now, ticks)
            if before is not None and now > before[0]:
                cpu += max(0, ticks - before[1]) * self._tick / (now - before[0])
            rss += resident
            queue.extend(self._children(p, threads))
        return cpu, rss


class SimCollector(Collector):
    name = "sim"

    def __init__(self, count: int, node: str, *, clock: Callable[[], float] = time.time,
                 process_load: Callable[[int], tuple[float, int]] | None = None, peak_flops: float | None = None):
        if count < 1 or count > 64:
            raise ValueError("sim:N needs 1 ≤ N ≤ 64")
        self._node = node
        self._clock = clock
        self._process_load = process_load or ProcessLoad()
        self._faults = [SimFaults() for _ in range(count)]
        self._peaks = [0] * count
        self._emit: EmitEvent | None = None
        self._lock = threading.Lock()
        self._placed: dict[str, list[int]] = {}  # uuid → pids of the tasks placed on it, from the last collect
        self._samples: dict[str, tuple[tuple[object, ...], AcceleratorSample]] = {}  # uuid → (its inputs, sample)
        self._stopped: dict[int, list[int]] = {}  # accelerator index → pids a hang drill stopped
        self._throttles: dict[int, threading.Event] = {}  # accelerator index → its duty cycle's stop flag
        peak = peak_flops if peak_flops is not None else cpu_core_peak_flops()
        self._infos = [AcceleratorInfo(uuid=f"SIM-{node}-{i}", index=i, model=SIM_MODEL,
                                       memory_total_bytes=SIM_MEMORY_BYTES, source="sim", simulated=True,
                                       peak_flops=peak)
                       for i in range(count)]
        log.warning("sim source: %d SIMULATED accelerators on node %s (no NVML; readings follow task load; "
                    "peak %.3g FLOP/s each = one CPU core's measured GEMM)", count, node, peak)

    def start(self, emit_event: EmitEvent) -> None:
        self._emit = emit_event

    def accelerators(self) -> list[AcceleratorInfo]:
        return list(self._infos)

    def uuid(self, index: int) -> str:
        return self._infos[index].uuid

    def collect(self, assignments: list[Assignment]) -> Readings:
        load: dict[str, list[int]] = {}
        for task in assignments:
            for uuid in task.accelerators:
                if task.pid:
                    load.setdefault(uuid, []).append(task.pid)
        self._placed = load
        samples = []
        with self._lock:
            for index, faults in enumerate(self._faults):
                if faults.hang:  # a hung accelerator hangs whatever is placed on it later, too
                    stopped = self._stopped.setdefault(index, [])
                    fresh = [p for p in load.get(self._infos[index].uuid, []) if p not in stopped]
                    if fresh:
                        stopped.extend(self._signal_tasks(self._infos[index].uuid, signal.SIGSTOP, fresh))
            for info, faults in zip(self._infos, self._faults, strict=True):
                if faults.offline:
                    continue
                samples.append(self._sample(info, faults, load.get(info.uuid, [])))
        return Readings(accelerators=samples)

    def _sample(self, info: AcceleratorInfo, faults: SimFaults, pids: list[int]) -> AcceleratorSample:
        cpu, procs = 0.0, []
        for pid in pids:
            share, rss = self._process_load(pid)
            cpu += share
            procs.append(ProcessMemory(pid=pid, used_bytes=rss))
        utilization = 1.0 if faults.hang else min(1.0, cpu)
        used = min(info.memory_total_bytes, BASE_MEMORY_BYTES + sum(p.used_bytes for p in procs))
        self._peaks[info.index] = max(self._peaks[info.index], used)
        key = (utilization, used, self._peaks[info.index], faults.thermal, faults.slow_factor, faults.ecc_corrected,
               faults.ecc_uncorrected, tuple(faults.xid_counts.items()), tuple((p.pid, p.used_bytes) for p in procs))
        last = self._samples.get(info.uuid)
        if last is not None and last[0] == key:  # an idle accelerator reads the same every interval: the same sample
            return last[1]
        temperature = 95.0 if faults.thermal else 32.0 + 45.0 * utilization
        throttle = ["hw_thermal_slowdown"] if faults.thermal else []
        clock_hz = 1.98e9 / faults.slow_factor
        sample = AcceleratorSample(
            uuid=info.uuid, utilization_ratio=utilization, memory_used_bytes=used,
            memory_total_bytes=info.memory_total_bytes, memory_peak_bytes=self._peaks[info.index],
            power_watts=IDLE_WATTS + (MAX_WATTS - IDLE_WATTS) * utilization, temperature_celsius=temperature,
            sm_clock_hz=clock_hz, throttle_reasons=throttle, ecc_corrected_total=faults.ecc_corrected,
            ecc_uncorrected_total=faults.ecc_uncorrected, retired_pages_total=0, remapped_rows_total=0,
            remap_failure=False, pcie_replay_total=0, nvlink_errors_total=0,
            xid_errors_total=dict(faults.xid_counts), processes=procs)
        self._samples[info.uuid] = (key, sample)
        return sample

    def inject(self, index: int, fault: str, argument: float | None = None) -> None:
        """Make accelerator `index` report `fault` as NVML would; `clear` removes every fault."""
        if not 0 <= index < len(self._faults):
            raise ValueError(f"sim has accelerators 0..{len(self._faults) - 1}, not {index}")
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        uuid = self._infos[index].uuid
        event: HardwareEvent | None = None
        now = self._clock()
        with self._lock:
            faults = self._faults[index]
            if fault == "xid":
                code = int(argument if argument is not None else 79)
                faults.xid_counts[str(code)] = faults.xid_counts.get(str(code), 0) + 1
                event = HardwareEvent(kind="xid", accelerator_uuid=uuid, xid=code, message=f"XID {code} (simulated)",
                                      observed_at=now)
            elif fault == "ecc":
                faults.ecc_uncorrected += 1
                event = HardwareEvent(kind="ecc", accelerator_uuid=uuid, message="uncorrectable ECC error (simulated)",
                                      observed_at=now)
            elif fault == "thermal":
                faults.thermal = True
                event = HardwareEvent(kind="thermal", accelerator_uuid=uuid,
                                      message="thermal slowdown at 95 C (simulated)", observed_at=now)
            elif fault == "hang":
                faults.hang = True
                self._stopped[index] = self._signal_tasks(uuid, signal.SIGSTOP)
            elif fault == "slow":
                faults.slow_factor = max(1.0, float(argument or 2.0))
                self._throttle(index, faults.slow_factor)
            elif fault == "offline":
                faults.offline = True
                event = HardwareEvent(kind="offline", accelerator_uuid=uuid,
                                      message="accelerator fell off the bus (simulated)", observed_at=now)
            else:
                self._faults[index] = SimFaults()
                if (flag := self._throttles.pop(index, None)) is not None:
                    flag.set()
                for pid in self._stopped.pop(index, []):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)
                event = HardwareEvent(kind="clear", accelerator_uuid=uuid, message="simulated faults cleared",
                                      observed_at=now)
        log.warning("sim fault injected: node=%s accelerator=%d uuid=%s fault=%s argument=%s", self._node, index,
                    uuid, fault, argument)
        if event is not None and self._emit is not None:
            self._emit(event)

    def probe(self, index: int) -> HardwareEvent:
        """A suspect accelerator's microbenchmark, simulated: the share of its expected GEMM rate it reaches
        now — 0 when hung or gone, 1/factor when slowed, lower when thermally throttled. On real hardware
        this is a short GEMM on the device (not implemented for nvml yet: it answers without a value)."""
        if not 0 <= index < len(self._faults):
            raise ValueError(f"sim has accelerators 0..{len(self._faults) - 1}, not {index}")
        with self._lock:
            faults = self._faults[index]
            ratio = 0.0 if faults.hang or faults.offline else (1.0 / faults.slow_factor) * (0.7 if faults.thermal
                                                                                              else 1.0)
        uuid = self._infos[index].uuid
        log.info("sim probe: node=%s accelerator=%d uuid=%s achieved=%.0f%% of expected (simulated)", self._node,
                 index, uuid, 100 * ratio)
        return HardwareEvent(kind="probe", accelerator_uuid=uuid, value=ratio, observed_at=self._clock(),
                             message=f"GEMM probe: {ratio:.0%} of the expected rate (simulated)")

    def _signal_tasks(self, uuid: str, sig: int, pids: list[int] | None = None) -> list[int]:
        """A hung accelerator hangs its tasks: they stay alive but stop making progress (SIGSTOP), as a
        process blocked in a kernel that never returns would. `clear` lets them go on (SIGCONT)."""
        done = []
        targets = self._placed.get(uuid, []) if pids is None else pids
        if targets:
            log.info("sim %s: the tasks on %s: pids=%s", signal.Signals(sig).name, uuid, targets)
        for pid in targets:
            try:
                os.kill(pid, sig)
                done.append(pid)
            except OSError as exc:
                log.warning("sim hang: cannot signal task: pid=%d error=%s", pid, exc)
        return done

    def _throttle(self, index: int, factor: float, period: float = 0.1) -> None:
        """A slowed accelerator really slows what runs on it: its tasks get 1/factor of every `period`
        (SIGSTOP for the rest, SIGCONT after), as a device at a lower clock would give them."""
        if (old := self._throttles.pop(index, None)) is not None:
            old.set()
        if factor <= 1.0:
            return
        flag = self._throttles[index] = threading.Event()
        uuid = self._infos[index].uuid

        def cycle() -> None:
            stopped: list[int] = []
            while not flag.is_set():
                with self._lock:
                    hung = self._faults[index].hang
                pids = [] if hung else list(self._placed.get(uuid, []))
                stopped = [p for p in pids if _signal(p, signal.SIGSTOP)]
                flag.wait(period * (1 - 1 / factor))
                for pid in stopped:
                    _signal(pid, signal.SIGCONT)
                flag.wait(period / factor)
            for pid in stopped:
                _signal(pid, signal.SIGCONT)

        threading.Thread(target=cycle, name=f"sim-slow-{index}", daemon=True).start()

    def faults(self, index: int) -> SimFaults:
        with self._lock:
            return self._faults[index]


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _factory(argument: str | None, node: str) -> SimCollector:
    try:
        count = int(argument or "4")
    except ValueError as exc:
        raise ValueError(f"sim:N needs a number, got {argument!r}") from exc
    return SimCollector(count, node)


register("sim", _factory)
