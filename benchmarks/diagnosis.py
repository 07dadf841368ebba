"""Slowdown attribution on a real job: does Sentinel name the layer a slowdown comes from, propose the experiment
that confirms it, and how fast? (issue 17; docs/diagnosis.md quotes it)

Setup (root, network namespaces; tests/network/netlab.py): two nodes, each a namespace with its own agent (sim:1
accelerator, probe address) and one rank of a 2-rank DDP job over gloo (benchmarks/diagnosis_job.py), the rank
pinned to its own CPU; the server in the root namespace on the lab's bridge. One cause is injected per run, on
rank 1's node unless said otherwise, each a real one the job's own timings show:

| scenario         | what is done                                                                  | right layer     |
| ---------------- | ----------------------------------------------------------------------------- | --------------- |
| `slow_loader`    | rank 1's DataLoader worker does 40× the work per batch                        | input_pipeline  |
| `cpu_contention` | a busy process pinned to rank 1's CPU                                         | host            |
| `throttled`      | `sentinel inject slow 2.5` on rank 1's sim accelerator: SIGSTOP duty cycle     | hardware        |
| `slow_path`      | a token-bucket rate limit (tc tbf) on node 1's link, both directions           | interconnect    |
| `checkpoint_io`  | three `dd oflag=direct` writers in the checkpoint directory (its disk)         | checkpoint_io   |
| `straggler`      | rank 1 does extra matrix products inside its step                             | compute         |
| `control`        | nothing, with noise: a short unpinned CPU burst every few seconds            | (no diagnosis)  |

Per run: a fresh job, its baseline learnt (the slowdown detector at warmup 8 s, baseline 12 s, recent 8 s,
persist 3 s — shorter than the shipped 10/20/10/4 so that a run takes ~45 s), the cause injected, the diagnosis
polled until it appears (at most 60 s), then its proposed experiment run through the REST API. Reported per
scenario: the layer named (right in how many runs), the experiment proposed (the confirming one first?),
whether running it confirmed the cause, and the time from the onset to the diagnosis (median, range).
The baseline in the same runs: the layer the existing `mfu_drop` rule would name from the same before/after
numbers (all-reduce share rose → interconnect, throttling → hardware, else compute).

    sudo PYTHONPATH=. .venv/bin/python benchmarks/diagnosis.py [--runs 10] [--scenarios a,b] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from support import REPO, BenchError, load, machine, say

sys.path.insert(0, str(REPO))

EXPECTED = {"slow_loader": ("input_pipeline", "data_loader"), "cpu_contention": ("host", "cpu"),
            "throttled": ("hardware", "gemm"), "slow_path": ("interconnect", "collective"),
            "checkpoint_io": ("checkpoint_io", "disk_write"), "straggler": ("compute", "rank_compare"),
            "control": (None, None)}
OPTIONS = {"slowdown": {"warmup_seconds": 8, "baseline_seconds": 12, "recent_seconds": 8, "persist_seconds": 3}}
BURN = "import time\nwhile True:\n    pass\n"
NOISE = "import time\nwhile True:\n    t = time.time() + 0.15\n    while time.time() < t: pass\n    time.sleep(3)\n"


class Bench:
    def __init__(self, work: Path):
        from tests.live import LiveServer
        from tests.network.netlab import Lab

        self.work = work
        self.lab = Lab(2)
        env = {"SENTINEL_REMEDIATION_DRY_RUN": "true", "SENTINEL_DETECTION_INTERVAL_SECONDS": "1",
               "SENTINEL_DETECTOR_OPTIONS": json.dumps(OPTIONS), "SENTINEL_PROBE_ROUND_SECONDS": "2"}
        self.server = LiveServer(work / "server", f"sqlite:///{work / 'server.db'}", env, host=self.lab.gateway).start()
        self.http = httpx.Client(base_url=self.server.url + "/api/v1", timeout=30,
                                 headers={"authorization": f"Bearer {self.server.admin_token}"})
        agent = self.server.token("agent", "bench")
        self.agents = [self._agent(i, agent) for i in range(2)]
        self.extra: list[subprocess.Popen[bytes]] = []
        deadline = time.monotonic() + 60
        while len([n for n in self.http.get("/nodes").json() if n["state"] == "active"]) < 2:
            if time.monotonic() > deadline:
                raise BenchError("the two agents did not register")
            time.sleep(0.5)

    def _agent(self, i: int, token: str) -> subprocess.Popen[bytes]:
        log = open(self.work / f"agent-n{i}.log", "ab")  # noqa: SIM115 - the child keeps it
        argv = [sys.executable, "-m", "sentinel.cli", "collector", "--server", self.server.url, "--token", token,
                "--node-name", f"n{i}", "--source", "sim:1", "--source", "host", "--interval", "1",
                "--probe", f"{self.lab.hosts[i].address}:9482", "--state-dir", str(self.work / f"agent-n{i}")]
        return self.lab.popen(i, argv, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log, stderr=log)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        answer = self.http.request(method, path, json=body)
        if answer.status_code >= 300:
            raise BenchError(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
        return answer.json()

    def start_job(self, name: str, control: Path) -> tuple[int, list[subprocess.Popen[bytes]]]:
        ckpt = self.work / "ckpt"
        ckpt.mkdir(exist_ok=True)
        job = self.api("POST", "/jobs", {"name": name, "world_size": 2, "attributes": {"checkpoint_dir": str(ckpt)}})
        port = 29000 + job["id"] % 1000
        ranks = []
        for rank in range(2):
            env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(rank), "WORLD_SIZE": "2",
                   "MASTER_ADDR": self.lab.hosts[0].address, "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "eth0",
                   "SENTINEL_JOB_ID": str(job["id"]), "SENTINEL_RANK": str(rank), "PIN_CPU": str(rank),
                   "CONTROL_DIR": str(control), "CKPT_DIR": str(ckpt)}
            log = open(self.work / f"job{job['id']}-rank{rank}.log", "ab")  # noqa: SIM115
            proc = self.lab.popen(rank, [sys.executable, str(REPO / "benchmarks" / "diagnosis_job.py")], env=env,
                                  stdout=log, stderr=log)
            ranks.append(proc)
            self.api("POST", f"/jobs/{job['id']}/tasks", {"rank": rank, "node": f"n{rank}",
                                                           "accelerators": [f"SIM-n{rank}-0"], "pid": proc.pid})
        return int(job["id"]), ranks

    def wait_healthy(self, job: int, ranks: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in ranks):
                raise BenchError(f"job {job}: a rank exited (see {self.work}/job{job}-rank*.log)")
            if self.api("GET", f"/jobs/{job}/diagnosis")["state"] == "healthy":
                calibrations = [e for e in self.api("GET", f"/jobs/{job}/experiments") if e["calibration"]]
                if calibrations and all(e["state"] != "pending" for e in calibrations):
                    return
            time.sleep(0.5)
        raise BenchError(f"job {job}: no baseline within {timeout:.0f} s")

    def inject(self, scenario: str, control: Path) -> None:
        host1 = self.lab.hosts[1]
        if scenario == "slow_loader":
            (control / "loader_cost.1").write_text("40")
        elif scenario == "straggler":
            (control / "straggle.1").write_text("60")
        elif scenario == "cpu_contention":
            self.extra.append(subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", BURN]))
        elif scenario == "throttled":
            self.api("POST", "/nodes/n1/inject", {"accelerator_index": 0, "fault": "slow", "argument": 2.5})
        elif scenario == "slow_path":
            for args in (["ip", "netns", "exec", host1.namespace, "tc", "qdisc", "add", "dev", "eth0"],
                         ["tc", "qdisc", "add", "dev", host1.host_veth]):
                subprocess.run([*args, "root", "tbf", "rate", "150mbit", "burst", "64kb", "latency", "400ms"],
                               check=True)
        elif scenario == "checkpoint_io":
            for i in range(3):
                self.extra.append(subprocess.Popen(["dd", "if=/dev/zero", f"of={self.work / 'ckpt' / f'hog{i}'}",
                                                    "bs=4M", "count=1000000", "oflag=direct"],
                                                   stderr=subprocess.DEVNULL))
        elif scenario == "control":
            self.extra.append(subprocess.Popen([sys.executable, "-c", NOISE]))

    def clear(self, scenario: str, control: Path) -> None:
        for proc in self.extra:
            proc.kill()
            proc.wait()
        self.extra.clear()
        for path in control.glob("*.*"):
            path.unlink()
        if scenario == "throttled":
            self.api("POST", "/nodes/n1/inject", {"accelerator_index": 0, "fault": "clear"})
        if scenario == "slow_path":
            host1 = self.lab.hosts[1]
            subprocess.run(["ip", "netns", "exec", host1.namespace, "tc", "qdisc", "del", "dev", "eth0", "root"],
                           check=False)
            subprocess.run(["tc", "qdisc", "del", "dev", host1.host_veth, "root"], check=False)
        for hog in (self.work / "ckpt").glob("hog*"):
            hog.unlink()

    def close(self) -> None:
        for proc in self.extra:
            proc.kill()
        self.server.stop()
        self.lab.close()


def one_run(bench: Bench, scenario: str, index: int, watch: float) -> dict[str, Any]:
    control = bench.work / f"control-{scenario}-{index}"
    control.mkdir()
    job, ranks = bench.start_job(f"{scenario}-{index}", control)
    out: dict[str, Any] = {"scenario": scenario, "run": index, "job": job}
    try:
        bench.wait_healthy(job, ranks)
        onset = time.time()
        bench.inject(scenario, control)
        found = None
        while time.time() - onset < watch:
            state = bench.api("GET", f"/jobs/{job}/diagnosis")
            if state["diagnosis"] is not None:
                found = state["diagnosis"]
                break
            time.sleep(0.5)
        if found is not None:
            out |= {"layer": found["layer"], "component": found["component"], "straggler": found["straggler"],
                    "proposed": found["proposed_experiment"]["kind"], "ranks": found["ranks"],
                    "seconds": found["diagnosed_at"] - onset, "title": found["title"],
                    "legacy_layer": legacy_layer(found)}
            out |= experiment(bench, job)
        else:
            out |= {"layer": None}
    finally:
        bench.clear(scenario, control)
        for proc in ranks:
            proc.kill()
            proc.wait()
        time.sleep(1)
    return out


def experiment(bench: Bench, job: int) -> dict[str, Any]:
    started = bench.api("POST", f"/jobs/{job}/experiments", {})
    deadline = time.monotonic() + 75
    result = started
    while result["state"] == "pending" and time.monotonic() < deadline:
        time.sleep(0.5)
        result = bench.api("GET", f"/jobs/{job}/experiments/{started['id']}")
    return {"experiment": result["kind"], "experiment_state": result["state"], "verdict": result["verdict"],
            "experiment_summary": result["summary"] or result["error"]}


def legacy_layer(d: dict[str, Any]) -> str:
    """What mfu_drop's layer rule would say from the same before/after numbers (its rule, sentinel/detection/
    detectors/mfu_drop.py): the all-reduce share rose ≥ 5 points → interconnect; throttling → hardware; else
    compute (tokens per step do not change in these runs, so input_pipeline never applies)."""
    comm = next(c for c in d["changes"] if c["component"] == "communication")
    if comm["share_after"] - comm["share_before"] >= 0.05:
        return "interconnect"
    if any(s.get("throttle_reasons") for s in d["signals"].values()):
        return "hardware"
    return "compute"


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for scenario, (layer, kind) in EXPECTED.items():
        mine = [r for r in runs if r["scenario"] == scenario]
        if not mine:
            continue
        if layer is None:
            table[scenario] = {"runs": len(mine), "diagnosed": sum(r["layer"] is not None for r in mine)}
            continue
        seconds = [r["seconds"] for r in mine if r.get("seconds") is not None]
        table[scenario] = {
            "runs": len(mine), "right_layer": sum(r["layer"] == layer for r in mine),
            "confirming_proposed": sum(r.get("proposed") == kind for r in mine),
            "confirmed": sum(r.get("verdict") == "confirmed" for r in mine),
            "legacy_right_layer": sum(r.get("legacy_layer") == layer for r in mine),
            "seconds_median": statistics.median(seconds) if seconds else None,
            "seconds_range": [min(seconds), max(seconds)] if seconds else None}
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--scenarios", default=",".join(EXPECTED))
    parser.add_argument("--watch", type=float, default=60.0, help="seconds after the onset to wait for a diagnosis")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from tests.network.netlab import Lab

    reason = Lab.available()
    if reason is not None:
        say(f"skipped: {reason}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="sentinel-diag-"))
    say(f"diagnosis benchmark on {machine()}, load {load()}; work in {work}")
    bench = Bench(work)
    runs: list[dict[str, Any]] = []
    try:
        for index in range(args.runs):
            for scenario in args.scenarios.split(","):
                result = one_run(bench, scenario, index, args.watch)
                runs.append(result)
                say(f"  {scenario:15s} run {index}: " + (
                    f"{result['layer']}/{result['component']} in {result['seconds']:.1f} s, proposed "
                    f"{result['proposed']} → {result.get('verdict') or result.get('experiment_state')}; "
                    f"legacy rule: {result['legacy_layer']}" if result["layer"] else "no diagnosis"))
    finally:
        bench.close()
    table = summarise(runs)
    say("\nscenario         runs  right layer  confirming first  confirmed  onset→diagnosis s (median, range)  "
        "legacy rule right")
    for scenario, row in table.items():
        if "diagnosed" in row:
            say(f"{scenario:15s} {row['runs']:5d}  diagnoses in {row['diagnosed']} runs (target 0)")
            continue
        span = row["seconds_range"]
        say(f"{scenario:15s} {row['runs']:5d}  {row['right_layer']:11d}  {row['confirming_proposed']:16d}  "
            f"{row['confirmed']:9d}  {row['seconds_median'] or float('nan'):6.1f} "
            f"({span[0] if span else float('nan'):.1f}–{span[1] if span else float('nan'):.1f})"
            f"{'':14s}{row['legacy_right_layer']:d}")
    right = sum(r.get("right_layer", 0) for r in table.values())
    legacy = sum(r.get("legacy_right_layer", 0) for r in table.values())
    faults = sum(r["runs"] for s, r in table.items() if s != "control")
    if faults:
        ratio = f"{right / legacy:.2f}×" if legacy else "n/a: the legacy rule was right in no run"
        say(f"\nright layer: {right}/{faults} runs; the legacy mfu_drop rule on the same numbers: {legacy}/{faults} "
            f"(ratio {ratio})")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
