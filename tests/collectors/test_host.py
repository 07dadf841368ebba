from __future__ import annotations

import os

from collectors.host import HostCollector
from sentinel.telemetry.schemas import Assignment


def test_host_readings_are_real_and_include_task_memory():
    readings = HostCollector().collect([Assignment(job_id=1, rank=0, pid=os.getpid(), accelerators=[]),
                                        Assignment(job_id=1, rank=1, pid=2**31 - 1, accelerators=[])])
    host = readings.host
    assert host is not None
    assert 0.0 <= host.cpu_ratio <= 1.0
    assert 0 < host.memory_used_bytes < host.memory_total_bytes
    assert host.disk_total_bytes > 0
    # the live process is measured, the vanished one skipped
    assert [t.pid for t in host.task_memory] == [os.getpid()]
    assert host.task_memory[0].used_bytes > 10 * 2**20
