"""`sentinel demo`: the whole story in one command, on the embedded default.

A server on SQLite in a fresh data directory, two agents with simulated accelerators (the second one a
spare), and a real 2-rank DDP training job (torch, gloo on CPU) run by `sentinel launch`. Once the job
steps, it injects a fault (`--fault xid:79` by default; `hang`, `crash`) and narrates what
Sentinel does, reading everything from the server's API: detection, the incident and its evidence,
quarantine, the order, the job stepping again on the spare. It ends with a timeline table and keeps
the server running with its URLs until Ctrl-C (`--exit` stops at the end). The job checkpoints every
10 steps to each node's local tier and every 50 to a shared tier; the restart resumes from the server's
recovery plan. Every step is real; what is simulated (the accelerators) is said, never hidden.

SIGTERM, SIGINT or SIGHUP stop the demo (each process it started gets SIGINT, then SIGKILL) and it exits
128 + the signal; SIGKILLed, it leaves nothing either: its processes are tethered to it (they get SIGTERM
when it dies, launcher/tether.py), and the launcher stops its ranks and standbys in turn.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from sentinel.launcher.tether import tethered

LOCAL_EVERY, SHARED_EVERY = 10, 50
WIDTH = 100
FAULTS = ("xid", "hang", "crash")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class DemoError(Exception):
    pass


class DemoStopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_signal(signum: int, _frame: Any) -> None:
    raise DemoStopped(signum)


def _sentinel(*args: str) -> list[str]:
    return [sys.executable, "-m", "sentinel.cli", *args]


def parse_fault(text: str) -> tuple[str, float | None]:
    kind, _, arg = text.partition(":")
    if kind == "slow":
        raise ValueError("slow: not in this demo yet. A slowed rank in lock-step DDP slows its peers as much "
                         "(they wait in all-reduce), so per-rank step times stay equal and the straggler detector "
                         "has nothing to see; that needs per-rank compute time from the SDK, which is not built")
    if kind not in FAULTS:
        raise ValueError(f"--fault {text!r}: one of xid[:N], hang, crash")
    if kind == "xid":
        return kind, float(arg or 79)
    return kind, None


@dataclass
class Demo:
    data_dir: Path
    port: int
    fault: tuple[str, float | None]
    console: Console
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        token = (self.data_dir / "admin-token").read_text().strip()
        r = httpx.request(method, f"{self.url}/api/v1{path}", json=body, params=params, timeout=30,
                          headers={"authorization": f"Bearer {token}"})
        if r.status_code >= 400:
            raise DemoError(f"{method} {path} answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(tethered(argv), env=env, stdout=log, stderr=log, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait(self, what: str, probe: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self.console.status(what):
            while time.monotonic() < deadline:
                if any(p.poll() is not None for p in self.procs):
                    raise DemoError(f"a demo process exited while waiting for {what}; logs in {self.data_dir}")
                try:
                    value = probe()
                except (httpx.HTTPError, DemoError, OSError, ValueError, KeyError):
                    value = None
                if value:
                    return value
                time.sleep(0.2)
        raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.data_dir}")

    def stop(self) -> None:
        """Last started, first stopped, each to its end: the launcher tells the server its job was cancelled
        while the agents still report and the server still listens, so its ranks' exits page no one."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # -- the story -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        env = {**os.environ, "SENTINEL_DATA_DIR": str(self.data_dir), "SENTINEL_HANG_MIN_SECONDS": "3",
               "SENTINEL_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
        env.pop("SENTINEL_DATABASE_URL", None)
        launcher_token = self._start_server(env)
        self._start_agents(env)
        job_id, out = self._start_job(env, launcher_token)
        incident, injected, before = self._inject_fault(job_id, out)
        self._follow_timeline(incident)
        self.figures = self._stepping_again(job_id, out, incident, injected, before)
        self._timeline()
        (self.data_dir / "timeline.json").write_text(json.dumps(self.figures, indent=2))
        return self.figures

    def _start_server(self, env: dict[str, str]) -> str:
        """1. The server on SQLite; returns a launcher token."""
        self.console.print(f"[bold]1. The central service[/] on {self.url} (SQLite in {self.data_dir})")
        self.start("server", _sentinel("server", "--host", "127.0.0.1", "--port", str(self.port)), env)
        self.wait("starting the server", lambda: httpx.get(self.url + "/readyz", timeout=1).status_code == 200, 60)
        return str(self.api("POST", "/tokens", {"name": "demo-launcher", "role": "launcher"})["token"])

    def _start_agents(self, env: dict[str, str]) -> None:
        """2. Two agents with simulated accelerators, each with a token bound to its node."""
        self.console.print("[bold]2. Two node agents[/], each with 2 SIMULATED accelerators (no GPU here; `sim` "
                           "stands in for NVML and says so). demo-node-2 is the spare.")
        for node in ("demo-node-1", "demo-node-2"):
            agent_token = self.api("POST", "/tokens", {"name": f"{node}-agent", "role": "agent", "node": node})["token"]
            self.start(node, _sentinel("collector", "--server", self.url, "--token", agent_token, "--node-name", node,
                                       "--source", "sim:2", "--interval", "1", "--listen", "127.0.0.1:0",
                                       "--state-dir", str(self.data_dir / "agents")), env)
        self.wait("agents registering", lambda: len(self.api("GET", "/nodes")) == 2, 60)

    def _start_job(self, env: dict[str, str], launcher_token: str) -> tuple[int, Path]:
        """3. The training job, stepping, checkpointed on both tiers, with warm standbys ready."""
        self.console.print("[bold]3. A real training job[/]: 2-rank DDP over gloo on CPU, instrumented by the SDK, "
                           "run by `sentinel launch` with warm standbys")
        out = self.data_dir / "job"
        out.mkdir(exist_ok=True)
        self.start("launch", _sentinel("launch", "--job", "demo-llm", "--nproc", "2", "--", sys.executable, "-m",
                                       "sentinel.demo.job"),
                   {**env, "SENTINEL_SERVER": self.url, "SENTINEL_TOKEN": launcher_token, "OUT_DIR": str(out),
                    "STEPS": "0", "CKPT_EVERY": str(LOCAL_EVERY), "CKPT_PERSISTENT_EVERY": str(SHARED_EVERY),
                    "SENTINEL_CHECKPOINT_LOCAL_DIR": str(self.data_dir / "checkpoints" / "{node}"),
                    "SENTINEL_CHECKPOINT_PERSISTENT_DIR": str(self.data_dir / "checkpoints" / "shared")})
        job = self.wait("importing torch and forming the gloo group",
                        lambda: [j for j in self.api("GET", "/jobs") if j["name"] == "demo-llm"], 120)[0]
        job_id = int(job["id"])
        self._signals(self.wait("the first steps reaching the server", lambda: self._stepping(job_id), 120))
        self.console.print(f"   Checkpoints: every {LOCAL_EVERY} steps to the node's local disk, every {SHARED_EVERY} "
                           "to a shared directory; incremental (only changed chunks are written) and committed when "
                           "both ranks' shards are in.")
        self.wait("a checkpoint on the shared tier", lambda: self._committed(job_id) >= SHARED_EVERY, 120)
        self.wait("warm standbys for the next attempt", lambda: "standby(s) ready" in self._log("launch"), 180)
        time.sleep(1)
        return job_id, out

    def _inject_fault(self, job_id: int, out: Path) -> tuple[dict[str, Any], float, int]:
        """4-5. The fault on rank 1's accelerator, and the incident it opens: (incident, injected at, step)."""
        say = self.console.print
        tasks = [t for t in self.api("GET", f"/jobs/{job_id}")["tasks"] if t["state"] == "running"]
        victim = next(t for t in tasks if t["rank"] == 1)
        uuid, node = victim["accelerators"][0], victim["node"]
        before = self._last_step(out)
        kind, argument = self.fault
        say(f"[bold]4. Fault[/]: {kind}{'' if argument is None else f' {argument:g}'} on rank 1's accelerator "
            f"{uuid} ({node}) at step {before}")
        injected = time.time()
        if kind == "crash":
            os.kill(victim["pid"], signal.SIGKILL)
        else:
            self.api("POST", f"/nodes/{node}/inject", {"accelerator_index": int(uuid.rsplit("-", 1)[1]),
                                                       "fault": kind, "argument": argument})
        detectors = {"xid": "hardware", "hang": "hang", "crash": "task_exit"}
        incident = self.wait("detection", lambda: [i for i in self.api("GET", "/incidents", state="all")["incidents"]
                                                   if i["detector"] == detectors[kind]], 180)[0]
        detail = self.api("GET", f"/incidents/{incident['id']}")
        say(f"[bold]5. Detected[/] by the {incident['detector']} detector, "
            f"{incident['detection_latency_seconds'] or 0:.3f}s after the agent observed it: incident "
            f"#{incident['id']} [red]{incident['severity']}[/] — {incident['title']}")
        for heading, body in (("Seen", detail["seen"]), ("Compared with", detail["comparison"]),
                              ("Points at", detail["layer"]), ("Check next", "; ".join(detail["next_steps"][:2]))):
            if body:
                say(f"   [dim]{heading}:[/] {body}")
        return incident, injected, before

    def _follow_timeline(self, incident: dict[str, Any], chapter: str = "6", until: str = "stepping again",
                         timeout: float = 180.0) -> None:
        """The incident's timeline as it happens, until a line says `until` (the job steps or serves again)."""
        self.console.print(f"[bold]{chapter}. What Sentinel did[/] (the incident's timeline, as it happens)")
        shown = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            actions = self.api("GET", f"/incidents/{incident['id']}")["actions"]
            for action in actions[shown:]:
                self.console.print(f"   {action['at'][11:23]}  {action['text']}")
            shown = len(actions)
            if any(until in a["text"] for a in actions):
                return
            time.sleep(0.3)
        raise DemoError(f"the job was not {until} within {timeout:.0f} s; logs in {self.data_dir}")

    def _stepping_again(self, job_id: int, out: Path, incident: dict[str, Any], injected: float,
                        before: int) -> dict[str, Any]:
        """7. Where the new attempt runs and resumed from; the figures for the timeline."""
        orders = self.api("GET", f"/jobs/{job_id}/orders", state="all")
        order = next(o for o in reversed(orders) if o["recovery_seconds"] is not None)
        placement = ", ".join(f"rank {s['rank']} → {s['node']}" for s in order["placement"])
        self.console.print(f"[bold]7. Stepping again[/] as attempt {order['attempt']}: {placement}")
        resumed = self.wait("the ranks restoring", lambda: self._restored(out, order["attempt"]), 60)
        self.console.print(f"   resumed from checkpoint step {resumed[0]} ({resumed[1]} tier, every chunk verified); "
                           f"{order['lost_steps'] or 0} step(s) recomputed")
        time.sleep(2)
        metrics = self.api("GET", f"/jobs/{job_id}/metrics")
        policy = self.api("GET", f"/jobs/{job_id}")["checkpoints"]
        opened = datetime.fromisoformat(incident["opened_at"]).timestamp()
        completed = datetime.fromisoformat(order["completed_at"]).timestamp()
        return {
            "job_id": job_id, "incident_id": incident["id"], "order_id": order["id"], "fault": self.fault[0],
            "injected_at": injected, "step_at_fault": before,
            "detection_latency_seconds": incident["detection_latency_seconds"],
            "recovery_seconds": order["recovery_seconds"], "lost_steps": order["lost_steps"] or 0,
            "goodput_ratio": metrics["goodput_ratio"], "step_seconds_p50": metrics["step_seconds_p50"],
            "injected_to_open_seconds": opened - injected, "injected_to_stepping_seconds": completed - injected,
            "checkpoint_step": order["checkpoint_step"], "restored_step": resumed[0], "restored_tier": resumed[1],
            # the truth the server's lost steps approach from below: the job's own log, which the server never
            # reads (the ranks were killed with up to a telemetry flush of steps still unsent)
            "redone_steps": max(0, self._last_step(out, order["attempt"]) - resumed[0]),
            "checkpoint_stall_seconds": policy["stall_seconds"],
            "checkpoint_interval_recommended_seconds": policy["interval_recommended_seconds"],
        }

    def _stepping(self, job_id: int) -> dict[str, Any] | None:
        m = self.api("GET", f"/jobs/{job_id}/metrics")
        return m if m["ranks"] and all((r["last_step"] or 0) >= 20 for r in m["ranks"]) and m["mfu_ratio"] else None

    def _log(self, name: str) -> str:
        path = self.data_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _committed(self, job_id: int) -> int:
        steps = [c["step"] for c in self.api("GET", f"/jobs/{job_id}/checkpoints") if c["state"] == "committed"]
        return max(steps, default=0)

    @staticmethod
    def _restored(out: Path, attempt: int) -> tuple[int, str] | None:
        """(step, tier) once every rank of `attempt` logged its restore."""
        log = out / "checkpoints.log"
        rows = [line.split() for line in (log.read_text().splitlines() if log.exists() else [])]
        done = [r for r in rows if len(r) >= 5 and r[1] == str(attempt) and r[2] == "restored"]
        return (int(done[0][3]), done[0][4]) if len(done) >= 2 else None

    @staticmethod
    def _last_step(out: Path, before_attempt: int | None = None) -> int:
        """The furthest step the job's own log shows (of the attempts before `before_attempt`)."""
        log = out / "steps.log"
        rows = [line.split() for line in (log.read_text().splitlines() if log.exists() else [])]
        return max((int(r[2]) for r in rows if len(r) == 4 and (before_attempt is None or int(r[1]) < before_attempt)),
                   default=0)

    def _signals(self, m: dict[str, Any]) -> None:
        table = Table(title="the job's four signals (GET /api/v1/jobs/{id}/metrics)", width=WIDTH)
        for column in ("MFU", "all-reduce share", "step p50", "tokens/s", "peak memory", "failures"):
            table.add_column(column, justify="right")
        table.add_row(f"{100 * (m['mfu_ratio'] or 0):.2f} %", f"{100 * (m['allreduce_time_ratio'] or 0):.1f} %",
                      f"{1000 * (m['step_seconds_p50'] or 0):.1f} ms", f"{m['tokens_per_second'] or 0:,.0f}",
                      f"{(m['memory_peak_bytes'] or 0) / 2**20:,.0f} MiB", str(m["task_failures_total"]))
        self.console.print(table)

    def _timeline(self) -> None:
        f = self.figures
        table = Table(title="timeline (every figure read from the server's API)", width=WIDTH)
        table.add_column("what")
        table.add_column("figure", justify="right")
        table.add_column("where it comes from")
        table.add_row("fault injected → incident open", f"{f['injected_to_open_seconds']:.2f} s",
                      "the incident's opened_at − the injection (a hang is only a hang after its limit)")
        table.add_row("detection latency", f"{f['detection_latency_seconds']:.3f} s",
                      f"GET /incidents/{f['incident_id']}: observed by the agent → open")
        table.add_row("recovery time", f"{f['recovery_seconds']:.2f} s",
                      "fault observed → first step of the new attempt (order)")
        table.add_row("fault injected → stepping again", f"{f['injected_to_stepping_seconds']:.2f} s",
                      "the order's completed_at − the injection")
        table.add_row("resumed from", f"step {f['restored_step']}",
                      f"GET /jobs/{{id}}/recovery-plan at the order ({f['restored_tier']} tier)")
        table.add_row("lost steps", str(f["lost_steps"]),
                      f"recomputed: resumed step → the last the server saw (job's log: {f['redone_steps']})")
        stall = f["checkpoint_stall_seconds"]
        table.add_row("checkpoint stall", "-" if stall is None else f"{1000 * stall:.1f} ms",
                      "what a save blocks the loop for (median, slowest rank)")
        every = f["checkpoint_interval_recommended_seconds"]
        shown = "-" if every is None else f"{1000 * every:.0f} ms" if every < 1 else f"{every:.1f} s"
        table.add_row("checkpoint every", shown,
                      "recommended: Young/Daly √(2·stall·MTBF), live failure rate")
        goodput = "-" if f["goodput_ratio"] is None else f"{100 * f['goodput_ratio']:.1f} %"
        table.add_row("goodput", goodput, "GET /jobs/{id}/metrics: 1 − lost time ÷ time since start")
        self.console.print(table)


def run_demo(*, data_dir: Path | None, port: int, fault: str | None = None, exit_after: bool = False,
             duration: float | None = None, serving: bool = False) -> int:
    console = Console(width=WIDTH, highlight=False)
    if serving:
        from sentinel.demo.serving import SERVING_FAULTS, ServingDemo

        if (fault or "freeze") not in SERVING_FAULTS:
            console.print(f"error: a serving fault is one of {', '.join(SERVING_FAULTS)}, not {fault!r}")
            return 2
        parsed: tuple[str, float | None] = (fault or "freeze", None)
    else:
        try:
            parsed = parse_fault(fault or "xid:79")
        except ValueError as exc:
            console.print(f"error: {exc}")
            return 2
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="sentinel-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    demo = (ServingDemo if serving else Demo)(data_dir=data_dir, port=port, fault=parsed, console=console)
    previous = {sig: signal.signal(sig, _stop_signal) for sig in STOP_SIGNALS}
    try:
        demo.run()
        console.print("[bold]Where to look[/]" + ("" if exit_after else " (the server keeps running)") + ":")
        for label, where in (("API docs", f"{demo.url}/docs"), ("status page", f"{demo.url}/ui"),
                             ("server metrics", f"{demo.url}/metrics (token: {data_dir}/admin-token)"),
                             ("incidents", f"SENTINEL_DATA_DIR={data_dir} sentinel incidents --server {demo.url}"),
                             ("logs", str(data_dir))):
            console.print(f"  {label:15} {where}")
        if exit_after:
            return 0
        console.print("Press Ctrl-C to stop.")
        deadline = time.monotonic() + duration if duration else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.5)
        return 0
    except DemoError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    except DemoStopped as stop:
        console.print(f"{stop}: stopping the demo's processes")
        return 128 + stop.signum
    finally:
        for sig in STOP_SIGNALS:  # the stop below runs to its end; tethered children follow this process anyway
            signal.signal(sig, signal.SIG_IGN)
        demo.stop()
        console.print("demo stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
