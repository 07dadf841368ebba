"""A transaction PostgreSQL undid for a deadlock or a serialization failure is answered 503 with Retry-After,
which launchers and agents send again; any other database error stays a logged 500.

The errors are psycopg's own classes wrapped as SQLAlchemy wraps them, raised from a route of an app with
Sentinel's error handling installed: producing a real deadlock through the API is what
tests/jobs/test_task_locks.py does, and there the lock order now prevents it.
"""

from __future__ import annotations

import psycopg.errors
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from sentinel import errors


def app_raising(orig: Exception) -> TestClient:
    app = FastAPI()
    errors.install(app)

    @app.post("/write")
    def write() -> None:
        raise OperationalError("UPDATE jobs SET updated_at=now()", {}, orig)

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(("orig", "what"), [(psycopg.errors.DeadlockDetected("deadlock detected"), "a deadlock"),
                                            (psycopg.errors.SerializationFailure("could not serialize"),
                                             "a serialization failure")])
def test_an_undone_transaction_is_a_503_to_send_again(orig: Exception, what: str) -> None:
    response = app_raising(orig).post("/write")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert what in response.json()["detail"] and "send it again" in response.json()["detail"]


def test_another_database_error_is_still_a_500() -> None:
    response = app_raising(psycopg.errors.UndefinedTable("relation does not exist")).post("/write")
    assert response.status_code == 500 and response.json()["detail"] == "internal error; the server logged it"
