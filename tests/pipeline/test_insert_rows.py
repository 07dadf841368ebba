"""The writer's bulk insert (pipeline/writer.py: insert_rows) on both databases, schema by Alembic: COPY on
PostgreSQL for plain columns stores what an executemany stores (aware times as the same instant), a table
with JSON columns takes the executemany, and a duplicate fails the batch so the writer can isolate it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from sentinel.db import make_engine, upgrade
from sentinel.events.models import Event
from sentinel.nodes.models import Node
from sentinel.pipeline.writer import insert_rows
from sentinel.telemetry.models import ReportReceipt

RECEIPTS = cast(Table, ReportReceipt.__table__)
EVENTS = cast(Table, Event.__table__)


@pytest.fixture
def engine(database_url: str):  # type: ignore[no-untyped-def]
    upgrade(database_url)
    made = make_engine(database_url)
    with Session(made) as session, session.begin():
        session.add(Node(name="n1"))
    yield made
    made.dispose()


def node_id(engine: Any) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(Node.id).where(Node.name == "n1")) or 0)


def test_receipts_are_stored_as_written_and_aware_times_keep_their_instant(engine):
    nid = node_id(engine)
    east = timezone(timedelta(hours=5, minutes=30))
    at = datetime(2026, 12, 6, 8, 0, 0, 123456, tzinfo=east)
    rows = [{"node_id": nid, "seq": seq, "received_at": at, "accelerator_count": 8, "event_count": seq % 2}
            for seq in range(1, 41)]
    with engine.begin() as conn:
        insert_rows(conn, RECEIPTS, rows)
    with engine.connect() as conn:
        stored = conn.execute(select(RECEIPTS).order_by(RECEIPTS.c.seq)).mappings().all()
    assert [r["seq"] for r in stored] == list(range(1, 41))
    assert {r["received_at"] for r in stored} == {at.astimezone(UTC)}
    assert [r["event_count"] for r in stored] == [seq % 2 for seq in range(1, 41)]


def test_rows_with_json_take_the_executemany(engine):
    nid = node_id(engine)
    at = datetime.now(UTC)
    rows = [{"kind": "xid", "severity": "critical", "node_id": nid, "accelerator_uuid": None, "job_id": None,
             "message": f"m{i}", "data": {"seq": i, "xid": 79}, "observed_at": at, "recorded_at": at}
            for i in range(3)]
    with engine.begin() as conn:
        insert_rows(conn, EVENTS, rows)
    with engine.connect() as conn:
        assert [r.data for r in conn.execute(select(EVENTS.c.data).order_by(EVENTS.c.id))] == [
            {"seq": i, "xid": 79} for i in range(3)]


def test_a_duplicate_fails_the_whole_batch(engine):
    nid = node_id(engine)
    at = datetime.now(UTC)
    row = {"node_id": nid, "seq": 7, "received_at": at, "accelerator_count": 8, "event_count": 0}
    with engine.begin() as conn:
        insert_rows(conn, RECEIPTS, [row])
    with pytest.raises(Exception), engine.begin() as conn:  # noqa: B017 - IntegrityError or psycopg's own
        insert_rows(conn, RECEIPTS, [{**row, "seq": 8}, row])
    with engine.connect() as conn:
        assert [r.seq for r in conn.execute(select(RECEIPTS.c.seq))] == [7]
