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


def write_proc(root, *, cpu: list[int], meminfo: dict[str, int], net: dict[str, tuple[int, int]],
               statm: dict[int, str]) -> None:
    """A /proc tree with the files the host source reads, in the kernel's formats."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n")
    (root / "meminfo").write_text("".join(f"{name + ':':<16}{kib:>8} kB\n" for name, kib in meminfo.items()))
    (root / "net").mkdir(exist_ok=True)
    head = ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
            "carrier compressed\n")
    (root / "net" / "dev").write_text(head + "".join(f"{name:>6}: {rx} 10 0 0 0 0 0 0 {tx} 20 0 0 0 0 0 0\n"
                                                     for name, (rx, tx) in net.items()))
    for pid, text in statm.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "statm").write_text(text)


def test_host_readings_follow_the_kernel_files_as_psutil_read_them(tmp_path):
    proc = tmp_path / "proc"
    page = os.sysconf("SC_PAGE_SIZE")
    meminfo = {"MemTotal": 1000, "MemFree": 100, "MemAvailable": 400, "Buffers": 1, "Cached": 2}
    write_proc(proc, cpu=[100, 0, 100, 800, 10, 0, 0, 0, 50, 0], meminfo=meminfo,
               net={"lo": (1000, 1000), "eth0": (5000, 7000)}, statm={42: "900 300 20 1 0 50 0\n"})
    host = HostCollector(proc_root=str(proc), disk_path=str(tmp_path))
    # user +30 (of which guest +10: already inside user), system +10, idle +50, iowait went back by 5: not below 0
    write_proc(proc, cpu=[130, 0, 110, 850, 5, 0, 0, 0, 60, 0], meminfo=meminfo,
               net={"lo": (1500, 1600), "eth0": (6000, 7100)}, statm={42: "900 300 20 1 0 50 0\n"})
    readings = host.collect([Assignment(job_id=1, rank=0, pid=42, accelerators=[]),
                             Assignment(job_id=1, rank=1, pid=43, accelerators=[]),
                             Assignment(job_id=1, rank=2, pid=None, accelerators=[])])
    h = readings.host
    assert h is not None
    assert h.cpu_ratio == 0.444  # 40 busy of 90 ticks, rounded to 0.1 % as cpu_percent did
    assert (h.memory_total_bytes, h.memory_used_bytes) == (1000 * 1024, 600 * 1024)
    assert (h.net_rx_bytes_total, h.net_tx_bytes_total) == (7500, 8700)
    assert [(t.pid, t.used_bytes) for t in h.task_memory] == [(42, 300 * page)]  # 43 is gone: skipped
    assert h.disk_total_bytes > 0

    # eth0's counters reset (a driver reload): what it had counted stays counted; a new interface adds its own;
    # no CPU time passed: 0
    write_proc(proc, cpu=[130, 0, 110, 850, 5, 0, 0, 0, 60, 0], meminfo={"MemTotal": 1000, "MemFree": 250},
               net={"lo": (1600, 1700), "eth0": (10, 20), "ib0": (3, 4)}, statm={})
    h = host.collect([]).host
    assert h is not None
    assert (h.net_rx_bytes_total, h.net_tx_bytes_total) == (1600 + 6000 + 10 + 3, 1700 + 7100 + 20 + 4)
    assert h.memory_used_bytes == 750 * 1024  # no MemAvailable (before Linux 3.14): MemFree
    assert h.cpu_ratio == 0.0
