"""The Grafana dashboards in dashboards/grafana and the example Prometheus configuration.

Fast: every dashboard is valid JSON with a stable `sentinel-…` uid, the four template variables, and a
unit and thresholds on every panel; the provisioning files and the example Prometheus config are sound
(`promtool check config`).

Slow: a real Sentinel server, two agents with simulated accelerators, a two-rank training job and a
serving replica (plain Python processes using `sentinel.sdk`, no torch), a software crash, an injected
XID 79 (quarantine, drain, restart orders carried out by the test as the launcher), and a real Prometheus
scraping all of it with the example config's scrape jobs. Then every panel query of every dashboard, its
variables substituted as Grafana would, must return data through Prometheus's HTTP API, and
`promtool check metrics` must accept the server's and each agent's /metrics.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.collectors.rdma_tree import HW_COUNTERS, RdmaTree
from tests.live import LiveServer, Receiver, free_port, sentinel_cmd, wait_for

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "dashboards" / "grafana"
PROVISIONING = GRAFANA / "provisioning"
PROMETHEUS_DIR = ROOT / "dashboards" / "prometheus"
EXAMPLE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARDS = ("fleet-overview.json", "training-jobs.json", "incidents-recovery.json", "serving.json")
VARIABLES = {"datasource", "cell", "cluster", "node", "job"}
DATASOURCE_UID = "${datasource}"
INSTANT_PANELS = {"stat", "gauge", "bargauge", "table", "piechart"}
SECRET = "dashboards-secret"

# promtool's findings on the server's /metrics that are defects in sentinel/metrics.py, reported and not
# fixed here (this test owns only the dashboards). Each is tolerated exactly, and strictly: once one no
# longer appears, the test fails until it is deleted from this list.
KNOWN_LINT: set[tuple[str, str]] = set()  # promtool findings accepted for now: none

# What Grafana would put in place of its variables when the test asks Prometheus directly.
RATE_INTERVAL, RANGE = "10s", "1m"
_CLUSTER_MATCHER = re.compile(r'cluster\s*=~?\s*"\$(?:cluster|\{cluster\})"')
_CELL_MATCHER = re.compile(r'cell\s*=~\s*"\$(?:cell|\{cell\})"')  # docs/cells.md: a federated Prometheus
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_]\w*)\)$", re.DOTALL)


# -- reading the dashboards --------------------------------------------------------------------------------

def load(name: str) -> dict[str, Any]:
    return dict(json.loads((GRAFANA / name).read_text()))


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' collapsed panels included (rows themselves are not panels that show data)."""
    for panel in container.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board.get("templating", {}).get("list", [])}


def variable_query(var: dict[str, Any]) -> str:
    query = var.get("query")
    return str(query.get("query", "") if isinstance(query, dict) else query or var.get("definition", ""))


def substitute(text: str, *, job: str, node: str) -> str:
    """Grafana's interpolation, as far as these dashboards use it: All clusters is `.*` with `=~`."""
    text = _CLUSTER_MATCHER.sub('cluster=~".*"', text)
    for name, value in (("__rate_interval", RATE_INTERVAL), ("__interval", RATE_INTERVAL), ("__range", RANGE),
                        ("datasource", ""), ("cell", ".*"), ("cluster", ".*"), ("job", job), ("node", node)):
        text = text.replace("${" + name + "}", value)
        text = re.sub(r"\$" + re.escape(name) + r"\b", value, text)
    return text


# -- fast checks ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_valid_and_complete(name: str) -> None:
    board = load(name)
    problems: list[str] = []
    if board.get("id") is not None:
        problems.append('"id" must be null: Grafana assigns it on import')
    if not str(board.get("uid", "")).startswith("sentinel-") or len(board["uid"]) > 40:
        problems.append(f"uid {board.get('uid')!r} should be stable, start with sentinel- and fit Grafana's 40")
    if not 36 <= int(board.get("schemaVersion", 0)) <= 41:
        problems.append(f"schemaVersion {board.get('schemaVersion')} is not a current Grafana's (~39)")
    found = variables(board)
    if missing := VARIABLES - set(found):
        problems.append(f"template variables missing: {sorted(missing)}")
    else:
        ds = found["datasource"]
        if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            problems.append("the datasource variable must be of type datasource, query prometheus")
        cluster = found["cluster"]
        if (variable_query(cluster) != "label_values(up, cluster)" or not cluster.get("includeAll")
                or cluster.get("allValue") != ".*"):
            problems.append("cluster: label_values(up, cluster), includeAll, allValue .* (matches no label too)")
        for var, metric, label in (("node", "sentinel_accelerator_utilization_ratio", "node"),
                                   ("job", "sentinel_job_mfu_ratio", "job")):
            match = _LABEL_VALUES.match(variable_query(found[var]))
            if not match or not str(match["selector"]).startswith(metric) or match["label"] != label:
                problems.append(f"{var}: should be label_values({metric}…, {label})")
        for var in ("cluster", "node", "job"):
            if (found[var].get("datasource") or {}).get("uid") != DATASOURCE_UID:
                problems.append(f"variable {var} must query ${{datasource}}")
    ids: list[int] = []
    for panel in panels(board):
        title = panel.get("title") or f"panel {panel.get('id')}"
        ids.append(panel.get("id", -1))
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if not defaults.get("unit"):
            problems.append(f"{title}: no unit in fieldConfig.defaults")
        if not defaults.get("thresholds", {}).get("steps"):
            problems.append(f"{title}: no threshold steps in fieldConfig.defaults")
        grid = panel.get("gridPos", {})
        if not (grid.get("w", 0) > 0 and grid.get("h", 0) > 0 and grid.get("x", 0) + grid.get("w", 0) <= 24):
            problems.append(f"{title}: gridPos {grid} does not fit the 24-column grid")
        if panel.get("type") == "text":
            continue
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"{title}: a {panel.get('type')} panel without queries")
        if (panel.get("datasource") or {}).get("uid") != DATASOURCE_UID:
            problems.append(f"{title}: panel datasource must be ${{datasource}}")
        refs = [t.get("refId") for t in targets]
        if len(refs) != len(set(refs)):
            problems.append(f"{title}: duplicate refIds {refs}")
        for target in targets:
            if (target.get("datasource") or {}).get("uid") != DATASOURCE_UID:
                problems.append(f"{title} {target.get('refId')}: target datasource must be ${{datasource}}")
            expr = str(target.get("expr", "")).strip()
            if not expr:
                problems.append(f"{title} {target.get('refId')}: empty expr")
            elif "$" in substitute(expr, job="1", node="n"):
                problems.append(f"{title} {target.get('refId')}: uses a variable this dashboard set does not "
                                f"know: {expr}")
            elif "sentinel_" in expr and not _CLUSTER_MATCHER.search(expr):
                problems.append(f"{title} {target.get('refId')}: does not filter on $cluster: {expr}")
            elif "sentinel_" in expr and not _CELL_MATCHER.search(expr):
                problems.append(f"{title} {target.get('refId')}: does not filter on $cell: {expr}")
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids are not unique: {ids}")
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_dashboard_uids_and_titles_are_unique() -> None:
    boards = [load(name) for name in DASHBOARDS]
    uids = [b["uid"] for b in boards]
    titles = [b["title"] for b in boards]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles), (uids, titles)
    assert sorted(p.name for p in GRAFANA.glob("*.json")) == sorted(DASHBOARDS), "a dashboard this test misses"


def test_grafana_provisioning() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "sentinel.yml").read_text())
    assert datasources["apiVersion"] == 1
    [source] = datasources["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["url"].startswith("http")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "sentinel.yml").read_text())
    assert providers["apiVersion"] == 1
    [provider] = providers["providers"]
    assert provider["type"] == "file" and provider["folder"] == "Sentinel" and provider["options"]["path"]


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not on PATH; CI must install it (apt-get install prometheus)")
        pytest.skip(f"{binary} is not on PATH (apt-get install prometheus)")
    return path


def test_example_prometheus_config(tmp_path: Path) -> None:
    """Structure, then `promtool check config` on a copy that has the token file it names next to it."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    server, agents = jobs["sentinel-server"], jobs["sentinel-agents"]
    assert server["honor_labels"] is True, "sentinel_job_* must keep their own job label"
    assert server["authorization"]["credentials_file"], "the server's /metrics needs a viewer token"
    [sd] = agents["file_sd_configs"]
    assert sd["files"] == ["agents.example.json"]
    agent_groups = json.loads((PROMETHEUS_DIR / "agents.example.json").read_text())
    assert all(g["targets"] and g["labels"].get("cluster") for g in agent_groups)
    assert config["rule_files"] == ["sentinel-rules.yml"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]

    promtool = require("promtool")
    for name in ("prometheus.yml", "agents.example.json", "sentinel-rules.yml"):
        shutil.copy(PROMETHEUS_DIR / name, tmp_path / name)
    (tmp_path / server["authorization"]["credentials_file"]).write_text("a-viewer-token\n")
    result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"promtool check config failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


# -- the live run --------------------------------------------------------------------------------------------

# A rank or replica: steps with a timed collective inside, checkpointing a small state every 10 steps,
# until its crash file appears (then it dies of an uncaught exception, as a process does on a CUDA error
# after its GPU fell off the bus).
WORKER = """
import os, time
import numpy as np
import sentinel.sdk
from sentinel.sdk.checkpoint import CheckpointManager

tel = sentinel.sdk.init()
tel.set_model(flops_per_token=2e6)
ckpt = CheckpointManager(every=10)
weights = np.zeros(1 << 16, dtype=np.float32)
crash = os.environ["CRASH_FILE"]
requests = tel.serving(replica="d0", stage="decode") if os.environ.get("SENTINEL_KIND") == "serving" else None
step = 0
while True:
    if os.path.exists(crash):
        raise RuntimeError("CUDA error: unspecified launch failure (the test's crash file)")
    with tel.step(tokens=512):
        time.sleep(0.03)
        with tel.collective("all_reduce", nbytes=1 << 20):
            time.sleep(0.01)
    if requests is not None:  # a serving replica: a request per batch, one in five with an empty answer
        req = requests.start(prompt_tokens=64)
        req.kv_transfer(0.002, 1 << 20)
        if step % 5:
            time.sleep(0.005)
            req.token()
            req.token(3)
        requests.finish(req)
    step += 1
    weights[step % weights.size] += 1.0
    ckpt.save(step, {"weights": weights})
"""


class Launcher:
    """The test as a job launcher: registers jobs and tasks over REST, starts ranks, carries out orders."""

    def __init__(self, server: LiveServer, token: str, work: Path, agent_urls: dict[str, str]):
        self.api = httpx.Client(base_url=server.url + "/api/v1", headers={"authorization": f"Bearer {token}"},
                                timeout=30)
        self.work = work
        self.agent_urls = agent_urls
        self.server_url, self.token = server.url, token
        self.ranks: dict[tuple[int, int], tuple[int, subprocess.Popen[bytes]]] = {}  # (job, rank) → (attempt, proc)
        self.stopped: list[subprocess.Popen[bytes]] = []
        self.kinds: dict[int, str] = {}

    def create(self, name: str, kind: str, placement: dict[int, tuple[str, str]]) -> int:
        slo = {"slo": {"ttft_seconds": 1.0, "tpot_seconds": 0.5}} if kind == "serving" else {}
        response = self.api.post("/jobs", json={"name": name, "kind": kind, "world_size": len(placement),
                                                "attributes": slo})
        assert response.status_code == 201, response.text
        job_id = int(response.json()["id"])
        self.kinds[job_id] = kind
        for rank, (node, uuid) in placement.items():
            self.start(job_id, rank, 0, node, uuid)
        return job_id

    def crash_file(self, job_id: int, rank: int, attempt: int) -> Path:
        return self.work / f"crash-{job_id}-{rank}-{attempt}"

    def start(self, job_id: int, rank: int, attempt: int, node: str, uuid: str) -> None:
        env = {**os.environ, "SENTINEL_JOB_ID": str(job_id), "SENTINEL_RANK": str(rank),
               "SENTINEL_SERVER": self.server_url, "SENTINEL_TOKEN": self.token, "SENTINEL_NODE": node,
               "SENTINEL_CHECKPOINT_LOCAL_DIR": str(self.work / "checkpoints" / "{node}"),
               "SENTINEL_ATTEMPT": str(attempt), "SENTINEL_AGENT_URL": self.agent_urls[node],
               "CRASH_FILE": str(self.crash_file(job_id, rank, attempt)), "SENTINEL_KIND": self.kinds[job_id]}
        log = open(self.work / f"job-{job_id}-rank-{rank}-attempt-{attempt}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=ROOT, stdout=log, stderr=log,
                                start_new_session=True)
        previous = self.ranks.get((job_id, rank))
        if previous is not None:
            self.stopped.append(previous[1])
        self.ranks[(job_id, rank)] = (attempt, proc)
        response = self.api.post(f"/jobs/{job_id}/tasks", json={"rank": rank, "node": node, "accelerators": [uuid],
                                                                 "pid": proc.pid, "attempt": attempt})
        assert response.status_code == 201, response.text

    def crash(self, job_id: int, rank: int) -> None:
        attempt, _ = self.ranks[(job_id, rank)]
        self.crash_file(job_id, rank, attempt).touch()
        wait_for(lambda: self.task_state(job_id, rank, attempt) == "failed", timeout=20,
                 what=f"job {job_id} rank {rank} recorded as failed")

    def task_state(self, job_id: int, rank: int, attempt: int) -> str | None:
        for task in self.api.get(f"/jobs/{job_id}").json()["tasks"]:
            if task["rank"] == rank and task["attempt"] == attempt:
                return str(task["state"])
        return None

    def pending_order(self, job_id: int) -> dict[str, Any]:
        def newest() -> dict[str, Any] | None:
            orders = self.api.get(f"/jobs/{job_id}/orders", params={"wait": 5}).json()
            return max(orders, key=lambda o: o["attempt"]) if orders else None

        return dict(wait_for(newest, timeout=30, interval=0.2, what=f"an order for job {job_id}"))

    def carry_out(self, order: dict[str, Any]) -> None:
        """Like `sentinel launch`: acknowledge, start the new attempt where the order says, stop the old
        ranks (a serving replica's replacement starts before the old one stops), report done."""
        job_id = order["job_id"]
        assert self.api.post(f"/orders/{order['id']}/ack", json={"status": "acknowledged"}).status_code == 200
        for slot in order["placement"]:
            [uuid] = slot["accelerators"]
            self.start(job_id, slot["rank"], order["attempt"], slot["node"], uuid)
        for proc in self.stopped:
            stop(proc)
        self.stopped.clear()
        assert self.api.post(f"/orders/{order['id']}/ack", json={"status": "done"}).status_code == 200

    def completed(self, order: dict[str, Any]) -> bool:
        orders = self.api.get(f"/jobs/{order['job_id']}/orders", params={"state": "all"}).json()
        return any(o["id"] == order["id"] and o["completed_at"] is not None for o in orders)

    def close(self) -> None:
        for _, proc in self.ranks.values():
            stop(proc)
        for proc in self.stopped:
            stop(proc)
        self.api.close()


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def start_agent(server: LiveServer, token: str, name: str, count: int, port: int,
                work: Path) -> subprocess.Popen[bytes]:
    """A sim agent that also reports an RDMA port (a fixture sysfs tree, tests/collectors/rdma_tree.py) and takes
    part in the probe mesh on loopback, so the network panels have data."""
    log = open(work / f"agent-{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    tree = RdmaTree(work / f"sys-{name}")
    tree.add_port("mlx5_0", 1, hw_counters=dict(HW_COUNTERS))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        probe_port = udp.getsockname()[1]
    return subprocess.Popen(sentinel_cmd("collector", "--server", server.url, "--token", token, "--node-name", name,
                                         "--source", f"sim:{count}", "--source", "rdma", "--sysfs-root",
                                         str(tree.root), "--probe", f"127.0.0.1:{probe_port}", "--probe-interval",
                                         "0.5", "--interval", "1", "--listen",
                                         f"127.0.0.1:{port}", "--state-dir", str(work / "agents")),
                            env={**os.environ}, stdout=log, stderr=log, start_new_session=True)


class Prometheus:
    """A real Prometheus with the example config's scrape jobs, pointed at this test's processes."""

    def __init__(self, binary: str, work: Path, server: LiveServer, agent_ports: list[int]):
        self.binary, self.work = binary, work
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        config.pop("alerting", None)
        config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
        jobs = {c["job_name"]: c for c in config["scrape_configs"]}
        for job in jobs.values():
            job.pop("scrape_interval", None)
            job.pop("scrape_timeout", None)
        jobs["sentinel-server"]["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"],
                                                      "labels": {"cluster": "test"}}]
        jobs["sentinel-server"]["authorization"]["credentials_file"] = str(server.data_dir / "admin-token")
        agents_file = work / "agents.json"
        agents_file.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in agent_ports],
                                            "labels": {"cluster": "test"}}]))
        jobs["sentinel-agents"]["file_sd_configs"] = [{"files": [str(agents_file)], "refresh_interval": "1s"}]
        self.config = work / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def start(self) -> Prometheus:
        log = open(self.work / "prometheus.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen([self.binary, f"--config.file={self.config}",
                                      f"--web.listen-address=127.0.0.1:{self.port}",
                                      f"--storage.tsdb.path={self.work / 'tsdb'}", "--log.level=warn"],
                                     stdout=log, stderr=log, start_new_session=True)
        self.started_at = time.time()

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (self.work / "prometheus.log").read_text()
            try:
                return self.http.get("/-/ready").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=30, what="Prometheus ready")
        return self

    def query(self, expr: str, *, instant: bool) -> list[dict[str, Any]]:
        now = time.time()
        if instant:
            response = self.http.post("/api/v1/query", data={"query": expr, "time": f"{now:.3f}"})
        else:  # what a time series panel asks for: the whole time range
            response = self.http.post("/api/v1/query_range", data={"query": expr, "start": f"{self.started_at:.3f}",
                                                                   "end": f"{now:.3f}", "step": "1"})
        body = response.json()
        assert body.get("status") == "success", f"{expr}\n{body}"
        return list(body["data"]["result"])

    def label_values(self, query: str) -> list[str]:
        match = _LABEL_VALUES.match(query.strip())
        assert match, f"not a label_values() query: {query}"
        params: dict[str, Any] = {"start": f"{self.started_at:.3f}", "end": f"{time.time():.3f}"}
        if match["selector"]:
            params["match[]"] = match["selector"]
        return list(self.http.get(f"/api/v1/label/{match['label']}/values", params=params).json()["data"])

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, signal.SIGTERM)
        self.http.close()


def is_instant(panel: dict[str, Any], target: dict[str, Any]) -> bool:
    """Grafana asks for one instant where the panel shows one value, else for the dashboard's time range."""
    return panel.get("type") in INSTANT_PANELS or (bool(target.get("instant")) and not target.get("range"))


def has_data(result: list[dict[str, Any]]) -> bool:
    """At least one sample that is a number (a NaN quantile of nothing is no data to a person either)."""
    for series in result:
        values = series.get("values") or ([series["value"]] if "value" in series else [])
        if any(not math.isnan(float(v)) for _, v in values):
            return True
    return False


def promtool_check_metrics(promtool: str, text: str) -> list[str]:
    """promtool's findings on an exposition; none when it exits 0 (lint output alone is then allowed)."""
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    if result.returncode == 0:
        return []
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()] or [
        f"promtool exited {result.returncode} without saying why"]


@pytest.mark.slow
def test_every_dashboard_query_returns_data(tmp_path: Path) -> None:
    prometheus_bin, promtool = require("prometheus"), require("promtool")
    receiver = Receiver(SECRET)
    receivers = [{"name": "oncall", "kind": "webhook", "url": receiver.url, "secret": SECRET}]
    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server' / 'sentinel.db'}",
                        {"SENTINEL_RECEIVERS": json.dumps(receivers), "SENTINEL_RESOLVE_AFTER_SECONDS": "1"})
    agents: dict[str, subprocess.Popen[bytes]] = {}
    ports = {"node-a": free_port(), "node-b": free_port()}
    prometheus: Prometheus | None = None
    launcher: Launcher | None = None
    try:
        server.start()
        token = server.token("agent", "agents")
        for name, count in (("node-a", 2), ("node-b", 3)):  # node-b has room for what node-a's drain moves
            agents[name] = start_agent(server, token, name, count, ports[name], tmp_path)
        api = server.api()
        wait_for(lambda: all(api.get(f"/nodes/{n}").status_code == 200 for n in agents), timeout=60,
                 what="both agents registered")
        prometheus = Prometheus(prometheus_bin, tmp_path, server, list(ports.values())).start()

        launcher = Launcher(server, server.token("launcher", "dashboards"), tmp_path,
                            {name: f"http://127.0.0.1:{port}" for name, port in ports.items()})
        train = launcher.create("llm-pretrain", "training", {0: ("node-a", "SIM-node-a-0"),
                                                              1: ("node-b", "SIM-node-b-0")})
        serve = launcher.create("chat-serving", "serving", {0: ("node-a", "SIM-node-a-1")})

        def signals() -> bool:
            t = api.get(f"/jobs/{train}/metrics").json()
            s = api.get(f"/jobs/{serve}/metrics").json()
            return t["mfu_ratio"] is not None and len(t["ranks"]) == 2 and s["tokens_per_second"] is not None

        wait_for(signals, timeout=30, what="both jobs' signals on the server")

        # A software failure: the serving replica dies of an exception; Sentinel orders its replacement.
        launcher.crash(serve, 0)
        replaced = launcher.pending_order(serve)
        launcher.carry_out(replaced)
        wait_for(lambda: launcher is not None and launcher.completed(replaced), timeout=30,
                 what="the serving job stepping again")

        # A hardware fault: XID 79 under training rank 0. Sentinel quarantines and drains node-a and orders
        # both jobs off it; the rank on the fallen accelerator dies of its CUDA error.
        response = api.post("/nodes/node-a/inject", json={"accelerator_index": 0, "fault": "xid", "argument": 79})
        assert response.status_code == 202, response.text
        restart = launcher.pending_order(train)
        launcher.crash(train, 0)
        move = launcher.pending_order(serve)
        assert move["id"] != replaced["id"]
        launcher.carry_out(restart)
        launcher.carry_out(move)
        wait_for(lambda: launcher is not None and launcher.completed(restart) and launcher.completed(move),
                 timeout=30, what="both jobs stepping again after the XID")

        # What promtool says about each exposition, now that every family has samples (asserted at the end).
        lint = {"server": promtool_check_metrics(promtool, api.get(server.url + "/metrics").text)}
        for name, port in ports.items():
            lint[f"agent {name}"] = promtool_check_metrics(
                promtool, httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)

        boards = {name: load(name) for name in DASHBOARDS}
        job, node = str(train), "node-a"
        queries = [(name, panel.get("title", ""), target.get("refId", ""),
                    substitute(str(target["expr"]), job=job, node=node), is_instant(panel, target))
                   for name, board in boards.items() for panel in panels(board) for target in panel.get("targets", [])]
        assert len(queries) > 40

        # Poll (bounded) until Prometheus has scraped what the last steps produced.
        deadline = time.monotonic() + 60
        while True:
            empty = [q for q in queries if not has_data(prometheus.query(q[3], instant=q[4]))]
            if not empty or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert not empty, "dashboard queries that returned no data:\n" + "\n".join(
            f"- {name} / {title} [{ref}]: {expr}" for name, title, ref, expr, _ in empty)

        # The variables' own queries offer the values used above.
        for name, board in boards.items():
            for var in ("cluster", "node", "job"):
                query = substitute(variable_query(variables(board)[var]), job=job, node=node)
                values = prometheus.label_values(query)
                expected = {"cluster": "test", "node": node, "job": job}[var]
                assert expected in values, f"{name}: variable {var} ({query}) offers {values}"

        found = {(what, line) for what, lines in lint.items() for line in lines}
        assert not found - KNOWN_LINT, "promtool check metrics failed:\n" + "\n".join(
            f"- {what}: {line}" for what, line in sorted(found - KNOWN_LINT))
        assert not KNOWN_LINT - found, f"fixed, delete from KNOWN_LINT: {sorted(KNOWN_LINT - found)}"
    except BaseException:
        logs = [*sorted(tmp_path.glob("*.log")), server.log_path]
        print("\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists()))
        raise
    finally:
        if launcher is not None:
            launcher.close()
        if prometheus is not None:
            prometheus.stop()
        for proc in agents.values():
            stop(proc, signal.SIGTERM)
        server.stop()
        receiver.server.shutdown()
