"""`host` — the node itself from /proc: CPU, load, memory, disk, network, and the tasks' memory.

Read directly, one read(2) per file (collectors/procfs.py), with psutil's own definitions: psutil parsed
every line of /proc/meminfo, every field of /proc/stat and /proc/net/dev and its per-process files through
its general-purpose layers, more than half of a whole agent cycle's CPU. What each reading means:

* cpu_ratio: busy ÷ total CPU time since the last reading, from /proc/stat's `cpu` line, rounded to 0.1 %
  as psutil.cpu_percent(None) did (busy excludes idle and iowait; total excludes guest time, which the
  kernel counts inside user time already);
* memory used: MemTotal - MemAvailable;
* disk: statvfs of `disk_path`, used = (blocks - free blocks) × fragment size;
* network: bytes received and sent over every interface in /proc/net/dev (this network namespace's),
  kept monotonic across an interface's counter wrapping or resetting, as psutil's nowrap did;
* task memory: resident pages (/proc/<pid>/statm) × page size.
"""

from __future__ import annotations

import os

from collectors.base import Collector, Readings, register
from collectors.procfs import read_small
from sentinel.telemetry.schemas import Assignment, HostMetrics, ProcessMemory


class HostCollector(Collector):
    name = "host"

    def __init__(self, *, disk_path: str = "/", proc_root: str = "/proc"):
        self._disk_path = disk_path
        self._proc = proc_root
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._cpu_last = self._cpu_times()  # the first reading only primes the counter
        self._net_last: dict[bytes, tuple[int, int]] = {}
        self._net_offsets: dict[bytes, tuple[int, int]] = {}

    def collect(self, assignments: list[Assignment]) -> Readings:
        total, available = self._memory()
        try:
            disk = os.statvfs(self._disk_path)
            disk_total = disk.f_blocks * disk.f_frsize
            disk_used = disk_total - disk.f_bfree * disk.f_frsize
        except OSError:
            disk_used = disk_total = 0
        rx, tx = self._network()
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        tasks = []
        for task in assignments:
            if task.pid is None:
                continue
            rss = self._resident_bytes(task.pid)
            if rss is not None:
                tasks.append(ProcessMemory(pid=task.pid, used_bytes=rss))
        return Readings(host=HostMetrics(
            cpu_ratio=min(1.0, max(0.0, self._cpu_ratio())), load1=load1,
            memory_used_bytes=total - available, memory_total_bytes=total,
            disk_used_bytes=disk_used, disk_total_bytes=disk_total, net_rx_bytes_total=rx, net_tx_bytes_total=tx,
            task_memory=tasks))

    def _cpu_times(self) -> list[int]:
        """The `cpu` line of /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice
        clock ticks of all CPUs since boot (older kernels give fewer: the rest read 0)."""
        line = read_small(f"{self._proc}/stat").split(b"\n", 1)[0]
        ticks = [int(v) for v in line.split()[1:11]]
        return ticks + [0] * (10 - len(ticks))

    def _cpu_ratio(self) -> float:
        """As psutil.cpu_percent(None): each field's change (never below 0; iowait can go back), busy ÷ total."""
        now = self._cpu_times()
        delta = [max(0, b - a) for a, b in zip(self._cpu_last, now, strict=True)]
        self._cpu_last = now
        total = sum(delta[:8])  # guest and guest_nice are inside user and nice already
        busy = total - delta[3] - delta[4]
        return round(busy / total * 100, 1) / 100 if total > 0 else 0.0

    def _memory(self) -> tuple[int, int]:
        """(MemTotal, MemAvailable) in bytes."""
        fields = {}
        for line in read_small(f"{self._proc}/meminfo").split(b"\n", 8)[:8]:
            name, _, value = line.partition(b":")
            fields[name] = int(value.split()[0]) * 1024 if value.strip() else 0
        total = fields.get(b"MemTotal", 0)
        available = fields.get(b"MemAvailable", fields.get(b"MemFree", 0))  # MemAvailable: Linux 3.14 and later
        return total, min(available, total)

    def _network(self) -> tuple[int, int]:
        """Bytes received and sent over every interface, each interface's counters kept from going down."""
        now: dict[bytes, tuple[int, int]] = {}
        try:
            text = read_small(f"{self._proc}/net/dev")
        except OSError:
            return 0, 0
        for line in text.split(b"\n")[2:]:
            name, colon, counters = line.rpartition(b":")
            fields = counters.split()
            if colon and len(fields) >= 9:
                now[name.strip()] = (int(fields[0]), int(fields[8]))
        rx_total = tx_total = 0
        offsets = {}
        for name, (rx, tx) in now.items():
            last = self._net_last.get(name)
            off_rx, off_tx = self._net_offsets.get(name, (0, 0))
            if last is not None:  # went down: wrapped or reset, what it had counted stays counted
                off_rx += last[0] if rx < last[0] else 0
                off_tx += last[1] if tx < last[1] else 0
            offsets[name] = (off_rx, off_tx)
            rx_total += rx + off_rx
            tx_total += tx + off_tx
        self._net_last, self._net_offsets = now, offsets
        return rx_total, tx_total

    def _resident_bytes(self, pid: int) -> int | None:
        try:
            return int(read_small(f"{self._proc}/{pid}/statm").split()[1]) * self._page_bytes
        except (OSError, ValueError, IndexError):
            return None


register("host", lambda _argument, _node: HostCollector())
