"""A task registration and the ingest of two ranks' exits, at once on PostgreSQL, both commit.

CI saw the new leader answer a launcher's registration with 500 (tests/ha/test_failover_live.py): the ingest
of a report with both ranks' exits had closed rank 0's task and touched the job, the registration of the next
attempt's rank 1 had closed rank 1's old task and waited for the job, and the ingest then waited for rank 1's
task: PostgreSQL's deadlock detector killed one of them. A writer of a job's tasks now takes the job's row
first (sentinel/jobs/service.py:get_job). The interleaving is the one CI saw, held in place by the test: the
ingest's first exit is flushed before the registration starts, its second waits until the registration has
had time to take what it takes. SQLite writes one transaction at a time, so this is PostgreSQL's alone.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from sentinel.config import Settings
from sentinel.db import make_engine, make_sessionmaker, transaction
from sentinel.jobs import service
from sentinel.jobs.schemas import TaskCreate
from sentinel.nodes.models import Node
from tests.conftest import bearer
from tests.factories import registration

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]


def test_a_registration_beside_two_exits_in_one_report_both_commit(client: TestClient, settings: Settings,
                                                                   make_token: Any) -> None:
    launcher = bearer(make_token("launcher"))
    client.post("/api/v1/nodes/register", json=registration("node-a", accelerators=2),
                headers=bearer(make_token("agent"))).raise_for_status()
    job_id = client.post("/api/v1/jobs", json={"name": "j", "world_size": 2}, headers=launcher).json()["id"]
    for rank in (0, 1):
        client.post(f"/api/v1/jobs/{job_id}/tasks", headers=launcher, json={
            "rank": rank, "node": "node-a", "accelerators": [f"SIM-node-a-{rank}"], "pid": 100 + rank,
        }).raise_for_status()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        node_id = session.scalar(select(Node.id).where(Node.name == "node-a"))
    assert node_id is not None
    first_flushed = threading.Event()
    errors: list[BaseException] = []

    def register() -> None:
        first_flushed.wait(10)
        try:
            with transaction(sessions) as session:
                job = service.get_job(session, job_id, lock=True)
                service.register_task(session, job, TaskCreate(rank=1, node="node-a", accelerators=["SIM-node-a-1"],
                                                               pid=201, attempt=1), actor="launcher:test")
        except BaseException as exc:
            errors.append(exc)

    registering = threading.Thread(target=register)
    registering.start()
    now = datetime.now(UTC)
    try:
        with transaction(sessions) as session:
            for rank in (0, 1):
                service.record_task_exit(session, node_id=node_id, job_id=job_id, rank=rank, pid=100 + rank,
                                         exit_code=None, exit_signal=9, exception=None, observed_at=now)
                if rank == 0:
                    session.flush()
                    first_flushed.set()
                    time.sleep(1.0)  # the registration takes what it takes now
    except BaseException as exc:
        errors.append(exc)
    registering.join(30)
    engine.dispose()
    assert not errors, errors
    tasks = client.get(f"/api/v1/jobs/{job_id}", headers=launcher).json()["tasks"]
    assert sorted((t["rank"], t["attempt"], t["state"]) for t in tasks) == [
        (0, 0, "failed"), (1, 0, "failed"), (1, 1, "running")]  # the exit came first: rank 1's old task failed
