"""Jobs and their tasks (ranks placed on accelerators). Functions take a session and never commit."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.audit.service import record
from sentinel.db import utcnow
from sentinel.events.service import record_event
from sentinel.jobs.models import FINISHED_STATES, Job, Task
from sentinel.jobs.schemas import JobCreate, TaskCreate, TaskOut
from sentinel.nodes.models import Node
from sentinel.telemetry.schemas import Assignment


@dataclass(frozen=True)
class ClosedTask:
    """A task the report said has ended; `failure_reason` is '' when it succeeded: exit 0 with no error the SDK
    saw before it (exit 0 right after an uncaught exception or a failed step is a failure: SkyPilot #4421)."""

    job_id: int
    rank: int
    pid: int
    failure_reason: str
    attempt: int = 0


class JobNotFound(LookupError):
    pass


class PlacementRejected(ValueError):
    """The task names something that exists but cannot take it (HTTP 409), or does not exist (422)."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


def create_job(session: Session, spec: JobCreate, *, actor: str) -> Job:
    job = Job(name=spec.name, kind=spec.kind, world_size=spec.world_size, attributes=dict(spec.attributes),
              owner=actor, state="pending")
    session.add(job)
    session.flush()
    record(session, actor=actor, action="job.create", subject=f"job/{job.id}",
           detail={"name": spec.name, "kind": spec.kind, "world_size": spec.world_size})
    return job


def finish_job(session: Session, job: Job, state: str, reason: str, *, actor: str) -> bool:
    """The job ended as its launcher says (`succeeded` or `cancelled`); False when it had ended already (the
    first word stands: a launcher that retries its call changes nothing)."""
    if job.state in FINISHED_STATES:
        return False
    job.state, job.updated_at = state, utcnow()
    record(session, actor=actor, action=f"job.{state}", subject=f"job/{job.id}", detail={"reason": reason})
    record_event(session, kind=f"job_{state}", job_id=job.id,
                 message=f"job {job.id} ({job.name}) {state} by {actor}" + (f": {reason}" if reason else ""))
    return True


def get_job(session: Session, job_id: int, *, lock: bool = False) -> Job:
    """`lock`: the job's row is held to the end of the transaction (PostgreSQL; SQLite writes one at a time).
    A write that changes a job's tasks takes its job first: writers that took a task row first and the job
    second crossed each other (a task registration and the ingest of two ranks' exits: a deadlock, a 500)."""
    job = session.scalar(select(Job).where(Job.id == job_id).with_for_update()) if lock else session.get(Job, job_id)
    if job is None:
        raise JobNotFound(f"job {job_id} does not exist")
    return job


def list_jobs(session: Session, *, state: str | None = None, limit: int = 100, offset: int = 0) -> list[Job]:
    query = select(Job).order_by(Job.id.desc()).limit(limit).offset(offset)
    if state is not None:
        query = query.where(Job.state == state)
    return list(session.scalars(query))


def job_tasks(session: Session, job_id: int) -> list[TaskOut]:
    rows = session.execute(select(Task, Node.name).join(Node, Node.id == Task.node_id)
                           .where(Task.job_id == job_id).order_by(Task.attempt, Task.rank))
    return [TaskOut.model_validate({**_task_dict(task), "node": node}) for task, node in rows]


def _task_dict(task: Task) -> dict[str, object]:
    return {c: getattr(task, c) for c in ("id", "job_id", "rank", "attempt", "accelerators", "pid", "state",
                                          "exit_code", "exit_signal", "failure_reason", "engine", "started_at",
                                          "ended_at")}


def register_task(session: Session, job: Job, spec: TaskCreate, *, actor: str) -> TaskOut:
    if spec.rank >= job.world_size:
        raise PlacementRejected(f"rank {spec.rank} is outside job {job.id}'s world size {job.world_size}", 422)
    node = session.scalar(select(Node).where(Node.name == spec.node))
    if node is None:
        raise PlacementRejected(f"node {spec.node!r} is not registered", 422)
    if node.state != "active":
        raise PlacementRejected(f"node {spec.node!r} is {node.state} and takes no new tasks")
    _check_accelerators(session, node, spec.accelerators)
    taken = session.scalar(select(Task.id).where(Task.job_id == job.id, Task.rank == spec.rank,
                                                 Task.attempt == spec.attempt))
    if taken is not None:
        raise PlacementRejected(f"job {job.id} rank {spec.rank} attempt {spec.attempt} is already registered")
    for older in session.scalars(select(Task).where(Task.job_id == job.id, Task.rank == spec.rank,
                                                    Task.attempt < spec.attempt, Task.state == "running")):
        older.state, older.ended_at = "lost", utcnow()  # replaced by the new attempt, whatever became of it
    task = Task(job_id=job.id, rank=spec.rank, attempt=spec.attempt, node_id=node.id,
                accelerators=list(spec.accelerators), pid=spec.pid, state="running", engine=spec.engine)
    session.add(task)
    session.flush()
    placed = session.scalar(select(func.count()).select_from(Task).where(
        Task.job_id == job.id, Task.attempt == spec.attempt, Task.state == "running")) or 0
    if placed >= job.world_size and job.state in ("pending", "recovering"):
        job.state = "running"
    job.updated_at = utcnow()
    record(session, actor=actor, action="task.register", subject=f"job/{job.id}/rank/{spec.rank}",
           detail={"node": spec.node, "accelerators": spec.accelerators, "attempt": spec.attempt,
                   **({"engine": spec.engine} if spec.engine else {})})
    return TaskOut.model_validate({**_task_dict(task), "node": node.name})


def _check_accelerators(session: Session, node: Node, uuids: list[str]) -> None:
    if len(set(uuids)) != len(uuids):
        raise PlacementRejected("the same accelerator is listed twice", 422)
    rows = {a.uuid: a for a in session.scalars(select(Accelerator).where(Accelerator.uuid.in_(uuids)))}
    for uuid in uuids:
        row = rows.get(uuid)
        if row is None or row.node_id != node.id:
            raise PlacementRejected(f"accelerator {uuid!r} is not on node {node.name!r}", 422)
        if row.health == "quarantined" or not row.present:
            state = "quarantined" if row.health == "quarantined" else "absent"
            raise PlacementRejected(f"accelerator {uuid!r} is {state} and takes no tasks")


def assignments_by_node(session: Session) -> dict[int, list[Assignment]]:
    """Running tasks grouped by node: the agent watches their processes and drives sim load from them."""
    out: dict[int, list[Assignment]] = {}
    for task in session.scalars(select(Task).where(Task.state == "running")):
        out.setdefault(task.node_id, []).append(
            Assignment(job_id=task.job_id, rank=task.rank, pid=task.pid, accelerators=list(task.accelerators),
                       engine=task.engine))
    return out


def current_placement(session: Session, job_id: int) -> dict[int, list[str]]:
    """Each rank's accelerators in its latest attempt."""
    placement: dict[int, tuple[int, list[str]]] = {}
    for task in session.scalars(select(Task).where(Task.job_id == job_id)):
        if task.rank not in placement or task.attempt >= placement[task.rank][0]:
            placement[task.rank] = (task.attempt, list(task.accelerators))
    return {rank: uuids for rank, (_, uuids) in placement.items()}


def describe_exit(exit_code: int | None, exit_signal: int | None, exception: str | None = None,
                  in_flight: int = 0, serving: bool = False) -> tuple[str, str]:
    """(reason label for metrics, sentence for people) of a task's end. A serving task that exits 0 with requests
    in flight has dropped them: an engine whose death exits 0 (vLLM #48966) lies too. With none in flight it
    has still stopped serving (`serving`: a replica ends only when it is stopped, and those exits are not
    judged)."""
    if exit_signal is not None:
        try:
            name = signal.Signals(exit_signal).name
        except ValueError:
            name = f"SIG{exit_signal}"
        return f"signal:{name}", f"killed by signal {exit_signal} ({name})"
    if exception and exit_code == 0:  # an exit that lies: the error the SDK saw is what it ended on
        return f"exit:0+exception:{exception}", f"exited with code 0 right after a {exception}: counted as a failure"
    if exception:
        return f"exception:{exception}", f"exited with code {exit_code} after an uncaught {exception}"
    if in_flight > 0 and exit_code == 0:
        return "exit:0+in_flight", f"exited with code 0 with {in_flight} request(s) in flight: counted as a failure"
    if serving and exit_code == 0:
        return "exit:0+serving", ("exited with code 0 though nothing stopped it: a serving replica that ends on its "
                                  "own has stopped serving, counted as a failure")
    if exit_code is None:
        return "lost", "process ended; exit status unknown"
    return f"exit:{exit_code}", f"exited with code {exit_code}"


def record_task_exit(session: Session, *, node_id: int, job_id: int | None, rank: int | None, pid: int,
                     exit_code: int | None, exit_signal: int | None, exception: str | None,
                     observed_at: datetime, in_flight: int = 0) -> tuple[Task, str] | None:
    """Close the running task behind `pid` on `node_id`; returns it with the failure reason ('' if it succeeded).
    `exception`: what the SDK said the process ended on (an uncaught exception, or a step that failed with none
    good after it); `in_flight`: the requests a serving task last said it had in flight. With either, exit 0 is
    a failure too."""
    query = select(Task).where(Task.node_id == node_id, Task.pid == pid, Task.state == "running")
    if job_id is not None:
        query = query.where(Task.job_id == job_id)
    if rank is not None:
        query = query.where(Task.rank == rank)
    task = session.scalars(query.order_by(Task.attempt.desc())).first()
    if task is None:
        return None
    job = session.scalar(select(Job).where(Job.id == task.job_id).with_for_update())  # the job first: get_job
    # a job its launcher stopped on purpose: its ranks' exits (SIGTERM, SIGKILL after the grace) are no failure
    ended = job is not None and job.state in FINISHED_STATES
    serving = job is not None and job.kind == "serving"
    failed = not ended and (exit_signal is not None or exit_code != 0 or bool(exception) or in_flight > 0
                                or serving)
    reason, sentence = describe_exit(exit_code, exit_signal, exception, in_flight, serving)
    if ended and job is not None:
        sentence += " (the job was cancelled)" if job.state == "cancelled" else " (the job had finished)"
    task.state = "failed" if failed else "exited"
    task.exit_code, task.exit_signal, task.ended_at = exit_code, exit_signal, observed_at
    task.failure_reason = reason if failed else ""
    if job is not None:
        job.updated_at = observed_at
        if failed and job.state == "running":
            job.state = "failed" if job.kind == "training" else job.state
    record_event(session, kind="task_failed" if failed else "task_exited", severity="critical" if failed else "info",
                 node_id=node_id, job_id=task.job_id, observed_at=observed_at,
                 message=f"job {task.job_id} rank {task.rank} (pid {pid}) {sentence}",
                 data={"rank": task.rank, "pid": pid, "exit_code": exit_code, "signal": exit_signal,
                       "reason": reason, "attempt": task.attempt, **({"in_flight": in_flight} if in_flight else {})})
    return task, reason if failed else ""
