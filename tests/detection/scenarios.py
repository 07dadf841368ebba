"""One true-positive stream per detector, shared by the detector's own tests and the Detector contract
(tests/contracts/test_detector_contract.py), with the variants the contract needs: the condition on two
subjects at once, and the condition clearing."""

from __future__ import annotations

from collections.abc import Callable

from sentinel.detection.base import Detector, Evaluation
from sentinel.detection.catalog import FaultCatalog
from sentinel.detection.detectors.allreduce_spike import AllreduceSpikeDetector
from sentinel.detection.detectors.bad_completion import BadCompletion
from sentinel.detection.detectors.checkpoint_stale import CheckpointStaleDetector
from sentinel.detection.detectors.hang import HungTask
from sentinel.detection.detectors.hardware import HardwareEvents
from sentinel.detection.detectors.heartbeat import HeartbeatLoss
from sentinel.detection.detectors.kv_transfer import KvTransfer
from sentinel.detection.detectors.lemon import LemonDetector
from sentinel.detection.detectors.memory import MemoryDetector
from sentinel.detection.detectors.mfu_drop import MfuDropDetector
from sentinel.detection.detectors.queue_growth import QueueGrowth
from sentinel.detection.detectors.serving_stall import ServingStall
from sentinel.detection.detectors.slo_burn import SloBurn
from sentinel.detection.detectors.straggler import StragglerDetector
from sentinel.detection.detectors.task_exit import TaskExit as TaskExitDetector
from sentinel.detection.detectors.throttle import ThrottleDetector
from sentinel.jobs.service import ClosedTask, describe_exit
from sentinel.live.faults import Fault
from sentinel.live.fleet import NodeLive
from sentinel.telemetry.schemas import Assignment, HardwareEvent, NodeReport, TaskExit
from tests.detection.streams import GiB, World, run

Stream = list[tuple[float, Evaluation]]
Outcome = tuple[World, Detector, Stream]


def jitter(rank: int, i: int) -> float:
    """Deterministic noise of ±2% so ranks are never identical."""
    return 1.0 + 0.01 * (((rank * 7 + i * 3) % 5) - 2)


def training_job(world: World, job_id: int = 1, ranks: int = 4, node: str = "node-a") -> list[str]:
    uuids = world.add_node(node, accelerators=ranks)
    for rank in range(ranks):
        world.place(job_id, rank, node, [uuids[rank]])
    return uuids


def straggler(options: dict[str, float] | None = None, seconds: float = 120.0,
              slow: Callable[[float], float] = lambda t: 1.5, throttle: bool = False) -> Outcome:
    """Four ranks stepping ~1 s; rank 2 steps `slow(t)` times slower all along."""
    world = World({"straggler": options or {}})
    uuids = training_job(world)
    detector = StragglerDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            factor = slow(t) if rank == 2 else 1.0
            world.steps("node-a", 1, rank, [jitter(rank, i) * factor for i in range(10)])
            world.sample(uuids[rank], temperature=91.0 if throttle and rank == 2 else 60.0,
                         throttle=("hw_thermal_slowdown",) if throttle and rank == 2 else ())

    return world, detector, run(world, detector, seconds, tick)


def mfu_job(world: World, seconds: float, step: Callable[[float], float],
            share: Callable[[float], float] = lambda t: 0.2, tokens: Callable[[float], int] = lambda t: 4096,
            detector: Detector | None = None, attempt: Callable[[float], int] = lambda t: 0) -> Stream:
    """Two ranks, ten steps of `step(t)` seconds per report; a new attempt starts with 30 s compile steps."""
    detector = detector or MfuDropDetector(world.settings)
    started: dict[int, int] = {}

    def tick(t: float) -> None:
        for rank in range(2):
            durations = [step(t) * jitter(rank, i) for i in range(10)]
            if started.get(rank) != attempt(t):
                started[rank] = attempt(t)
                durations[:5] = [30.0] * 5  # warm-up: compilation, caches, data loader start
            world.steps("node-a", 7, rank, durations, tokens_per_step=tokens(t), collective_share=share(t),
                        attempt=attempt(t))

    return run(world, detector, seconds, tick)


def mfu_drop(options: dict[str, float] | None = None, drop_at: float = 35 * 60, seconds: float = 40 * 60,
             slow: float = 1.5, share_after: float = 0.2) -> Outcome:
    """35 steady minutes, then steps `slow` times longer for the same tokens."""
    world = World({"mfu_drop": options or {}})
    training_job(world, job_id=7, ranks=2)
    detector = MfuDropDetector(world.settings)
    stream = mfu_job(world, seconds, lambda t: slow if t > drop_at else 1.0,
                     share=lambda t: share_after if t > drop_at else 0.2, detector=detector)
    return world, detector, stream


def allreduce_spike(before: float = 0.15, after: dict[int, float] | None = None,
                    spike_at: float = 35 * 60, seconds: float = 38 * 60, spike_for: float = 3600.0,
                    options: dict[str, float] | None = None) -> Outcome:
    """Four ranks at all-reduce share `before`; for `spike_for` from `spike_at`, each rank at `after[rank]`."""
    after = after if after is not None else {0: 0.40, 1: 0.60, 2: 0.40, 3: 0.55}
    world = World({"allreduce_spike": options or {}})
    training_job(world, job_id=3, ranks=4)
    detector = AllreduceSpikeDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            share = after[rank] if spike_at < t <= spike_at + spike_for else before
            step = 0.85 / (1 - share)  # the same compute, more time waiting in collectives
            world.steps("node-a", 3, rank, [step * jitter(rank, i) for i in range(10)], collective_share=share)

    return world, detector, run(world, detector, seconds, tick)


def throttle(pattern: list[bool] | None = None, reasons: tuple[str, ...] = ("hw_thermal_slowdown",),
             options: dict[str, float] | None = None) -> Outcome:
    """Two accelerators sampled every 10 s; GPU 0 throttles where `pattern` says so."""
    pattern = pattern if pattern is not None else [False] * 4 + [True] * 8
    world = World({"throttle": options or {}})
    uuids = world.add_node("node-t", accelerators=2)
    detector = ThrottleDetector(world.settings)

    def tick(t: float) -> None:
        hot = pattern[min(int(t // 10) - 1, len(pattern) - 1)]
        world.sample(uuids[0], temperature=92.0 if hot else 65.0, power=380.0 if hot else 520.0,
                     clock_hz=1.1e9 if hot else 1.98e9, throttle=reasons if hot else ())
        world.sample(uuids[1], temperature=64.0)

    return world, detector, run(world, detector, 10.0 * len(pattern), tick)


def memory(used: Callable[[int], float], samples: int = 40, place: bool = True) -> Outcome:
    """GPU 0 of a node reports `used(i)` bytes at sample i (every 10 s); GPU 1 sits at 20 GiB."""
    world = World()
    uuids = world.add_node("node-m", accelerators=2)
    if place:
        world.place(5, 0, "node-m", [uuids[0]])
        world.place(5, 1, "node-m", [uuids[1]])
    detector = MemoryDetector(world.settings)

    def tick(t: float) -> None:
        world.sample(uuids[0], used_bytes=used(int(t // 10) - 1))
        world.sample(uuids[1], used_bytes=20 * GiB)

    return world, detector, run(world, detector, 10.0 * samples, tick)


def leak() -> Outcome:
    """30 GiB growing 0.5 GiB every 10 s: full in about 13 minutes once the window is long enough."""
    return memory(lambda i: 30 * GiB + i * 0.5 * GiB, samples=30)


def lemon() -> Outcome:
    """Four nodes of eight; one accelerator with three XID 48 episodes this week."""
    world = World()
    for name in ("node-0", "node-1", "node-2", "node-3"):
        world.add_node(name)
    world.fault("node-1", "GPU-node-1-3", days_ago=5.0)
    world.fault("node-1", "GPU-node-1-3", days_ago=3.0, kind="ecc", xid=None)
    world.fault("node-1", "GPU-node-1-3", days_ago=1.0, xid=48)
    world.fault("node-2", "GPU-node-2-0", days_ago=2.0, xid=79)  # the rest of the fleet: one fault
    detector = LemonDetector(world.settings)
    return world, detector, [(0.0, world.evaluate(detector))]


def checkpoint_stale(stop_at: float = 300.0, seconds: float = 900.0, stepping: Callable[[float], bool] = lambda t: True,
                     resume_at: float | None = None) -> Outcome:
    """Two ranks stepping ~1 s and committing a checkpoint every 60 s; from `stop_at` rank 1's saves stop
    registering (rank 0's still do), until `resume_at`."""
    world = World()
    training_job(world, ranks=2)
    detector = CheckpointStaleDetector(world.settings)

    def tick(t: float) -> None:
        if stepping(t):
            for rank in range(2):
                world.steps("node-a", 1, rank, [jitter(rank, i) for i in range(10)])
        if t % 60 == 0:
            failing = stop_at <= t and (resume_at is None or t < resume_at)
            step = int(t)
            world.checkpoints.shard(1, step, 0, world_size=2, committed=False, at=world.now)
            if not failing:
                world.checkpoints.shard(1, step, 1, world_size=2, committed=True, at=world.now)

    return world, detector, run(world, detector, seconds, tick)


# -- the event-driven detectors, and the periodic ones that watch liveness -------------------------------------------
# Their reports go through `ingest`, which does what the report pipeline does before a detector sees one.

def ingest(world: World, node: str, *, events: list[HardwareEvent] | None = None,
           exits: list[TaskExit] | None = None) -> tuple[NodeLive, NodeReport, list[ClosedTask]]:
    """One report from `node` now, through the steps before the event detectors (pipeline/ingest.py, report.py
    and DetectionEngine.on_report): liveness, exits closed against the placements, faults into the history."""
    live = world.fleet.get(node)
    assert live is not None
    report = NodeReport(node=node, seq=live.last_seq + 1, sent_at=world.now, events=events or [],
                        task_exits=exits or [])
    live.last_seen = world.now
    live.remember(report.seq)
    if live.state == "down":
        live.state = live.admin_state  # reporting again
    closed = []
    for ended in report.task_exits:
        for task in [t for t in world.assignments.get(live.id, []) if t.pid == ended.pid]:
            failed = ended.signal is not None or ended.exit_code != 0
            reason = describe_exit(ended.exit_code, ended.signal)[0] if failed else ""
            stats = world.jobs.job(task.job_id).ranks.get(task.rank)
            closed.append(ClosedTask(task.job_id, task.rank, ended.pid, reason, stats.attempt if stats else 0))
            world.jobs.mark_ended(task.job_id, task.rank, ended.pid)
            if reason:
                world.jobs.count_failure(task.job_id, reason)
            world.assignments[live.id].remove(task)
    for event in report.events:
        severity = world.ctx.catalog.lookup(event).severity
        if severity != "info":
            world.history.add(Fault(event.observed_at, node, event.accelerator_uuid, event.kind, event.xid, severity))
    return live, report, closed


def run_reports(world: World, detector: Detector, seconds: float,
                tick: Callable[[float], list[tuple[NodeLive, NodeReport, list[ClosedTask]]]]) -> Stream:
    """Every 10 s: advance the clock, let `tick(elapsed)` send its reports, hand each to `on_report`. Each entry
    holds that round's findings, out of how many reports there were."""
    out: Stream = []
    elapsed = 0.0
    while elapsed < seconds - 1e-9:
        world.advance(10.0)
        elapsed += 10.0
        reports = tick(elapsed)
        found = [f for live, report, exits in reports for f in detector.on_report(world.ctx, live, report, exits)]
        out.append((elapsed, Evaluation(found, len(reports))))
    return out


def hang(jobs: tuple[int, ...] = (2,), stop_at: float = 120.0, seconds: float = 200.0,
         resume_at: float | None = None) -> Outcome:
    """Each job: two ranks on its own node stepping ~1 s. From `stop_at` rank 1 makes no progress with its
    accelerator pinned at 100% (a hung kernel) and rank 0 blocks in the next collective a report later;
    their processes live and the nodes keep reporting. From `resume_at` both step again."""
    world = World()
    nodes = {job: f"node-h{job}" for job in jobs}
    uuids = {job: training_job(world, job, ranks=2, node=nodes[job]) for job in jobs}
    detector = HungTask(world.settings)

    def tick(t: float) -> None:
        stuck = stop_at <= t and (resume_at is None or t < resume_at)
        for job in jobs:
            ingest(world, nodes[job])
            for rank in range(2):
                blocked = stuck and (rank == 1 or t >= stop_at + 10)
                world.steps(nodes[job], job, rank, [] if blocked else [jitter(rank, i) for i in range(10)])
                world.sample(uuids[job][rank], utilization=1.0 if stuck and rank == 1 else 0.0 if blocked else 0.9)

    return world, detector, run(world, detector, seconds, tick)


def heartbeat(silent: tuple[str, ...] = ("node-2",), silent_at: float = 60.0, seconds: float = 120.0,
              back_at: float | None = None) -> Outcome:
    """Four nodes reporting every 10 s, a job on each `silent` node; from `silent_at` those send nothing
    (until `back_at`), and liveness marks them down after `missed_intervals_down` of their intervals."""
    world = World()
    for i in range(4):
        uuids = world.add_node(f"node-{i}", accelerators=2)
        if f"node-{i}" in silent:
            world.place(9 + i, 0, f"node-{i}", uuids[:1])
    detector = HeartbeatLoss(world.settings)

    def tick(t: float) -> None:
        gone = silent_at <= t and (back_at is None or t < back_at)
        for live in world.fleet.all():
            if not (gone and live.name in silent):
                ingest(world, live.name)
        for live in world.fleet.overdue(world.now, world.settings.missed_intervals_down):
            live.state = "down"  # what live/liveness.py check_liveness does in memory

    return world, detector, run(world, detector, seconds, tick)


def hardware(faults: tuple[tuple[str, int, int], ...] = (("node-x", 3, 79),), repeats: int = 2) -> Outcome:
    """A job on all eight accelerators of each node named; each (node, accelerator index, XID) is reported
    `repeats` times, one report (10 s) apart, as an agent does when the driver logs it again."""
    world = World()
    world.ctx.catalog = FaultCatalog.load()
    uuids = {node: world.add_node(node) for node in sorted({node for node, _, _ in faults})}
    for job, node in enumerate(uuids, start=4):
        for rank, uuid in enumerate(uuids[node]):
            world.place(job, rank, node, [uuid])
    detector = HardwareEvents(world.settings)

    def tick(t: float) -> list[tuple[NodeLive, NodeReport, list[ClosedTask]]]:
        reports = []
        for node in uuids:
            for uuid in uuids[node]:
                world.sample(uuid, temperature=70.0)
            events = [HardwareEvent(kind="xid", accelerator_uuid=f"GPU-{node}-{index}", xid=xid,
                                    message=f"NVRM: Xid (PCI:0000:{index:02x}:00): {xid}", observed_at=world.now - 0.2)
                      for where, index, xid in faults if where == node and t <= 10.0 * repeats]
            reports.append(ingest(world, node, events=events))
        return reports

    return world, detector, run_reports(world, detector, 10.0 * repeats + 10.0, tick)


def task_exit(jobs: tuple[int, ...] = (6,), fail_at: float = 60.0, seconds: float = 90.0,
              restart_at: float | None = None) -> Outcome:
    """Each job: two ranks on its own node stepping ~1 s. At `fail_at` rank 1 is killed (SIGKILL, no hardware
    fault); a report later rank 0 exits with code 1 as its collective breaks. From `restart_at` a new attempt
    (new pids, placed again) steps."""
    world = World()
    nodes = {job: f"node-e{job}" for job in jobs}
    uuids = {job: training_job(world, job, ranks=2, node=nodes[job]) for job in jobs}
    detector = TaskExitDetector(world.settings)

    def tick(t: float) -> list[tuple[NodeLive, NodeReport, list[ClosedTask]]]:
        attempt = 1 if restart_at is not None and t >= restart_at else 0
        reports = []
        for job in jobs:
            live = world.fleet.get(nodes[job])
            assert live is not None
            if t == restart_at:
                world.assignments[live.id] = [Assignment(job_id=job, rank=rank, pid=1100 + rank,
                                                         accelerators=[uuids[job][rank]]) for rank in range(2)]
            exits = [TaskExit(job_id=job, rank=rank, pid=1000 + rank, observed_at=world.now - 0.5, **how)
                     for rank, at, how in ((1, fail_at, {"signal": 9}), (0, fail_at + 10, {"exit_code": 1}))
                     if t == at]
            running = {task.rank for task in world.assignments.get(live.id, [])} - {e.rank for e in exits}
            for rank in sorted(running):
                world.steps(nodes[job], job, rank, [jitter(rank, i) for i in range(10)], attempt=attempt)
            reports.append(ingest(world, nodes[job], exits=exits))
        return reports

    return world, detector, run_reports(world, detector, seconds, tick)


# -- the same condition on two subjects at once: each must get its own fingerprint -----------------------------------

def two_jobs(detector_class: type[Detector], step: Callable[[float, int], float],
             share: Callable[[float], float] = lambda t: 0.2, seconds: float = 40 * 60) -> Outcome:
    """Jobs 7 and 8, two ranks each on nodes of their own; rank r steps `step(t, r)` seconds at all-reduce share
    `share(t)`, and its first report holds five 30 s warm-up steps."""
    world = World()
    for job in (7, 8):
        training_job(world, job, ranks=2, node=f"node-{job}")
    detector = detector_class(world.settings)

    def tick(t: float) -> None:
        for job in (7, 8):
            for rank in range(2):
                durations = [step(t, rank) * jitter(rank, i) for i in range(10)]
                if t == 10.0:
                    durations[:5] = [30.0] * 5
                world.steps(f"node-{job}", job, rank, durations, collective_share=share(t))

    return world, detector, run(world, detector, seconds, tick)


def throttle_pair() -> Outcome:
    """Both accelerators of a node thermally throttled for eight of twelve samples."""
    world = World()
    uuids = world.add_node("node-t", accelerators=2)
    detector = ThrottleDetector(world.settings)

    def tick(t: float) -> None:
        for uuid in uuids:
            hot = t > 40
            world.sample(uuid, temperature=92.0 if hot else 65.0, throttle=("hw_thermal_slowdown",) if hot else ())

    return world, detector, run(world, detector, 120.0, tick)


def memory_pair() -> Outcome:
    """Both accelerators of job 5 leak as in `leak`."""
    world = World()
    uuids = world.add_node("node-m", accelerators=2)
    for rank, uuid in enumerate(uuids):
        world.place(5, rank, "node-m", [uuid])
    detector = MemoryDetector(world.settings)

    def tick(t: float) -> None:
        for uuid in uuids:
            world.sample(uuid, used_bytes=30 * GiB + (int(t // 10) - 1) * 0.5 * GiB)

    return world, detector, run(world, detector, 300.0, tick)


def lemon_pair() -> Outcome:
    """An accelerator lemon (three XID 48 episodes on node-1's GPU 3) and a node lemon (five episodes on
    node-2, each on another of its accelerators) this week."""
    world = World()
    for name in ("node-0", "node-1", "node-2", "node-3"):
        world.add_node(name)
    for days_ago in (5.0, 3.0, 1.0):
        world.fault("node-1", "GPU-node-1-3", days_ago=days_ago)
    for index, days_ago in enumerate((6.0, 5.0, 4.0, 3.0, 2.0)):
        world.fault("node-2", f"GPU-node-2-{index}", days_ago=days_ago)
    detector = LemonDetector(world.settings)
    return world, detector, [(0.0, world.evaluate(detector))]


def checkpoint_stale_pair() -> Outcome:
    """Jobs 1 and 2 as in `checkpoint_stale`: from 300 s rank 1's saves stop registering."""
    world = World()
    for job in (1, 2):
        training_job(world, job, ranks=2, node=f"node-{job}")
    detector = CheckpointStaleDetector(world.settings)

    def tick(t: float) -> None:
        for job in (1, 2):
            for rank in range(2):
                world.steps(f"node-{job}", job, rank, [jitter(rank, i) for i in range(10)])
            if t % 60 == 0:
                world.checkpoints.shard(job, int(t), 0, world_size=2, committed=False, at=world.now)
                if t < 300:
                    world.checkpoints.shard(job, int(t), 1, world_size=2, committed=True, at=world.now)

    return world, detector, run(world, detector, 900.0, tick)


# -- the condition clearing, where the scenario's own parameters cannot say it ---------------------------------------

def mfu_drop_recovers() -> Outcome:
    """As `mfu_drop`, but the job is back to its pace after five slow minutes."""
    world = World()
    training_job(world, job_id=7, ranks=2)
    detector = MfuDropDetector(world.settings)
    return world, detector, mfu_job(world, 45 * 60, lambda t: 1.5 if 35 * 60 < t <= 40 * 60 else 1.0, detector=detector)


def lemon_ages_out() -> Outcome:
    """As `lemon`, then eight quiet days: the episodes leave the week-long window."""
    world, detector, stream = lemon()
    world.advance(8 * 86400.0)
    return world, detector, [*stream, (8 * 86400.0, world.evaluate(detector))]


Serve = Callable[[World, float, int, str, bool], None]


def replica_drill(detector_class: type[Detector], replicas: tuple[str, ...], bad_at: float, good_at: float | None,
                  seconds: float, serve: Serve) -> Outcome:
    """A serving job's decode replicas on one node report every 10 s: d0, healthy throughout, and `replicas`,
    bad from `bad_at` until `good_at`; `serve(world, t, rank, name, bad)` sends one replica's interval."""
    world = World()
    world.add_node("node-s", accelerators=len(replicas) + 1)
    detector = detector_class(world.settings)
    names = ("d0", *replicas)

    def tick(t: float) -> None:
        for rank, name in enumerate(names):
            serve(world, t, rank, name, name != "d0" and t >= bad_at and (good_at is None or t < good_at))

    return world, detector, run(world, detector, seconds, tick)


def serving_stall(replicas: tuple[str, ...] = ("d1",), freeze_at: float = 60.0, seconds: float = 120.0,
                  resume_at: float | None = None, running: int = 4) -> Outcome:
    """`replicas` freeze mid-stream at `freeze_at` (requests in flight, no token since), and come back at
    `resume_at`."""
    return replica_drill(ServingStall, replicas, freeze_at, resume_at, seconds, lambda world, t, rank, name, bad:
                         world.serve("node-s", 9, rank, name, frozen=bad, running=running))


def slo_burn(failing: tuple[int, ...] = (9,), fail_at: float = 600.0, seconds: float = 900.0,
             recover_at: float | None = None, share: float = 0.6) -> Outcome:
    """Serving jobs whose replica finishes 20 requests per 10 s; from `fail_at` a `share` of the `failing` jobs'
    requests fail (until `recover_at`)."""
    world = World()
    world.add_node("node-s", accelerators=4)
    detector = SloBurn(world.settings)

    def tick(t: float) -> None:
        for job_id in (9, 10, 11):
            bad = job_id in failing and t >= fail_at and (recover_at is None or t < recover_at)
            world.serve("node-s", job_id, 0, "d0", failed=round(20 * share) if bad else 0, running=0)

    return world, detector, run(world, detector, seconds, tick)


def bad_completion(replicas: tuple[str, ...] = ("d1",), bad_at: float = 60.0, seconds: float = 120.0,
                   fixed_at: float | None = None, canary: str = "empty", every: float = 10.0) -> Outcome:
    """Each replica with a canary result every `every` s; from `bad_at` the canary of `replicas` comes back
    `canary` (empty, truncated, timeout, error), until `fixed_at`."""
    return replica_drill(BadCompletion, replicas, bad_at, fixed_at, seconds, lambda world, t, rank, name, bad:
                         world.serve("node-s", 9, rank, name, running=2, canary=(canary if bad else "ok")
                                     if round(t) % round(every) == 0 else None))


def kv_transfer(replicas: tuple[str, ...] = ("d1",), slow_at: float = 900.0, seconds: float = 1200.0,
                fixed_at: float | None = None, share: float = 0.31, failures: int = 0) -> Outcome:
    """Disaggregated: a KV transfer takes 0.8% of each request's 100 ms first token; from `slow_at` that of
    `replicas` takes `share` (and `failures` fail per interval), until `fixed_at`."""
    return replica_drill(KvTransfer, replicas, slow_at, fixed_at, seconds, lambda world, t, rank, name, bad:
                         world.serve("node-s", 9, rank, name, running=2,
                                     kv_seconds=0.1 * (share if bad and not failures else 0.008),
                                     kv_failures=failures if bad else 0))


def queue_growth(replicas: tuple[str, ...] = ("d1",), grow_at: float = 60.0, seconds: float = 240.0,
                 fixed_at: float | None = None, per_report: int = 5) -> Outcome:
    """2 requests waiting; from `grow_at` the queue of `replicas` grows by `per_report` each report, until
    `fixed_at`, when it drains back to 2."""
    return replica_drill(QueueGrowth, replicas, grow_at, fixed_at, seconds, lambda world, t, rank, name, bad:
                         world.serve("node-s", 9, rank, name, running=32,
                                     waiting=2 + per_report * round((t - grow_at) / 10 + 1) if bad else 2))
