"""The step-time decomposition on the node, with real processes: the SDK's data()/phase()/pause() timings, the
agent's iterations and CPU wait, the agent's experiments (disk, exchange with a peer listener, CPU contention
naming the competitor, failures), and a slowed sim accelerator that really slows its task."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.experiments import ExchangeListener, ExperimentError, cpu_contention, disk_write, exchange, result_of
from collectors.jobs import RunQueueMeter, TaskRelay
from collectors.sim import SimCollector
from sentinel.sdk.telemetry import Telemetry
from sentinel.telemetry.schemas import Assignment, NodeCommand, SdkBatch

BURN = "while True:\n    pass\n"


def test_the_sdk_times_data_waits_phases_and_pauses_and_the_relay_sums_iterations():
    tel = Telemetry(job_id=3, rank=0, start_thread=False)

    def slow_batches():
        for i in range(3):
            time.sleep(0.02)
            yield i

    for _ in tel.data(slow_batches()):
        with tel.step(tokens=8):
            with tel.phase("host"):
                time.sleep(0.01)
            with tel.collective("all_to_all"):
                time.sleep(0.005)
        with tel.pause("checkpoint"):
            time.sleep(0.01)
    tel.record_experts([10, 30, 20, 20], dropped_tokens=4)
    raw = tel.take_batch()
    assert raw is not None
    phases = raw["phases"]
    assert phases["data_wait"][0] == pytest.approx(0.06, abs=0.02) and phases["data_wait"][1] == 0.0, "between steps"
    assert phases["host"][1] == pytest.approx(0.03, abs=0.015), "inside steps"
    assert phases["checkpoint"][0] == pytest.approx(0.03, abs=0.015) and phases["all_to_all"][1] > 0
    assert raw["experts"] == {"imbalance": 1.5, "routed_tokens": 80, "dropped_tokens": 4}
    relay = TaskRelay()
    relay.add(SdkBatch.model_validate(raw | {"pid": os.getpid()}))
    [task] = relay.drain()
    assert task.iterations == 2, "the first step's end starts the count"
    assert task.iteration_seconds == pytest.approx(2 * (0.02 + 0.015 + 0.01), abs=0.03)
    assert task.phases_in_step_seconds == pytest.approx(phases["host"][1] + phases["all_to_all"][1])
    assert task.experts is not None and task.experts.imbalance == 1.5


def test_cpu_wait_rises_when_another_process_competes_for_the_tasks_cpu():
    cpu = sorted(os.sched_getaffinity(0))[0]
    task = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", BURN])
    others: list[subprocess.Popen[bytes]] = []
    try:
        meter = RunQueueMeter()
        meter.measure({task.pid})
        time.sleep(0.5)
        alone = meter.measure({task.pid})[task.pid]
        others = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", BURN]) for _ in range(2)]
        time.sleep(1.0)
        meter.measure({task.pid})
        time.sleep(1.0)
        contended = meter.measure({task.pid})[task.pid]
        assert contended > alone + 0.3, (alone, contended)
        value, unit, detail = cpu_contention([task.pid], 1.0)
        assert unit == "ratio" and value > 0.3
        assert any(f"pid {p.pid}" in detail for p in others), detail
    finally:
        for proc in (task, *others):
            proc.kill()
            proc.wait()


def test_disk_and_exchange_experiments_measure_or_say_why_not(tmp_path: Path):
    rate, unit, detail = disk_write(str(tmp_path), 4 * 2**20)
    assert unit == "bytes/s" and rate > 1e6 and str(tmp_path) in detail and not list(tmp_path.iterdir())
    with pytest.raises(ExperimentError, match="not a directory"):
        disk_write(str(tmp_path / "missing"), 2**20)
    listener = ExchangeListener("127.0.0.1", 0).start()
    try:
        rate, unit, detail = exchange(listener.address, 4 * 2**20, 10.0)
        assert rate > 1e6 and "bus bandwidth" in detail and listener.served_total <= 1
    finally:
        listener.close()
    with pytest.raises(ExperimentError, match=r"failed|timed out"):
        exchange(listener.address, 2**20, 2.0)
    command = NodeCommand(id="cmd-1", kind="experiment", accelerator_index=0, fault="experiment",
                          spec={"id": "exp-1", "kind": "gemm"})
    failed = result_of(command)
    assert failed.id == "exp-1" and failed.value is None and "no GEMM probe" in (failed.error or "")
    unknown = result_of(command.model_copy(update={"spec": {"id": "exp-2", "kind": "reboot"}}))
    assert "unknown experiment kind" in (unknown.error or "")


def test_a_slowed_sim_accelerator_really_slows_the_task_on_it():
    task = subprocess.Popen([sys.executable, "-c", BURN])
    sim = SimCollector(1, "n0", peak_flops=1e12)
    try:
        sim.collect([Assignment(job_id=1, rank=0, pid=task.pid, accelerators=[sim.uuid(0)])])

        def cpu_seconds() -> float:
            fields = Path(f"/proc/{task.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        time.sleep(0.3)
        before = cpu_seconds()
        time.sleep(1.0)
        alone = cpu_seconds() - before
        sim.inject(0, "slow", 4.0)
        time.sleep(0.3)
        before = cpu_seconds()
        time.sleep(1.0)
        slowed = cpu_seconds() - before
        assert slowed < 0.5 * alone, (alone, slowed)
        sim.inject(0, "clear")
        time.sleep(0.3)
        assert Path(f"/proc/{task.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("R", "S"), "let go"
    finally:
        task.kill()
        task.wait()


def test_any_phase_or_pause_name_becomes_one_the_wire_takes():
    tel = Telemetry(job_id=3, rank=0, start_thread=False)
    with tel.phase("Eval-1"), tel.pause("Save to S3"):
        pass
    raw = tel.take_batch()
    assert raw is not None and set(raw["phases"]) == {"eval_1", "save_to_s3"}
    SdkBatch.model_validate(raw | {"pid": os.getpid()})  # the agent would take it
