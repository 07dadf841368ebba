"""Real processes end to end: a server, two agents with simulated accelerators, and a 2-rank gloo DDP job
run by `sentinel launch`. An XID 79, or a hang, on a rank's accelerator gets it quarantined and the job
restarted on the spare, stepping again; the incident holds the timeline. A partition trips the breaker.

SQLite only: these start a dozen processes each; the SQL they exercise is covered on both databases
by the API tests.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from tests.live import Cluster, Receiver, attempts, running, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch]
@pytest.mark.parametrize("fault", ["xid", "hang"])
def test_a_faulty_accelerator_is_quarantined_and_the_job_steps_again_on_the_spare(tmp_path, fault):
    cluster = Cluster(tmp_path, {"SENTINEL_HANG_MIN_SECONDS": "3"})
    try:
        cluster.launch("llm")
        out = tmp_path / "job"
        wait_for(lambda: attempts(out).get(0) == {0, 1}, timeout=120, what="both ranks stepping")
        job = cluster.job("llm")
        victim = next(t for t in running(job, 0) if t["rank"] == 1)
        uuid, node = victim["accelerators"][0], victim["node"]
        index = int(uuid.rsplit("-", 1)[1])
        argument = 79 if fault == "xid" else None
        assert cluster.api.post(f"/nodes/{node}/inject", json={"accelerator_index": index, "fault": fault,
                                                                "argument": argument}).status_code == 202
        injected = time.time()
        wait_for(lambda: max(attempts(out)) >= 1 and attempts(out)[max(attempts(out))] == {0, 1}, timeout=120,
                 what="both ranks stepping in a new attempt")
        stepping_again = time.time() - injected

        acc = next(a for a in cluster.api.get("/accelerators").json() if a["uuid"] == uuid)
        assert acc["health"] == "quarantined"
        job = cluster.job("llm")
        latest = max(t["attempt"] for t in job["tasks"])
        placed = running(job, latest)
        assert all(uuid not in t["accelerators"] for t in placed), "nothing runs on the quarantined accelerator"
        incidents = cluster.api.get("/incidents", params={"state": "all"}).json()["incidents"]
        detector = "hardware" if fault == "xid" else "hang"
        incident = next(i for i in incidents if i["detector"] == detector)
        timeline = [a["text"] for a in cluster.api.get(f"/incidents/{incident['id']}").json()["actions"]]
        text = "\n".join(timeline)
        assert "quarantined accelerator" in text and "order " in text, text
        if fault == "xid":
            assert f"drained node {node}" in text and all(t["node"] != node for t in placed)
            nodes = {n["name"]: n["state"] for n in cluster.api.get("/nodes").json()}
            assert nodes[node] == "draining"
        wait_for(lambda: "stepping again" in json.dumps(cluster.api.get(f"/incidents/{incident['id']}").json()),
                 timeout=30, what="the recovery on the incident's timeline")
        orders = cluster.api.get(f"/jobs/{job['id']}/orders", params={"state": "all"}).json()
        assert orders[-1]["state"] == "done" and orders[-1]["completed_at"] is not None
        print(f"{fault}: stepping again {stepping_again:.1f}s after the injection")
        assert stepping_again < 60
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.close()


def test_a_partition_trips_the_breaker_and_pages_once(tmp_path):
    receiver = Receiver("secret")
    receivers = [{"name": "oncall", "kind": "webhook", "url": receiver.url, "secret": "secret"}]
    nodes = {f"node-{i}": 1 for i in range(6)}
    cluster = Cluster(tmp_path, {"SENTINEL_RECEIVERS": json.dumps(receivers), "SENTINEL_BREAKER_MIN_ACCELERATORS": "1"},
                      nodes)
    try:
        silenced = ["node-0", "node-1", "node-2"]
        for name in silenced:
            os.killpg(cluster.agents[name].pid, signal.SIGKILL)
        wait_for(lambda: cluster.api.get("/breaker").json()["open"], timeout=30, what="the breaker to trip")
        breaker = cluster.api.get("/breaker").json()
        assert "would be out of service" in breaker["reason"]

        def critical() -> list[dict[str, Any]]:
            return [p for _, p in receiver.find("trigger", "heartbeat") if p["incident"]["severity"] == "critical"]

        wait_for(critical, timeout=30, what="the fleet-wide page")
        time.sleep(3)  # anything else that was going to page has had time to
        pages = critical()
        assert len(pages) == 1 and pages[0]["incident"]["node"] is None, [p["incident"]["title"]
                                                                                 for _, p in receiver.pages]
        accelerators = cluster.api.get("/accelerators").json()
        assert all(a["health"] == "healthy" for a in accelerators), "nothing is quarantined"
        states = {n["name"]: n["state"] for n in cluster.api.get("/nodes").json()}
        assert all(states[n] == "down" for n in silenced) and "draining" not in states.values()
        metrics = cluster.api.get(cluster.server.url + "/metrics").text
        assert "sentinel_breaker_open 1.0" in metrics

        reset = cluster.api.post("/breaker/reset", json={"reason": "switch replaced"})
        assert reset.status_code == 200 and reset.json()["open"] is False
    finally:
        cluster.close()
        receiver.server.shutdown()
