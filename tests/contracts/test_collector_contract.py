"""The Collector contract: what the agent relies on from every source of readings, run against each registered one.

Each source's own behaviour (sim's faults, nvml's conversions, host's task memory) is tested in tests/collectors/;
this suite holds only what every source shares. A new source gets it by calling `collectors.base.register`.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

import collectors.host
import collectors.nvml
import collectors.rdma
import collectors.sim  # noqa: F401 - the built-in sources register themselves on import
from collectors.base import Collector, Readings, SourceUnavailable, create, registered
from sentinel.telemetry.schemas import AcceleratorInfo, Assignment, HardwareEvent, NodeRegistration, NodeReport
from tests.collectors.rdma_tree import HW_COUNTERS, RdmaTree
from tests.contracts.conftest import implementations

NODE = "contract-node"
FOREIGN_UUID = "GPU-on-another-source-0"  # the agent hands every source all of the node's assignments


def _nvml_problem() -> str | None:
    """Why the real nvml source cannot run here (as in tests/collectors/test_nvml_gpu.py), or None."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return str(error)
    try:
        return None if pynvml.nvmlDeviceGetCount() else "the driver reports no devices"
    finally:
        pynvml.nvmlShutdown()


_NVML_PROBLEM = _nvml_problem()
NEEDS_HARDWARE = {
    "nvml": [pytest.mark.gpu,
             pytest.mark.skipif(_NVML_PROBLEM is not None,
                                reason=f"nvml needs an NVIDIA GPU and driver; nvmlInit here: {_NVML_PROBLEM}")],
}


class RecordingSink:
    """Test double for the agent's `on_event`: keeps what a source emits, from whichever thread it calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Any] = []

    def __call__(self, event: HardwareEvent) -> None:
        with self._lock:
            self._events.append(event)

    @property
    def events(self) -> list[Any]:
        with self._lock:
            return list(self._events)


@pytest.fixture(params=implementations(registered(), marks=NEEDS_HARDWARE))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spec(name: str, tmp_path: Path) -> str:
    """How the agent would name the source here: rdma reads a fixture sysfs tree (this machine has no HCA)."""
    if name == "rdma":
        tree = RdmaTree(tmp_path / "sys")
        tree.add_port("mlx5_0", 1, hw_counters=dict(HW_COUNTERS))
        tree.add_port("mlx5_1", 1, link_layer="Ethernet")
        return f"rdma:{tree.root}"
    return name


@pytest.fixture
def source(spec: str) -> Iterator[Collector]:
    created = create(spec, NODE)
    try:
        yield created
    finally:
        created.close()


@pytest.fixture
def assignments(source: Collector) -> Iterator[list[Assignment]]:
    """What the server may place on a node: a live task on this source's first accelerator (if it has one), a task
    whose process has already exited, one not started yet (no pid), and one on another source's accelerator."""
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    own = [info.uuid for info in source.accelerators()[:1]]
    try:
        yield [Assignment(job_id=1, rank=0, pid=live.pid, accelerators=own),
               Assignment(job_id=1, rank=1, pid=gone.pid, accelerators=own),
               Assignment(job_id=2, rank=0, pid=None, accelerators=own),
               Assignment(job_id=3, rank=0, pid=live.pid, accelerators=[FOREIGN_UUID])]
    finally:
        assert live.stdin is not None
        live.stdin.close()  # end of input: the task exits by itself
        try:
            live.wait(timeout=30)
        except subprocess.TimeoutExpired:
            live.kill()
            live.wait()


def numbers(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a dumped wire model, with its dotted path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from numbers(item, f"{path}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, float(value)


def check_readings(readings: Any, source: Collector) -> list[str]:
    """What the agent needs of one collect: `Readings`, samples only of its own accelerators (one each),
    finite numbers, ratios in 0..1, used ≤ total; and all of it fits in the report the agent sends."""
    assert isinstance(readings, Readings), f"collect returned {type(readings).__name__}, not Readings"
    own = {info.uuid for info in source.accelerators()}
    uuids = [sample.uuid for sample in readings.accelerators]
    assert set(uuids) <= own, f"samples of accelerators this source does not report: {set(uuids) - own}"
    assert len(uuids) == len(set(uuids)), f"an accelerator sampled twice in one collect: {uuids}"
    dumped: dict[str, Any] = {"accelerators": [s.model_dump() for s in readings.accelerators]}
    if readings.host is not None:
        dumped["host"] = readings.host.model_dump()
        assert readings.host.memory_used_bytes <= readings.host.memory_total_bytes
        assert readings.host.disk_used_bytes <= readings.host.disk_total_bytes
    for sample in readings.accelerators:
        assert sample.memory_used_bytes <= sample.memory_total_bytes, sample.uuid
        assert sample.memory_peak_bytes is None or sample.memory_peak_bytes >= sample.memory_used_bytes, sample.uuid
    for path, number in numbers(dumped):
        assert math.isfinite(number), f"{path} = {number}"
        if path.endswith("_ratio"):
            assert 0.0 <= number <= 1.0, f"{path} = {number}"
    if readings.nics:
        dumped["nics"] = [p.model_dump() for p in readings.nics]
    report = NodeReport(node=NODE, seq=1, sent_at=time.time(), host=readings.host, accelerators=readings.accelerators,
                        nics=readings.nics)
    sent = NodeReport.model_validate_json(report.model_dump_json(exclude_none=True))  # as Agent.report_now spools it
    assert sent.accelerators == readings.accelerators and sent.host == readings.host and sent.nics == readings.nics
    return uuids


# ---- creating --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("any_name", implementations(registered()))
def test_creating_a_source_works_or_fails_cleanly(any_name: str):
    """Every source, nvml on a machine without a GPU included: the agent goes on without one that cannot run here,
    which it can do only when the failure is SourceUnavailable."""
    try:
        created = create(any_name, NODE)
    except SourceUnavailable as unavailable:
        assert str(unavailable).strip(), "SourceUnavailable must say why"
        return
    try:
        assert isinstance(created, Collector)
    finally:
        created.close()


def test_a_source_is_created_by_its_registered_name_and_carries_it(name: str, source: Collector):
    assert isinstance(source, Collector)
    assert source.name == name  # the agent's sources_up and the registration's `sources` are keyed by it


# ---- what it reports on ------------------------------------------------------------------------------------


def test_accelerators_are_described_once_each_and_register(source: Collector):
    infos = source.accelerators()
    assert isinstance(infos, list) and all(isinstance(info, AcceleratorInfo) for info in infos)
    uuids = [info.uuid for info in infos]
    assert len(set(uuids)) == len(uuids), f"duplicate uuids: {uuids}"
    indexes = [info.index for info in infos]
    assert len(set(indexes)) == len(indexes), f"duplicate indexes: {indexes}"
    assert {info.source for info in infos} <= {source.name}
    assert source.accelerators() == infos  # asked again at every registration and /metrics scrape
    registration = NodeRegistration(name=NODE, sources=[source.name], accelerators=infos)
    assert NodeRegistration.model_validate_json(registration.model_dump_json()).accelerators == infos


def test_a_source_reports_on_one_thing_the_host_accelerators_or_nic_ports(source: Collector):
    """The agent keeps the last host metrics it is given: an accelerator or NIC source reporting the host would hide
    the host source's. And a source that reports nothing is of no use."""
    readings = source.collect([])
    reported = [bool(readings.host), bool(source.accelerators()), bool(readings.nics)]
    assert reported.count(True) == 1, f"host / accelerators / nics: {reported}"
    if not source.accelerators():
        assert readings.accelerators == []


# ---- collecting --------------------------------------------------------------------------------------------


def test_collect_without_assignments(source: Collector):
    check_readings(source.collect([]), source)


def test_collect_with_any_assignment_the_server_may_send(source: Collector, assignments: list[Assignment]):
    """Live, exited and not-yet-started tasks, and one on an accelerator of another source: none fails the collect,
    and a foreign uuid never turns up in this source's samples."""
    uuids = check_readings(source.collect(assignments), source)
    assert FOREIGN_UUID not in uuids


def test_collecting_again_reports_the_same_accelerators(source: Collector, assignments: list[Assignment]):
    first = check_readings(source.collect(assignments), source)
    second = check_readings(source.collect(assignments), source)
    third = check_readings(source.collect([]), source)
    assert sorted(first) == sorted(second) == sorted(third)


# ---- lifecycle ---------------------------------------------------------------------------------------------


def test_start_collect_close_and_close_again(spec: str):
    """As the agent runs a source: start with its event sink, collect, then close on stop, perhaps twice.
    Closing stops every thread the source started; whatever it emitted is a HardwareEvent about its own
    accelerators (or none in particular)."""
    threads_before = set(threading.enumerate())
    sink = RecordingSink()
    source = create(spec, NODE)
    try:
        source.start(sink)
        check_readings(source.collect([]), source)
        check_readings(source.collect([]), source)
        own = {info.uuid for info in source.accelerators()}
    finally:
        source.close()
    left_running = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert left_running == [], f"threads still running after close(): {left_running}"
    source.close()
    for event in sink.events:
        assert isinstance(event, HardwareEvent), f"emitted {type(event).__name__}, not HardwareEvent"
        assert event.accelerator_uuid is None or event.accelerator_uuid in own, event


def test_close_without_start_is_safe_and_idempotent(spec: str):
    """The agent closes every source it created on stop, started or not."""
    threads_before = set(threading.enumerate())
    source = create(spec, NODE)
    source.close()
    source.close()
    assert [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()] == []
