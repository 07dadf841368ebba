"""The failover drill, with real processes on one PostgreSQL: two servers, three agents and a 2-rank gloo job
run by `sentinel launch`, every client given both servers' URLs.

A fault is handled by the leader (incident, page, quarantine, restart order); then the leader is killed
with SIGKILL. The standby must lead within 2× the lock-check interval, keep taking the agents' reports
(none lost: every node's seqs are stored without a gap), keep the incident, the page and the order
unduplicated, and handle a second fault itself, with the launcher following it.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.conftest import fresh_postgres_database
from tests.live import Cluster, LiveServer, Receiver, attempts, running, start_agent, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.postgres]

CHECK_SECONDS = 1.0
SECRET = "drill-secret"


def role(server: LiveServer) -> str | None:
    try:
        return str(httpx.get(server.url + "/readyz", timeout=0.5).json().get("role"))
    except (httpx.HTTPError, ValueError):
        return None


def receipts(database_url: str) -> dict[str, tuple[int, int, int]]:
    """node → (stored reports, lowest seq, highest seq)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT n.name, count(*), min(r.seq), max(r.seq) FROM report_receipts r "
                                     "JOIN nodes n ON n.id = r.node_id GROUP BY n.name")).all()
    finally:
        engine.dispose()
    return {name: (int(count), int(low), int(high)) for name, count, low, high in rows}


def inject_xid79(cluster: Cluster, api: httpx.Client, job_name: str, rank: int) -> tuple[str, str]:
    job = cluster.job(job_name)
    attempt = max(t["attempt"] for t in job["tasks"])
    victim = next(t for t in running(job, attempt) if t["rank"] == rank)
    uuid, node = victim["accelerators"][0], victim["node"]
    response = api.post(f"/nodes/{node}/inject", json={"accelerator_index": int(uuid.rsplit("-", 1)[1]),
                                                        "fault": "xid", "argument": 79})
    assert response.status_code == 202, response.text
    return uuid, node


@pytest.fixture
def database_url(postgres_admin: str) -> Iterator[str]:
    yield from fresh_postgres_database(postgres_admin)


def test_kill9_the_leader_and_the_standby_takes_over_without_losing_or_repeating(tmp_path, database_url):
    receiver = Receiver(SECRET)
    env = {"SENTINEL_LEADER_CHECK_SECONDS": str(CHECK_SECONDS), "SENTINEL_RESOLVE_AFTER_SECONDS": "600",
           "SENTINEL_RECEIVERS": json.dumps([{"name": "oncall", "kind": "webhook", "url": receiver.url,
                                               "secret": SECRET}])}
    leader = LiveServer(tmp_path / "a", database_url, {**env, "SENTINEL_SERVER_NAME": "a"}).start()
    standby = LiveServer(tmp_path / "b", database_url, {**env, "SENTINEL_SERVER_NAME": "b"}).start()
    shutil.copy(leader.data_dir / "admin-token", standby.data_dir / "admin-token")  # one database, one admin
    both = f"{leader.url},{standby.url}"
    cluster = Cluster.__new__(Cluster)  # the Cluster helpers, over these two servers
    cluster.work, cluster.server, cluster.procs, cluster.agents = tmp_path, leader, [], {}
    try:
        assert role(leader) == "leader" and role(standby) == "standby"
        # the standby serves reads and sends writes away
        admin = {"authorization": f"Bearer {leader.admin_token}"}
        assert httpx.get(standby.url + "/api/v1/nodes", headers=admin).status_code == 200
        refused = httpx.post(standby.url + "/api/v1/jobs", json={"name": "x", "world_size": 1}, headers=admin)
        assert refused.status_code == 503 and refused.headers["x-sentinel-role"] == "standby"
        metrics = httpx.get(standby.url + "/metrics", headers=admin).text
        assert "sentinel_server_leader 0.0" in metrics and "sentinel_nodes{" not in metrics

        for name in ("node-a", "node-b", "node-c"):
            agent_server = LiveServer.__new__(LiveServer)
            agent_server.url = both  # the agent's --server: both URLs
            cluster.agents[name] = start_agent(agent_server, leader.token("agent", name), name, tmp_path, 2)
            cluster.procs.append(cluster.agents[name])
        api = leader.api()
        cluster.api = api
        wait_for(lambda: len(api.get("/nodes").json()) == 3, timeout=60, what="three agents registered")
        launch = cluster.launch("llm", {"SENTINEL_SERVER": both})
        out = tmp_path / "job"
        wait_for(lambda: attempts(out).get(0) == {0, 1}, timeout=120, what="both ranks stepping")

        # fault 1, handled by the leader
        inject_xid79(cluster, api, "llm", rank=1)
        wait_for(lambda: attempts(out).get(1) == {0, 1}, timeout=120, what="attempt 1 stepping")
        [(_, page)] = wait_for(lambda: receiver.find("trigger", "hardware"), timeout=30, what="the page")
        # Delivery is at-least-once: a kill between the send and its commit would send it again.
        wait_for(lambda: [n["state"] for n in api.get(f"/incidents/{page['incident']['id']}").json()
                          ["notifications"]] == ["delivered"], timeout=10, what="the page recorded as delivered")

        # kill -9 the leader; the standby must lead within 2× the check interval
        leader.kill9()
        killed = time.monotonic()
        wait_for(lambda: role(standby) == "leader", timeout=30, interval=0.02, what="the standby leading")
        took = time.monotonic() - killed
        print(f"standby leads {took:.2f}s after kill -9 of the leader (check interval {CHECK_SECONDS}s)")
        assert took <= 2 * CHECK_SECONDS, f"took {took:.2f}s"

        api = standby.api()
        cluster.server, cluster.api = standby, api
        # the agents moved over: reports flow to the new leader and the nodes stay up
        before = {n["name"]: n["last_seq"] for n in api.get("/nodes").json()}
        wait_for(lambda: all(n["last_seq"] > before[n["name"]] + 3 and n["state"] != "down"
                             for n in api.get("/nodes").json() if n["name"] in before and n["state"] != "draining"),
                 timeout=30, what="reports reaching the new leader")

        # fault 2, handled by the new leader; the launcher follows it
        inject_xid79(cluster, api, "llm", rank=0)
        wait_for(lambda: attempts(out).get(2) == {0, 1}, timeout=120, what="attempt 2 stepping")
        wait_for(lambda: len(receiver.find("trigger", "hardware")) >= 2, timeout=30, what="the second page")
        time.sleep(3)  # room for a duplicate to show up

        incidents = api.get("/incidents", params={"state": "all"}).json()["incidents"]
        hardware = [i for i in incidents if i["detector"] == "hardware"]
        assert len(hardware) == 2, [i["title"] for i in incidents]
        assert len({i["fingerprint"] for i in incidents}) == len(incidents), "an incident was opened twice"
        pages = [p["incident"]["id"] for _, p in receiver.find("trigger", "hardware")]
        assert sorted(pages) == sorted(i["id"] for i in hardware), f"pages per incident: {pages}"
        assert receiver.bad_signatures == 0
        job = cluster.job("llm")
        orders = api.get(f"/jobs/{job['id']}/orders", params={"state": "all"}).json()
        assert [o["attempt"] for o in orders] == [1, 2], orders
        assert all(o["state"] == "done" for o in orders), orders

        # no report lost: stop the agents (they drain their spools), then every node's seqs have no gap
        for name, proc in cluster.agents.items():
            proc.send_signal(2)
            proc.wait(30)
            assert proc.returncode == 0, name
        stored = receipts(database_url)
        assert set(stored) == {"node-a", "node-b", "node-c"}
        for name, (count, low, high) in stored.items():
            assert count == high - low + 1 and low == 1, f"{name}: {count} reports stored for seqs {low}..{high}"
        assert launch.poll() is None, "the launcher kept running through the failover"
    except BaseException:
        print(cluster.logs())
        for server in (leader, standby):
            print(f"--- {server.log_path}\n{server.log_path.read_text()[-4000:]}")
        raise
    finally:
        cluster.close()
        leader.stop()
        standby.stop()


def test_a_leader_that_cannot_prove_its_lock_exits_at_once(tmp_path, database_url):
    """A partition or an operator killing the lock's session: another server may lead now, so this one
    stops acting (exits 75, for a supervisor to restart it as a standby) instead of leading beside it."""
    server = LiveServer(tmp_path / "a", database_url, {"SENTINEL_LEADER_CHECK_SECONDS": "0.5",
                                                       "SENTINEL_SERVER_NAME": "lonely"}).start()
    try:
        assert role(server) == "leader"
        engine = create_engine(database_url)
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'sentinel:lonely'"))
            conn.commit()
        engine.dispose()
        assert server.proc is not None
        assert server.proc.wait(10) == 75
        assert "lost the lead: server=lonely" in server.log_path.read_text()
    finally:
        server.stop()
