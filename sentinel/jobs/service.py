"""Jobs and their tasks (ranks placed on accelerators). Functions take a session and never commit."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.audit.service import record
from sentinel.db import utcnow
from sentinel.jobs.models import Job, Task
from sentinel.jobs.schemas import JobCreate, TaskCreate, TaskOut
from sentinel.nodes.models import Node
from sentinel.telemetry.schemas import Assignment


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


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
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
                                          "exit_code", "started_at", "ended_at")}


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
    task = Task(job_id=job.id, rank=spec.rank, attempt=spec.attempt, node_id=node.id,
                accelerators=list(spec.accelerators), pid=spec.pid, state="running")
    session.add(task)
    session.flush()
    placed = session.scalar(select(func.count()).select_from(Task).where(
        Task.job_id == job.id, Task.attempt == spec.attempt, Task.state == "running")) or 0
    if placed >= job.world_size and job.state == "pending":
        job.state = "running"
    job.updated_at = utcnow()
    record(session, actor=actor, action="task.register", subject=f"job/{job.id}/rank/{spec.rank}",
           detail={"node": spec.node, "accelerators": spec.accelerators, "attempt": spec.attempt})
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
            Assignment(job_id=task.job_id, rank=task.rank, pid=task.pid, accelerators=list(task.accelerators)))
    return out
