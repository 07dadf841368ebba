"""Recovery benchmark: fault → the job stepping again, Sentinel against plain torchrun, in the same run.

    PYTHONPATH=. python benchmarks/recovery.py [--rounds 3] [--collective-timeout 30]

The job is `sentinel/demo/job.py` (`python -m sentinel.demo.job`): 2-rank DDP over gloo on CPU, the store
prefixed per attempt
(the restart fix ENVIRONMENT.md describes), appending "rank attempt step wall_time" to steps.log on every
step. Times are read from that log, not from Sentinel: from the moment the benchmark injects the fault
to the first step logged by the next attempt.

* **Sentinel**: a server (fresh SQLite), two agents with `sim:2` each (`--interval 1`), and
  `sentinel launch --nproc 2` (warm standbys). Faults on rank 1:
  - crash: SIGKILL its process — the agent sees the exit (netlink), the server orders a restart;
  - hang: `sentinel inject … hang` — the sim accelerator freezes the process (SIGSTOP), the hang detector
    sees no progress (`SENTINEL_HANG_MIN_SECONDS=3`), the accelerator is quarantined, the rank moves;
  - xid: `sentinel inject … xid 79` — the node is drained, both ranks move to the spare node.
  Between rounds the benchmark releases the quarantined accelerators and uncordons the node.
* **torchrun** (the baseline): `torchrun --standalone --nproc-per-node 2 --max-restarts N
  --monitor-interval 0.1` on the same script. crash: SIGKILL rank 1. hang: SIGSTOP rank 1 — torchrun
  only notices when the surviving rank's collective times out (`--collective-timeout`, default 30 s
  here; PyTorch's default is 30 minutes). torchrun cannot see an XID at all (the process keeps running
  on a dead accelerator), so there is no torchrun figure for it.

Targets: crash ≤ 0.5× torchrun; hang and XID < 15 s. Medians of `--rounds`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from support import HOST, REPO, BenchError, Processes, api, free_port, http_call, ready, say, tail, wait

JOB = ["-m", "sentinel.demo.job"]






def steps(log: Path) -> list[tuple[int, int, int, float]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])))
    return out


def first_step_after(log: Path, attempt: int) -> float | None:
    """Wall time of the first step logged by any attempt newer than `attempt` (a DDP step needs every rank)."""
    times = [t for _, a, _, t in steps(log) if a > attempt]
    return min(times) if times else None


def current_attempt(log: Path) -> int:
    rows = steps(log)
    return max((a for _, a, _, _ in rows), default=-1)


def steady(log: Path, attempt: int, count: int = 20) -> bool:
    """Both ranks of `attempt` have logged at least `count` steps."""
    ranks: dict[int, int] = {}
    for r, a, _, _ in steps(log):
        if a == attempt:
            ranks[r] = ranks.get(r, 0) + 1
    return len(ranks) == 2 and min(ranks.values()) >= count






def sentinel_runs(args: argparse.Namespace, procs: Processes, work: Path) -> dict[str, list[float]]:
    # a benchmark of recovery, not of the safety limits: neither the breaker nor the migration cap may stop it
    env = {**os.environ, "SENTINEL_DATA_DIR": str(work / "server"), "SENTINEL_HANG_MIN_SECONDS": "3",
           "SENTINEL_MAX_MIGRATIONS_PER_HOUR": "100", "SENTINEL_BREAKER_MIN_ACCELERATORS": "1000",
           "SENTINEL_LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}
    port = free_port()
    server = procs.start("server", [sys.executable, "-m", "sentinel.cli", "server", "--host", HOST, "--port",
                                    str(port)], env, work / "server.log")
    wait("server /readyz", lambda: ready(port), 60, procs, [server])
    admin = (work / "server" / "admin-token").read_text().strip()

    def token(role: str) -> str:
        made = subprocess.run([sys.executable, "-m", "sentinel.cli", "token", "create", "--role", role, "--name",
                               f"bench-{role}", *(["--node", "*"] if role == "agent" else []), "--rate-limit", "0"],
                              env=env, capture_output=True, text=True, timeout=60, check=True)
        return made.stdout.strip().splitlines()[-1]

    agent_token, launcher_token = token("agent"), token("launcher")
    agents = []
    for node in ("node-a", "node-b"):
        agents.append(procs.start(f"agent {node}", [
            sys.executable, "-m", "sentinel.cli", "collector", "--server", f"http://{HOST}:{port}", "--token",
            agent_token, "--node-name", node, "--source", "sim:2", "--interval", "1", "--listen",
            f"{HOST}:{free_port()}", "--state-dir", str(work / "agents")], env, work / f"agent-{node}.log"))
    for node in ("node-a", "node-b"):
        wait(f"{node} registered", lambda n=node: http_call(port, "GET", f"/api/v1/nodes/{n}", token=admin)[0] == 200,
             30, procs, [server, *agents])
    out = work / "sentinel-job"
    out.mkdir()
    launch = procs.start("sentinel launch", [
        sys.executable, "-m", "sentinel.cli", "launch", "--job", "bench", "--nproc", "2", "--", sys.executable,
        *JOB], {**env, "SENTINEL_SERVER": f"http://{HOST}:{port}", "SENTINEL_TOKEN": launcher_token,
                      "OUT_DIR": str(out), "STEPS": "0"}, work / "launch.log")
    watched = [server, *agents, launch]
    log = out / "steps.log"
    wait("the job stepping", lambda: steady(log, 0), 180, procs, watched)
    job_id = api(port, "GET", "/api/v1/jobs", admin)[0]["id"]
    results: dict[str, list[float]] = {"crash": [], "hang": [], "xid": []}
    plan = [kind for _ in range(args.rounds) for kind in ("crash", "hang", "xid")]
    for n, kind in enumerate(plan, 1):
        attempt = current_attempt(log)
        wait("steady stepping", lambda a=attempt: steady(log, a, 10), 60, procs, watched)
        time.sleep(2.0)  # the restarted ranks' pids reach their agents with the next report's answer
        tasks = [t for t in api(port, "GET", f"/api/v1/jobs/{job_id}", admin)["tasks"] if t["attempt"] == attempt]
        victim = next(t for t in tasks if t["rank"] == 1)
        uuid = victim["accelerators"][0]
        start = time.time()
        if kind == "crash":
            os.kill(victim["pid"], signal.SIGKILL)
        else:
            api(port, "POST", f"/api/v1/nodes/{victim['node']}/inject", admin,
                {"accelerator_index": int(uuid.rsplit("-", 1)[1]), "fault": kind,
                 "argument": 79 if kind == "xid" else None})
        stepped = wait(f"the job stepping again after {kind}", lambda a=attempt: first_step_after(log, a), 120, procs,
                       watched)
        results[kind].append(stepped - start)
        say(f"  sentinel {n}/{len(plan)}: {kind:5} → stepping again after {stepped - start:6.2f}s")
        if kind != "crash":  # give the capacity back for the next round
            api(port, "POST", f"/api/v1/nodes/{victim['node']}/inject", admin,
                {"accelerator_index": int(uuid.rsplit("-", 1)[1]), "fault": "clear"})
            for acc in api(port, "GET", "/api/v1/accelerators", admin):
                if acc["health"] == "quarantined":
                    api(port, "POST", f"/api/v1/accelerators/{acc['uuid']}/release", admin, {"reason": "bench"})
            for node in api(port, "GET", "/api/v1/nodes", admin):
                if node["state"] in ("draining", "cordoned"):
                    api(port, "POST", f"/api/v1/nodes/{node['name']}/uncordon", admin, {"reason": "bench"})
    return results


def torchrun_rank(torchrun: subprocess.Popen[bytes], rank: int) -> psutil.Process | None:
    for child in psutil.Process(torchrun.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "sentinel.demo.job" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def torchrun_runs(args: argparse.Namespace, procs: Processes, work: Path) -> dict[str, list[float]]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    out = work / "torchrun-job"
    out.mkdir()
    log = out / "steps.log"
    rounds = args.rounds
    env = {**os.environ, "OUT_DIR": str(out), "STEPS": "0", "COLLECTIVE_TIMEOUT": str(args.collective_timeout),
           "SENTINEL_AGENT_URL": "http://127.0.0.1:9"}  # no Sentinel here: the SDK's sends fail fast
    proc = procs.start("torchrun", [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts",
                                    str(2 * rounds + 2), "--monitor-interval", "0.1", "-m", "sentinel.demo.job"], env,
                       work / "torchrun.log")
    results: dict[str, list[float]] = {"crash": [], "hang": []}
    wait("torchrun stepping", lambda: steady(log, 0), 180, procs, [proc])
    for n, kind in enumerate([k for _ in range(rounds) for k in ("crash", "hang")], 1):
        attempt = current_attempt(log)
        wait("steady stepping", lambda a=attempt: steady(log, a, 10), 120, procs, [proc])
        victim = wait("rank 1's process", lambda: torchrun_rank(proc, 1), 10, procs, [proc])
        start = time.time()
        victim.send_signal(signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
        stepped = wait(f"torchrun stepping again after {kind}", lambda a=attempt: first_step_after(log, a),
                       args.collective_timeout + 120, procs, [proc])
        if kind == "hang":
            with contextlib.suppress(psutil.Error):
                victim.send_signal(signal.SIGKILL)
        results[kind].append(stepped - start)
        say(f"  torchrun {n}/{2 * rounds}: {kind:5} → stepping again after {stepped - start:6.2f}s")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) and print its path")
    parser.add_argument("--skip-torchrun", action="store_true")
    parser.add_argument("--collective-timeout", type=float, default=30.0,
                        help="gloo timeout of the job, the time torchrun needs to notice a hang")
    args = parser.parse_args()
    procs = Processes()
    work = Path(tempfile.mkdtemp(prefix="sentinel-recovery-"))
    try:
        say("Sentinel: server, two agents with sim:2, `sentinel launch --nproc 2` (warm standbys)")
        ours = sentinel_runs(args, procs, work)
        procs.stop_all()
        procs = Processes()
        say(f"torchrun --max-restarts (per-attempt store), gloo timeout {args.collective_timeout:g}s")
        theirs = {} if args.skip_torchrun else torchrun_runs(args, procs, work)
        say("")
        say(f"{'fault':6} {'Sentinel median':>16} {'torchrun median':>16} {'ratio':>8}   target")
        for kind, target in (("crash", "≤ 0.5× torchrun"), ("hang", "< 15 s"), ("xid", "< 15 s")):
            mine = statistics.median(ours[kind])
            base = statistics.median(theirs[kind]) if theirs.get(kind) else None
            ratio = f"{mine / base:7.2f}×" if base else "     n/a"
            if kind == "crash":
                verdict = "not measured" if base is None else ("met" if mine <= 0.5 * base else "MISSED")
            else:
                verdict = "met" if mine < 15.0 else "MISSED"
            shown = f"{base:15.2f}s" if base else ("   (cannot see)" if kind == "xid" else "  (not run)")
            say(f"{kind:6} {mine:15.2f}s {shown:>16} {ratio}   {target}: {verdict}")
        say(f"(each the median of {args.rounds}; every value: Sentinel {json.dumps(ours)}, "
            f"torchrun {json.dumps(theirs)})")
        return 0
    except BenchError as exc:
        say(f"benchmark failed: {exc}")
        for name in ("server.log", "launch.log", "torchrun.log"):
            if (work / name).exists():
                say(f"  {name}:\n{tail(work / name)}")
        return 1
    finally:
        procs.stop_all()
        if args.keep:
            say(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
