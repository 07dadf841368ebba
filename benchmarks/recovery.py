"""Recovery benchmark: fault → the job stepping again, Sentinel against plain torchrun, in the same run.

    PYTHONPATH=. python benchmarks/recovery.py [--rounds 3] [--spacing 10 --spacing 0] [--faults crash,xid,hang]
        [--no-record | --record PATH]

The job is `sentinel/demo/job.py` (`python -m sentinel.demo.job`): 2-rank DDP over gloo on CPU, the store
prefixed per attempt (the restart fix ENVIRONMENT.md describes), appending "rank attempt step wall_time" to
steps.log on every step. Times are read from that log, not from Sentinel: from the moment the benchmark
injects the fault to the first step logged by the next attempt.

* **Sentinel**: a server (fresh SQLite), two agents with `sim:2` each (`--interval 1`), and
  `sentinel launch --nproc 2` (warm standbys forked from the launcher's zygote). Faults on rank 1:
  - crash: SIGKILL its process — the agent sees the exit (netlink), the server orders a restart;
  - hang: `sentinel inject … hang` — the sim accelerator freezes the process (SIGSTOP), the hang detector
    sees no progress (its default limit: the rank's cadence, at least the data's freshness, 2.25 s at these
    intervals), the accelerator is quarantined, the rank moves;
  - xid: `sentinel inject … xid 79` — the node is drained, both ranks move to the spare node.
  Between faults the benchmark releases the quarantined accelerators and uncordons the node.
* **torchrun** (the baseline): `torchrun --standalone --nproc-per-node 2 --max-restarts N
  --monitor-interval 0.1` on the same script. crash: SIGKILL rank 1. hang: SIGSTOP rank 1 — torchrun
  only notices when the surviving rank's collective times out (`--collective-timeout`, default 30 s
  here; PyTorch's default is 30 minutes). torchrun cannot see an XID at all (the process keeps running
  on a dead accelerator): XID is compared with torchrun's crash restart, the best torchrun could do.

Fault spacing (`--spacing S`, repeatable): the next fault comes S seconds after the job stepped again, and
never before the new attempt has stepped 10 times and 2 s have passed (the time its agents need to learn
the new ranks' pids); `--spacing 0` is back to back. Each spacing is its own series, for both systems.
Also measured: what idle warm standbys cost (CPU of the zygote and its waiting standbys over
`--idle-seconds`), and how the launcher labelled each attempt (warm, or how many ranks started otherwise).

Targets: crash and XID ≤ 0.1× torchrun's crash at faults 10 s apart, ≤ 0.25× back to back; hang < 2 s
(issue 19; the data's freshness, 2.25 s at these intervals, keeps it above that today).
Medians and ranges over `--rounds`. For XID and hang, also the detection: from the fault to the server opening
its incident (the `hardware`, resp. `hang`, detector's, on the victim's node), and the rest of the recovery.

Recorded (unless `--no-record`) into benchmarks/measured.json (or `--record PATH`), merged with the other
benchmarks' figures, from the 10 s series (else the widest spacing run): `sentinel_{crash,xid,hang}_recovery_
seconds`, `sentinel_{xid,hang}_detection_seconds`, `torchrun_{crash,hang}_recovery_seconds` — each a median
with its range, the command and the conditions (machine, load, intervals, torchrun's collective timeout).
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from support import (
    HOST,
    REPO,
    BenchError,
    Processes,
    add_record_arguments,
    api,
    command_line,
    figure,
    free_port,
    http_call,
    load,
    machine,
    ready,
    record_figures,
    report_recorded,
    say,
    tail,
    wait,
)

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






Series = dict[str, dict[str, list[float]]]  # spacing → fault → seconds from the fault to stepping again
MIN_SPACING_SECONDS = 2.0  # the restarted ranks' pids reach their agents with the next report's answer
DETECTORS = {"xid": "hardware", "hang": "hang"}  # fault → the detector whose incident marks it detected


def plan(args: argparse.Namespace, kinds: tuple[str, ...]) -> list[tuple[float, str]]:
    return [(spacing, kind) for spacing in args.spacing for _ in range(args.rounds) for kind in args.faults
            if kind in kinds]


def space(log: Path, attempt: int, spacing: float, procs: Processes, watched: list[subprocess.Popen[bytes]]) -> None:
    """Wait until the next fault is due: `spacing` after the attempt stepped, 10 steps in, ≥ 2 s."""
    stepped = first_step_after(log, attempt - 1) or time.time()
    wait("steady stepping", lambda: steady(log, attempt, 10), 120, procs, watched)
    time.sleep(max(0.0, stepped + max(spacing, MIN_SPACING_SECONDS) - time.time()))


class SentinelWorld:
    """A server, two sim agents and `sentinel launch --nproc 2` of the demo job."""

    def __init__(self, procs: Processes, work: Path):
        self.procs, self.work = procs, work
        # a benchmark of recovery, not of the safety limits: neither the breaker, the migration cap nor the
        # restart-storm hold may stop it
        self.env = {**os.environ, "SENTINEL_DATA_DIR": str(work / "server"),
                    "SENTINEL_MAX_MIGRATIONS_PER_HOUR": "1000", "SENTINEL_BREAKER_MIN_ACCELERATORS": "1000",
                    "SENTINEL_RESTART_STORM_RESTARTS": "1000", "SENTINEL_RESTART_STORM_WITHOUT_PROGRESS": "1000",
                    "SENTINEL_LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}
        self.port = free_port()
        server = procs.start("server", [sys.executable, "-m", "sentinel.cli", "server", "--host", HOST, "--port",
                                        str(self.port)], self.env, work / "server.log")
        wait("server /readyz", lambda: ready(self.port), 60, procs, [server])
        self.admin = (work / "server" / "admin-token").read_text().strip()
        agent_token, launcher_token = self.token("agent"), self.token("launcher")
        agents = [procs.start(f"agent {node}", [
            sys.executable, "-m", "sentinel.cli", "collector", "--server", f"http://{HOST}:{self.port}", "--token",
            agent_token, "--node-name", node, "--source", "sim:2", "--interval", "1", "--listen",
            f"{HOST}:{free_port()}", "--state-dir", str(work / "agents")], self.env, work / f"agent-{node}.log")
            for node in ("node-a", "node-b")]
        for node in ("node-a", "node-b"):
            wait(f"{node} registered", lambda n=node: self.call("GET", f"/api/v1/nodes/{n}")[0] == 200, 30, procs,
                 [server, *agents])
        out = work / "sentinel-job"
        out.mkdir()
        self.launch = procs.start("sentinel launch", [
            sys.executable, "-m", "sentinel.cli", "launch", "--job", "bench", "--nproc", "2", "--", sys.executable,
            *JOB], {**self.env, "SENTINEL_SERVER": f"http://{HOST}:{self.port}", "SENTINEL_TOKEN": launcher_token,
                    "OUT_DIR": str(out), "STEPS": "0"}, work / "launch.log")
        self.watched = [server, *agents, self.launch]
        self.log = out / "steps.log"
        wait("the job stepping", lambda: steady(self.log, 0), 180, procs, self.watched)
        self.job_id = self.api("GET", "/api/v1/jobs")[0]["id"]

    def token(self, role: str) -> str:
        made = subprocess.run([sys.executable, "-m", "sentinel.cli", "token", "create", "--role", role, "--name",
                               f"bench-{role}", *(["--node", "*"] if role == "agent" else []), "--rate-limit", "0"],
                              env=self.env, capture_output=True, text=True, timeout=60, check=True)
        return made.stdout.strip().splitlines()[-1]

    def call(self, method: str, path: str) -> tuple[int, bytes]:
        return http_call(self.port, method, path, token=self.admin)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return api(self.port, method, path, self.admin, body)

    def victim(self, attempt: int) -> dict[str, Any]:
        tasks = [t for t in self.api("GET", f"/api/v1/jobs/{self.job_id}")["tasks"]
                 if t["attempt"] == attempt]
        return next(t for t in tasks if t["rank"] == 1)

    def inject(self, victim: dict[str, Any], kind: str) -> None:
        uuid = str(victim["accelerators"][0])
        if kind == "crash":
            os.kill(int(victim["pid"]), signal.SIGKILL)
            return
        self.api("POST", f"/api/v1/nodes/{victim['node']}/inject",
                 {"accelerator_index": int(uuid.rsplit("-", 1)[1]), "fault": kind,
                  "argument": 79 if kind == "xid" else None})

    def detected(self, victim: dict[str, Any], kind: str, start: float) -> float | None:
        """Seconds from the fault to the server opening its incident (the `DETECTORS` one on the victim's node,
        opened after `start`); None when no new incident was opened (e.g. an older one still active was only
        updated) or the fault has no detector here (crash)."""
        detector = DETECTORS.get(kind)
        if detector is None:
            return None
        deadline = time.monotonic() + 5
        while True:
            rows = self.api("GET", f"/api/v1/incidents?state=all&detector={detector}&node={victim['node']}"
                                   "&limit=50")["incidents"]
            opened = [stamp for stamp in (at(row["opened_at"]) for row in rows) if stamp >= start]
            if opened or time.monotonic() > deadline:
                return min(opened) - start if opened else None
            time.sleep(0.1)

    def give_back(self, victim: dict[str, Any]) -> None:
        """Capacity back for the next fault: the fault cleared, accelerators released, nodes uncordoned."""
        uuid = str(victim["accelerators"][0])
        self.api("POST", f"/api/v1/nodes/{victim['node']}/inject",
                 {"accelerator_index": int(uuid.rsplit("-", 1)[1]), "fault": "clear"})
        for acc in self.api("GET", "/api/v1/accelerators"):
            if acc["health"] == "quarantined":
                self.api("POST", f"/api/v1/accelerators/{acc['uuid']}/release", {"reason": "bench"})
        for node in self.api("GET", "/api/v1/nodes"):
            if node["state"] in ("draining", "cordoned"):
                self.api("POST", f"/api/v1/nodes/{node['name']}/uncordon", {"reason": "bench"})

    def idle_cost(self, seconds: float) -> dict[str, float]:
        """Share of a core used by the zygote and by each waiting standby over `seconds` of steady stepping."""
        wait("warm standbys", lambda: "standby(s) ready" in (self.work / "launch.log").read_text(), 120,
             self.procs, self.watched)
        ranks = {int(t["pid"]) for t in self.api("GET", f"/api/v1/jobs/{self.job_id}")["tasks"]}
        [zygote] = psutil.Process(self.launch.pid).children()
        standbys = [p for p in zygote.children() if p.pid not in ranks]

        def cpu() -> list[float]:
            return [sum(p.cpu_times()[:2]) for p in (zygote, *standbys)]

        before, started = cpu(), time.monotonic()
        time.sleep(seconds)
        used = [b - a for a, b in zip(before, cpu(), strict=True)]
        elapsed = time.monotonic() - started
        return {"zygote_core_ratio": used[0] / elapsed, "standbys": len(standbys),
                "per_standby_core_ratio": sum(used[1:]) / max(1, len(standbys)) / elapsed}


def at(stamp: str) -> float:
    """An API date-time as a Unix time (naive ones are UTC, as the server stores them)."""
    parsed = datetime.fromisoformat(stamp)
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def sentinel_runs(args: argparse.Namespace, procs: Processes, work: Path) -> tuple[Series, dict[str, Any]]:
    world = SentinelWorld(procs, work)
    extra: dict[str, Any] = {"idle": world.idle_cost(args.idle_seconds)}
    results: Series = {}
    detection: Series = {}  # spacing → fault → seconds from the fault to its incident (xid, hang)
    missed: dict[str, int] = {}  # fault → rounds whose incident was not newly opened
    faults = plan(args, ("crash", "hang", "xid"))
    for n, (spacing, kind) in enumerate(faults, 1):
        attempt = current_attempt(world.log)
        space(world.log, attempt, spacing, procs, world.watched)
        victim = world.victim(attempt)
        start = time.time()
        world.inject(victim, kind)
        stepped = wait(f"the job stepping again after {kind}", lambda a=attempt: first_step_after(world.log, a), 120,
                       procs, world.watched)
        results.setdefault(f"{spacing:g}", {}).setdefault(kind, []).append(stepped - start)
        seen = world.detected(victim, kind, start)
        if seen is not None:
            detection.setdefault(f"{spacing:g}", {}).setdefault(kind, []).append(seen)
        elif kind in DETECTORS:
            missed[kind] = missed.get(kind, 0) + 1
        say(f"  sentinel {n}/{len(faults)}: spacing {spacing:g}s {kind:5} → stepping again after "
            f"{stepped - start:6.2f}s" + (f" (incident opened after {seen:.2f}s)" if seen is not None else ""))
        if kind != "crash":
            world.give_back(victim)
    labels = [line.split("started (", 1)[1].split(", port")[0]
              for line in (work / "launch.log").read_text().splitlines() if "started (" in line]
    extra["attempt_labels"] = {label: labels[1:].count(label) for label in sorted(set(labels[1:]))}
    extra["detection"], extra["detection_missed"] = detection, missed
    return results, extra


def torchrun_rank(torchrun: subprocess.Popen[bytes], rank: int) -> psutil.Process | None:
    for child in psutil.Process(torchrun.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "sentinel.demo.job" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def torchrun_runs(args: argparse.Namespace, procs: Processes, work: Path) -> Series:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    out = work / "torchrun-job"
    out.mkdir()
    log = out / "steps.log"
    faults = plan(args, ("crash", "hang"))
    env = {**os.environ, "OUT_DIR": str(out), "STEPS": "0", "COLLECTIVE_TIMEOUT": str(args.collective_timeout),
           "SENTINEL_AGENT_URL": "http://127.0.0.1:9"}  # no Sentinel here: the SDK's sends fail fast
    proc = procs.start("torchrun", [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts",
                                    str(len(faults) + 2), "--monitor-interval", "0.1", "-m", "sentinel.demo.job"],
                       env, work / "torchrun.log")
    results: Series = {}
    wait("torchrun stepping", lambda: steady(log, 0), 180, procs, [proc])
    for n, (spacing, kind) in enumerate(faults, 1):
        attempt = current_attempt(log)
        space(log, attempt, spacing, procs, [proc])
        victim = wait("rank 1's process", lambda: torchrun_rank(proc, 1), 10, procs, [proc])
        start = time.time()
        victim.send_signal(signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
        stepped = wait(f"torchrun stepping again after {kind}", lambda a=attempt: first_step_after(log, a),
                       args.collective_timeout + 120, procs, [proc])
        if kind == "hang":
            with contextlib.suppress(psutil.Error):
                victim.send_signal(signal.SIGKILL)
        results.setdefault(f"{spacing:g}", {}).setdefault(kind, []).append(stepped - start)
        say(f"  torchrun {n}/{len(faults)}: spacing {spacing:g}s {kind:5} → stepping again after "
            f"{stepped - start:6.2f}s")
    return results


def shown(values: list[float] | None) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):5.2f}s [{min(values):.2f}–{max(values):.2f}]"


def verdict(kind: str, spacing: float, mine: float, base: float | None) -> str:
    if kind == "hang":
        return f"< 2 s: {'met' if mine < 2.0 else 'MISSED'}"
    limit = 0.1 if spacing >= 10 else 0.25
    if base is None:
        return f"≤ {limit:g}× torchrun: not measured"
    return f"≤ {limit:g}× torchrun: {'met' if mine <= limit * base else 'MISSED'}"


def report(args: argparse.Namespace, ours: Series, theirs: Series, extra: dict[str, Any]) -> None:
    say("")
    say(f"{'spacing':>8} {'fault':6} {'Sentinel median [range]':>26} {'torchrun median [range]':>26} {'ratio':>7}"
        "   target")
    for spacing in args.spacing:
        key = f"{spacing:g}"
        for kind in args.faults:
            mine_values = ours.get(key, {}).get(kind)
            if not mine_values:
                continue
            base_kind = "hang" if kind == "hang" else "crash"  # an XID's best torchrun case: the crash restart
            base_values = theirs.get(key, {}).get(base_kind)
            mine = statistics.median(mine_values)
            base = statistics.median(base_values) if base_values else None
            ratio = f"{mine / base:6.2f}×" if base else "    n/a"
            against = shown(base_values) + (" (crash)" if kind == "xid" and base_values else "")
            say(f"{key + ' s':>8} {kind:6} {shown(mine_values):>26} {against:>26} {ratio}   "
                f"{verdict(kind, spacing, mine, base)}")
    for spacing in args.spacing:
        for kind, values in extra["detection"].get(f"{spacing:g}", {}).items():
            say(f"{spacing:g} s {kind}: fault → incident opened (detection) {shown(values)}; the rest of its "
                f"recovery, fault → stepping again minus that, {shown(restart(ours, extra, f'{spacing:g}', kind))}")
    if extra["detection_missed"]:
        say(f"faults whose incident was not newly opened (not in the detection figures): "
            f"{json.dumps(extra['detection_missed'])}")
    idle = extra["idle"]
    say(f"idle warm standbys over {args.idle_seconds:g}s: {idle['standbys']} standby(s) at "
        f"{100 * idle['per_standby_core_ratio']:.2f}% of a core each, the zygote at "
        f"{100 * idle['zygote_core_ratio']:.2f}%")
    say(f"attempts as the launcher labelled them (after attempt 0): {json.dumps(extra['attempt_labels'])}")
    say(f"(rounds {args.rounds}; every value: Sentinel {json.dumps(ours)}, torchrun {json.dumps(theirs)})")


def restart(ours: Series, extra: dict[str, Any], key: str, kind: str) -> list[float]:
    """Per round, fault → stepping again minus fault → incident: what follows detection (rounds in step)."""
    rounds = ours.get(key, {}).get(kind, [])
    seen = extra["detection"].get(key, {}).get(kind, [])
    return [r - d for r, d in zip(rounds, seen, strict=True)] if len(seen) == len(rounds) else []


def record(args: argparse.Namespace, ours: Series, theirs: Series, extra: dict[str, Any], started_load: str) -> None:
    """Fault → stepping again at faults 10 s apart (else the widest spacing run), for the fault-schedule
    simulator: Sentinel's per fault kind with warm standbys, and its detection (fault → incident) for XID
    and hang; torchrun's crash (a cold restart once its monitor sees the exit) and hang."""
    key = "10" if "10" in ours else f"{max(args.spacing):g}"
    common = (f"{machine()}, load average {started_load} at the start and {load()} at the end; the 2-rank DDP "
              f"demo job over gloo on CPU, faults on rank 1 {key} s after the job stepped again (and ≥ 10 steps, "
              f"≥ 2 s), medians of {args.rounds} rounds")
    sentinel = (f"{common}; Sentinel server (SQLite) and two sim:2 agents at --interval 1 on loopback, "
                "`sentinel launch --nproc 2` with warm standbys, safety limits (breaker, migration cap, restart "
                "storm) lifted")
    figures: dict[str, dict[str, Any]] = {}
    for kind in ("crash", "xid", "hang"):
        if ours.get(key, {}).get(kind):
            figures[f"sentinel_{kind}_recovery_seconds"] = figure(ours[key][kind], conditions=sentinel + ".")
    for kind in ("xid", "hang"):
        seen = extra["detection"].get(key, {}).get(kind)
        if seen:
            figures[f"sentinel_{kind}_detection_seconds"] = figure(seen, conditions=(
                f"{sentinel}; from the fault's injection to the server opening its {DETECTORS[kind]} incident "
                f"(clocks of one machine), {len(seen)} of {len(ours[key][kind])} rounds opened a new one"
                + ("; the XID injected through the server's inject API (the agent long-polls it into the sim "
                   "accelerator), its event pushed at once (no driver or NVML latency in it)"
                   if kind == "xid" else "") + "."))
    torchrun = (f"{common}; `torchrun --standalone --nproc-per-node 2 --monitor-interval 0.1 --max-restarts N` "
                "with a per-attempt store prefix")
    if theirs.get(key, {}).get("crash"):
        figures["torchrun_crash_recovery_seconds"] = figure(theirs[key]["crash"], conditions=(
            f"{torchrun}; SIGKILL of rank 1, the whole job restarted cold (new processes, imports, gloo "
            "rendezvous)."))
    if theirs.get(key, {}).get("hang"):
        figures["torchrun_hang_recovery_seconds"] = figure(theirs[key]["hang"], conditions=(
            f"{torchrun}; SIGSTOP of rank 1, noticed only when the surviving rank's gloo collective timeout "
            f"({args.collective_timeout:g} s, --collective-timeout; PyTorch's default is 30 min) expires, then a "
            "cold restart."))
    if not figures:
        say("no figures to record")
        return
    record_figures(figures, source=command_line(), conditions=sentinel + ".", path=args.record)
    report_recorded(args.record, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spacing", type=float, action="append", default=None,
                        help="seconds from stepping again to the next fault; repeat; 0 = back to back "
                             "(default: 10 and 0)")
    parser.add_argument("--faults", default="crash,xid,hang", help="comma-separated: crash, xid, hang")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="how long idle standbys' CPU is measured")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) and print its path")
    parser.add_argument("--skip-torchrun", action="store_true")
    parser.add_argument("--collective-timeout", type=float, default=30.0,
                        help="gloo timeout of the job, the time torchrun needs to notice a hang")
    add_record_arguments(parser)
    args = parser.parse_args()
    args.spacing = args.spacing or [10.0, 0.0]
    args.faults = [f for f in args.faults.split(",") if f]
    procs = Processes()
    work = Path(tempfile.mkdtemp(prefix="sentinel-recovery-"))
    started_load = load()
    try:
        say(f"Sentinel: server, two agents with sim:2, `sentinel launch --nproc 2` (warm standbys); "
            f"spacing {args.spacing}, faults {args.faults}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        ours, extra = sentinel_runs(args, procs, work)
        procs.stop_all()
        procs = Processes()
        say(f"torchrun --max-restarts (per-attempt store), gloo timeout {args.collective_timeout:g}s")
        theirs = {} if args.skip_torchrun else torchrun_runs(args, procs, work)
        report(args, ours, theirs, extra)
        if args.record is not None:
            record(args, ours, theirs, extra, started_load)
        else:
            report_recorded(None, {})
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
