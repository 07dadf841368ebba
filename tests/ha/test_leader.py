"""The Elector and a standby server on a real PostgreSQL, and clients failing over between real HTTP servers.

What every leader lock must do is tests/contracts/test_leader_lock_contract.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from sentinel.app import create_app
from sentinel.config import Settings
from sentinel.ha.failover import ROLE_HEADER, failover_client, parse_servers
from sentinel.ha.leader import Elector, PostgresLeader, lock_key
from tests.conftest import bearer, fresh_postgres_database
from tests.live import free_port


@pytest.fixture
def pg_url(postgres_admin: str) -> Iterator[str]:
    yield from fresh_postgres_database(postgres_admin)


def lock(url: str, name: str) -> PostgresLeader:
    return PostgresLeader(url, key=lock_key("test"), server_name=name)


@pytest.mark.postgres
def test_a_leader_whose_connection_is_killed_notices_and_a_standby_takes_over(pg_url):
    events: list[str] = []
    a = Elector(lock(pg_url, "a"), check_seconds=60, on_lead=lambda: events.append("a leads"),
                on_lost=lambda: events.append("a lost"), server_name="a")
    b = Elector(lock(pg_url, "b"), check_seconds=60, on_lead=lambda: events.append("b leads"),
                on_lost=lambda: events.append("b lost"), server_name="b")
    try:
        a.step()
        b.step()
        assert events == ["a leads"] and a.leading and not b.leading
        a.step()  # confirms; nothing changes
        assert events == ["a leads"]
        engine = create_engine(pg_url)
        with engine.connect() as conn:  # what a network partition or an operator's kill does to the session
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'sentinel:a'"))
            conn.commit()
        engine.dispose()
        for _ in range(100):  # the lock frees when the terminated backend has exited, a moment later
            b.step()
            if b.leading:
                break
            time.sleep(0.05)
        a.step()
        assert events == ["a leads", "b leads", "a lost"] and b.leading and not a.leading
    finally:
        a.stop()
        b.stop()


@pytest.mark.postgres
def test_a_second_app_on_the_same_postgres_stands_by_serves_reads_and_refuses_writes(tmp_path, pg_url):
    first = Settings(data_dir=tmp_path / "a", database_url=pg_url, leader_check_seconds=0.2)
    second = Settings(data_dir=tmp_path / "b", database_url=pg_url, leader_check_seconds=0.2)
    with TestClient(create_app(first, run_scheduler=False)) as a:
        token = first.admin_token_file.read_text().strip()
        with TestClient(create_app(second, run_scheduler=False)) as b:
            assert a.get("/readyz").json() == {"status": "ready", "role": "leader"}
            assert b.get("/readyz").json() == {"status": "ready", "role": "standby"}
            assert b.get("/api/v1/nodes", headers=bearer(token)).status_code == 200
            refused = b.post("/api/v1/jobs", json={"name": "j", "world_size": 1}, headers=bearer(token))
            assert refused.status_code == 503 and refused.headers[ROLE_HEADER] == "standby"
            assert refused.headers["retry-after"] == "1"
            assert "sentinel_server_leader 0.0" in b.get("/metrics", headers=bearer(token)).text
            assert a.post("/api/v1/jobs", json={"name": "j", "world_size": 1}, headers=bearer(token)).status_code == 201
            a.__exit__(None, None, None)  # the leader stops and frees the lock
            deadline = 50
            while b.get("/readyz").json()["role"] != "leader" and deadline:
                threading.Event().wait(0.1)
                deadline -= 1
            assert b.get("/readyz").json()["role"] == "leader"
            assert b.get("/api/v1/jobs", headers=bearer(token)).json()[0]["name"] == "j"
            assert b.post("/api/v1/jobs", json={"name": "k", "world_size": 1}, headers=bearer(token)).status_code == 201


# -- failover on the client side -------------------------------------------------------------------------


class Fake:
    """A real HTTP server answering as a leader (200 + what it got) or a standby (503 + role header)."""

    def __init__(self, standby: bool) -> None:
        self.standby = standby
        self.bodies: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.bodies.append(body)
                if outer.standby:
                    self.send_response(503)
                    self.send_header(ROLE_HEADER, "standby")
                    payload = b'{"detail": "standby"}'
                else:
                    self.send_response(200)
                    payload = json.dumps({"host": self.headers["Host"]}).encode()
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_servers_parse_from_a_comma_separated_list():
    assert parse_servers(" http://a:1/, http://b:2 ,") == ["http://a:1", "http://b:2"]
    assert parse_servers(None) == ["http://127.0.0.1:9480"]


def test_the_client_skips_a_dead_server_and_a_standby_and_sticks_to_the_leader():
    dead = f"http://127.0.0.1:{free_port()}"
    standby, leader = Fake(standby=True), Fake(standby=False)
    try:
        client = failover_client(f"{dead},{standby.url},{leader.url}", timeout=2.0)
        first = client.post("/api/v1/x", content=b"report-1")
        assert first.status_code == 200 and first.json()["host"] == leader.url.removeprefix("http://")
        assert standby.bodies == [b"report-1"] and leader.bodies == [b"report-1"]
        client.post("/api/v1/x", content=b"report-2")
        assert standby.bodies == [b"report-1"], "the client sticks to the server that answered"
        # the standby is promoted and the old leader goes away: the next request finds the new leader
        leader.close()
        standby.standby = False
        third = client.post("/api/v1/x", content=b"report-3")
        assert third.status_code == 200 and standby.bodies[-1] == b"report-3"
    finally:
        standby.close()


def test_with_only_standbys_the_client_gets_the_503_to_retry_later():
    only = Fake(standby=True)
    try:
        response = failover_client(only.url, timeout=2.0).post("/api/v1/x", content=b"r")
        assert response.status_code == 503
    finally:
        only.close()


def test_all_servers_away_raises_the_connection_error():
    client = failover_client(f"http://127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}", timeout=2.0)
    with pytest.raises(httpx.ConnectError):
        client.get("/healthz")
