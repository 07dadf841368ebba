"""`host` — the node itself through psutil: CPU, memory, disk, network, and the tasks' memory."""

from __future__ import annotations

import os
from typing import Any

import psutil

from collectors.base import Collector, Readings, register
from sentinel.telemetry.schemas import Assignment, HostMetrics, ProcessMemory


class HostCollector(Collector):
    name = "host"

    def __init__(self, *, disk_path: str = "/", psutil_module: Any = psutil):
        self._disk_path = disk_path
        self._ps = psutil_module
        self._ps.cpu_percent(None)  # the first call only primes the counter
        self._tasks: dict[int, Any] = {}  # pid → its psutil Process, kept while the task is assigned

    def collect(self, assignments: list[Assignment]) -> Readings:
        ps = self._ps
        memory = ps.virtual_memory()
        try:
            disk = ps.disk_usage(self._disk_path)
            disk_used, disk_total = int(disk.used), int(disk.total)
        except OSError:
            disk_used = disk_total = 0
        net = ps.net_io_counters()
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        tasks = []
        known, self._tasks = self._tasks, {}
        for task in assignments:
            if task.pid is None:
                continue
            try:
                proc = known.get(task.pid) or ps.Process(task.pid)
                tasks.append(ProcessMemory(pid=task.pid, used_bytes=int(proc.memory_info().rss)))
                self._tasks[task.pid] = proc
            except (ps.Error, OSError):
                continue
        return Readings(host=HostMetrics(
            cpu_ratio=min(1.0, max(0.0, ps.cpu_percent(None) / 100.0)), load1=load1,
            memory_used_bytes=int(memory.total - memory.available), memory_total_bytes=int(memory.total),
            disk_used_bytes=disk_used, disk_total_bytes=disk_total,
            net_rx_bytes_total=int(net.bytes_recv) if net else 0, net_tx_bytes_total=int(net.bytes_sent) if net else 0,
            task_memory=tasks))


register("host", lambda _argument, _node: HostCollector())
