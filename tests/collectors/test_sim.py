from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.base import create
from collectors.sim import SIM_MEMORY_BYTES, SimCollector
from sentinel.telemetry.schemas import Assignment, HardwareEvent
from tests.live import wait_for


def test_everything_it_reports_says_it_is_simulated():
    sim = create("sim:3", "n1")
    infos = sim.accelerators()
    assert [i.uuid for i in infos] == ["SIM-n1-0", "SIM-n1-1", "SIM-n1-2"]
    assert all(i.simulated and i.source == "sim" and i.model.startswith("sim-") for i in infos)


def test_readings_follow_the_load_of_the_tasks_placed_on_it():
    busy = subprocess.Popen([sys.executable, "-c", "x = bytearray(300 * 2**20)\nwhile True: pass"])
    try:
        sim = SimCollector(2, "n1")
        assignment = Assignment(job_id=1, rank=0, pid=busy.pid, accelerators=["SIM-n1-1"])
        sim.collect([assignment])  # primes the CPU counters
        for _ in range(5):  # a spinning process gets most of a core, unless the machine is busy: try a few windows
            time.sleep(1.0)
            idle, loaded = sim.collect([assignment]).accelerators
            if loaded.utilization_ratio > 0.5:
                break
    finally:
        busy.kill()
        busy.wait()
    assert idle.utilization_ratio == 0.0 and idle.processes == []
    assert loaded.utilization_ratio > 0.5
    assert loaded.memory_used_bytes > idle.memory_used_bytes + 250 * 2**20
    assert loaded.power_watts > idle.power_watts  # type: ignore[operator]
    assert loaded.processes[0].pid == busy.pid
    assert loaded.memory_total_bytes == SIM_MEMORY_BYTES


def test_faults_are_reported_the_way_nvml_would():
    events: list[HardwareEvent] = []
    sim = SimCollector(2, "n1", clock=lambda: 123.0)
    sim.start(events.append)
    sim.inject(0, "xid", 79)
    sim.inject(1, "ecc")
    sim.inject(1, "thermal")
    first, second = sim.collect([]).accelerators
    assert [(e.kind, e.accelerator_uuid, e.xid) for e in events] == [
        ("xid", "SIM-n1-0", 79), ("ecc", "SIM-n1-1", None), ("thermal", "SIM-n1-1", None)]
    assert first.xid_errors_total == {"79": 1}
    assert second.ecc_uncorrected_total == 1
    assert second.temperature_celsius == 95.0 and second.throttle_reasons == ["hw_thermal_slowdown"]


def test_offline_hang_slow_and_clear():
    events: list[HardwareEvent] = []
    sim = SimCollector(2, "n1")
    sim.start(events.append)
    sim.inject(0, "offline")
    assert [s.uuid for s in sim.collect([]).accelerators] == ["SIM-n1-1"]
    assert events[-1].kind == "offline"
    sim.inject(1, "hang")
    sim.inject(1, "slow", 4)
    hung = sim.collect([]).accelerators[0]
    assert hung.utilization_ratio == 1.0 and hung.sm_clock_hz == pytest.approx(1.98e9 / 4)
    sim.inject(0, "clear")
    assert len(sim.collect([]).accelerators) == 2


@pytest.mark.parametrize("index, fault", [(5, "xid"), (0, "melt")])
def test_bad_injections_are_refused(index, fault):
    with pytest.raises(ValueError):
        SimCollector(2, "n1").inject(index, fault)


def test_unknown_source_names_the_known_ones():
    with pytest.raises(ValueError, match=r"known: .*host.*sim"):
        create("tpu:4", "n1")


def test_a_task_s_children_count_toward_its_load():
    from collectors.sim import descendants

    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "c = subprocess.Popen([sys.executable, '-c', 'x = bytearray(200 * 2**20); "
                               "import time; time.sleep(60)'])\n"
                               "time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(parent.pid)
        assert tree[0] == parent.pid and len(tree) == 2
        sim = SimCollector(1, "n1", peak_flops=1e9)
        wait_for(lambda: sim._process_load(parent.pid)[1] > 200 * 2**20, timeout=10, what="the child's 200 MiB")
    finally:
        for pid in reversed(descendants(parent.pid)):
            os.kill(pid, 9)
        parent.wait()
    with pytest.raises(Exception):  # noqa: B017 - psutil.NoSuchProcess once the tree is gone
        descendants(parent.pid)


def test_a_probe_reports_the_share_of_its_rate_the_fault_leaves():
    sim = SimCollector(3, "n1")
    sim.inject(1, "slow", 2.0)
    sim.inject(2, "hang")
    values = [sim.probe(i).value for i in range(3)]
    assert values == [1.0, 0.5, 0.0]
    event = sim.probe(1)
    assert event.kind == "probe" and event.accelerator_uuid == sim.uuid(1) and "simulated" in event.message
    with pytest.raises(ValueError):
        sim.probe(3)


def test_a_hang_freezes_the_tasks_on_it_and_clear_lets_them_go():
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        sim = SimCollector(1, "n1")
        sim.collect([Assignment(job_id=1, rank=0, pid=child.pid, accelerators=[sim.uuid(0)])])
        sim.inject(0, "hang")

        def state() -> str:
            return Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0]

        deadline = time.monotonic() + 5
        while state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state() == "T", "stopped, as a process blocked on a hung accelerator"
        sim.inject(0, "clear")
        deadline = time.monotonic() + 5
        while state() == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state() != "T"
    finally:
        child.kill()
        child.wait()


def test_a_child_forked_by_a_thread_that_replaced_another_is_found(tmp_path):
    """The thread count stays the same (one thread ended, one started and forked a child): the child counts."""
    from collectors.sim import ProcessLoad

    go = tmp_path / "go"
    task = subprocess.Popen([sys.executable, "-c",
                             "import os, subprocess, sys, threading, time\n"
                             "t = threading.Thread(target=time.sleep, args=(0.5,)); t.start()\n"
                             f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
                             "t.join()\n"
                             "def fork():\n"
                             "    subprocess.Popen([sys.executable, '-c', 'x = bytearray(200 * 2**20); "
                             "import time; time.sleep(60)'])\n"
                             "    time.sleep(60)\n"
                             "threading.Thread(target=fork, daemon=True).start()\n"
                             "time.sleep(60)\n"])
    try:
        load = ProcessLoad()
        wait_for(lambda: len(os.listdir(f"/proc/{task.pid}/task")) == 2, timeout=10, what="the first thread")
        alone = load(task.pid)[1]
        go.touch()

        def child_grown() -> bool:  # read here, not through `load`, which must see the change in one step
            children = [int(c) for t in os.listdir(f"/proc/{task.pid}/task")
                        for c in Path(f"/proc/{task.pid}/task/{t}/children").read_text().split()]
            pages = int(Path(f"/proc/{children[0]}/statm").read_text().split()[1]) if children else 0
            return pages * os.sysconf("SC_PAGE_SIZE") > 199 * 2**20

        wait_for(child_grown, timeout=15, what="the new thread's child")
        assert len(os.listdir(f"/proc/{task.pid}/task")) == 2
        assert load(task.pid)[1] > alone + 199 * 2**20
    finally:
        children = [int(c) for t in os.listdir(f"/proc/{task.pid}/task")
                    for c in Path(f"/proc/{task.pid}/task/{t}/children").read_text().split()]
        for pid in [*children, task.pid]:
            os.kill(pid, 9)
        task.wait()
    assert load(task.pid) == (0.0, 0)


def test_an_idle_accelerator_gives_the_same_sample_until_something_changes():
    sim = SimCollector(2, "n1", peak_flops=1e9)
    first = sim.collect([]).accelerators
    again = sim.collect([]).accelerators
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]
    sim.inject(1, "ecc")
    sim.inject(0, "thermal")
    after = sim.collect([]).accelerators
    assert after[1].ecc_uncorrected_total == 1 and after[0].temperature_celsius == 95.0
    assert after[0].throttle_reasons == ["hw_thermal_slowdown"] and after[1].temperature_celsius == 32.0
    sim.inject(0, "clear")
    assert sim.collect([]).accelerators[0] == first[0]
