"""Shared fixtures: real databases (SQLite and PostgreSQL, schema by Alembic), the real app, a fake clock."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from sentinel.app import create_app
from sentinel.config import Settings

PG_ADMIN_URL = os.environ.get("SENTINEL_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


class FakeClock:
    """Test double for sentinel.clock.Clock: time moves only when the test says so."""

    def __init__(self, start: float | None = None):
        # starts at the real time: rows stamped by the database (created_at) stay comparable
        self.now = time.time() if start is None else start

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _postgres_available() -> str | None:
    try:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:
        return str(exc).splitlines()[0]


@pytest.fixture(scope="session")
def postgres_admin() -> str:
    problem = _postgres_available()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI and is not reachable: {problem}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {problem}")
    return PG_ADMIN_URL


def fresh_postgres_database(admin_url: str) -> Iterator[str]:
    name = f"sentinel_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each database test runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sentinel.db'}"
    else:
        yield from fresh_postgres_database(request.getfixturevalue("postgres_admin"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=database_url, max_body_bytes=64 * 1024)


@pytest.fixture
def client(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    app = create_app(settings, clock, run_scheduler=False)
    with TestClient(app) as test_client:
        yield test_client


def stop_app(client: TestClient) -> None:
    """Shut the app down (its lifespan ends) before a test starts another on the same database: on
    PostgreSQL a second server beside a live one is a standby by design (sentinel/ha/leader.py)."""
    client.__exit__(None, None, None)


@pytest.fixture
def admin_token(client: TestClient, settings: Settings) -> str:
    return settings.admin_token_file.read_text().strip()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def make_token(client: TestClient, admin_token: str):  # type: ignore[no-untyped-def]
    def make(role: str, name: str | None = None, **fields: object) -> str:
        # agent tokens here act for any node ("*"); tests/auth covers node binding and trust on first use
        body = {"name": name or f"{role}-{uuid.uuid4().hex[:6]}", "role": role,
                **({"node": "*"} if role == "agent" else {}), **fields}
        response = client.post("/api/v1/tokens", json=body, headers=bearer(admin_token))
        assert response.status_code == 201, response.text
        return str(response.json()["token"])

    return make
