"""Agent CPU benchmark: the node agent's CPU per collection cycle against prometheus-node-exporter's per scrape.

    PYTHONPATH=. python benchmarks/agent_cpu.py [--duration 30] [--rounds 3] [--sequential]
        [--no-record | --record PATH]

What runs, each in its own process, on loopback only:

* the Sentinel server (`python -m sentinel.cli server`) on a fresh SQLite data directory, with an
  agent token and a launcher token made by `sentinel token create`;
* the agent under test: `python -m sentinel.cli collector --source host --source sim:8 --interval 1`
  (the CLI's own entry point, so what is measured is what a node runs);
* 4 instrumented tasks: processes running `sentinel.sdk.Telemetry(job_id, rank, agent_url=<the agent>)`
  around a loop of 10 ms steps, each with a 1 ms all_reduce, the SDK flushing to the agent every
  second. They are registered as the 4 ranks of a job (POST /api/v1/jobs, then /jobs/{id}/tasks with
  rank, node, accelerator SIM-<node>-<rank> and pid), so the server hands them to the agent as
  assignments: the agent watches their pids for exits and drives the sim accelerators from their load;
* Debian's `prometheus-node-exporter` with its built-in default collectors (and an empty textfile
  directory of its own) on a free loopback port, scraped once per agent interval by a small
  keep-alive client that asks for gzip like Prometheus does.

Measured: user + system CPU seconds of each process (psutil; all threads) over windows of
`--duration` seconds. Agent: CPU / reports it sent in the window (`sentinel_agent_reports_sent_total`
on its /metrics) = CPU per collection cycle. Nothing is subtracted, so a cycle's cost includes
everything the agent process does in that second: collecting (host via psutil, sim:8 reading the
4 tasks' CPU and RSS), building and serializing the report, the spool write and seq file, the push
to the server and parsing its acknowledgement, its HTTP server taking the 4 SDK batches of that
second (pydantic validation) and the relay summing them, the exit watcher (netlink listener and/or
pid poller), the command long-poll, and the Python runtime's idle wakeups. Node exporter: CPU /
scrapes in the window = CPU per scrape, likewise with its idle time between scrapes.
Windows are aligned half an interval away from the agent's reports (found from the server's
last_seq), so the count of reports in a window is exact, and the agent's /metrics is read just
outside each CPU window so that those two scrapes are not charged to it.

Simultaneous (default) or sequential? What is compared is CPU time, not wall time, and both
processes together use well under one of the 2 cores, so running them at once costs each little;
the scrapes are placed half a second away from the agent's cycle so their bursts do not even
coincide. On a shared, noisy 2-core machine, what differs between two sequential windows is the
neighbours' load (caches, frequency, steal), which would land on one side only; measured in the same
windows, both sides see the same conditions. So the default measures both over the very same
windows; `--sequential` measures the agent alone first, then the exporter (the agent and tasks keep
running beside it, since the agent cannot be paused) as a cross-check.

Context for reading the numbers: the exporter's cost grows with the host's devices (CPUs, disks, NICs,
filesystems); Debian's build also enables the systemd collector, which fails at once where systemd is
not running (a container), so there the exporter is cheaper than on a real node. The agent's sim
source reads every watched task's process tree, so its cost depends on the tasks and, depending on
how children are found, on the number of processes on the machine (printed with the results).

Recorded (unless `--no-record`) into benchmarks/measured.json (or `--record PATH`): the agent's CPU seconds
per cycle and the exporter's per scrape (median and range over the rounds), with the ratio's median and range
and the load average before and after in the conditions.

Target: agent CPU per cycle <= 0.5 x node-exporter CPU per scrape. Every loop and wait is bounded and
every process started is stopped at the end, on errors too. Needs /usr/bin/prometheus-node-exporter
(`apt-get install prometheus-node-exporter`); the benchmark does not install it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from support import (
    HOST,
    REPO,
    BenchError,
    Processes,
    add_record_arguments,
    command_line,
    figure,
    free_port,
    http_call,
    load,
    machine,
    record_figures,
    report_recorded,
    tail,
)

NODE = "bench-agent-cpu"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
TASKS = 4
SIM_ACCELERATORS = 8
TARGET_RATIO = 0.5
SIM_BASE_MEMORY_BYTES = 512 * 2**20  # collectors.sim.BASE_MEMORY_BYTES: above it, a task's RSS is counted
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


# --------------------------------------------------------------------------------------------------
# One instrumented task (run with --task in its own process)
# --------------------------------------------------------------------------------------------------

def run_task(job_id: int, rank: int, agent_url: str, step_ms: float, max_seconds: float) -> None:
    from sentinel.sdk.telemetry import Telemetry

    stop = False

    def on_signal(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tel = Telemetry(job_id=job_id, rank=rank, agent_url=agent_url)
    deadline = time.monotonic() + max_seconds
    while not stop and time.monotonic() < deadline:
        with tel.step(tokens=4096):
            time.sleep(step_ms / 1e3)  # the step's compute
            with tel.collective("all_reduce", nbytes=64 * 2**20):
                time.sleep(0.001)
    tel.close()


def api(port: int, method: str, path: str, token: str, body: Any = None, expect: int = 200) -> Any:
    status, answer = http_call(port, method, path, body, token)
    if status != expect:
        raise BenchError(f"{method} {path} answered {status}: {answer[:500]!r}")
    return json.loads(answer) if answer else None


def wait_until(what: str, probe: Callable[[], bool], procs: Processes, watched: list[subprocess.Popen[bytes]],
               timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for proc in watched:
            procs.check_alive(proc)
        try:
            if probe():
                return
        except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise BenchError(f"{what}: not after {timeout:.0f}s {last}")


def metric_values(text: str, name: str) -> dict[str, float]:
    """{label set: value} of every sample of `name` in a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out


def agent_metrics(port: int) -> str:
    status, body = http_call(port, "GET", "/metrics", timeout=10)
    if status != 200:
        raise BenchError(f"agent /metrics answered {status}")
    return body.decode()


def reports_sent(port: int) -> int:
    values = metric_values(agent_metrics(port), "sentinel_agent_reports_sent_total")
    if not values:
        raise BenchError("agent /metrics has no sentinel_agent_reports_sent_total")
    return int(sum(values.values()))


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


class Scraper:
    """A Prometheus-like scrape client: one keep-alive connection, gzip, the exposition read in full."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None
        self.scrapes = 0
        self.failures = 0
        self.bytes = 0

    def scrape(self) -> None:
        for _ in range(2):  # once more on a fresh connection if the kept one was closed
            if self.conn is None:
                self.conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
            try:
                self.conn.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT,
                                                              "Accept-Encoding": "gzip",
                                                              "User-Agent": "Prometheus/2.45.0"})
                resp = self.conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                continue
            if resp.status == 200:
                self.scrapes += 1
                self.bytes += len(body)
            else:
                self.failures += 1
            return
        self.failures += 1

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# --------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------

@dataclass
class Window:
    seconds: float
    agent_cpu: float | None = None
    reports: int = 0
    exporter_cpu: float | None = None
    scrapes: int = 0
    scrape_failures: int = 0
    server_cpu: float | None = None

    @property
    def agent_per_cycle(self) -> float:
        return self.agent_cpu / self.reports if self.agent_cpu is not None and self.reports else float("nan")

    @property
    def exporter_per_scrape(self) -> float:
        return self.exporter_cpu / self.scrapes if self.exporter_cpu is not None and self.scrapes else float("nan")


@dataclass
class Setup:
    server_port: int
    agent_port: int
    admin: str
    agent: subprocess.Popen[bytes]
    server: subprocess.Popen[bytes]
    tasks: list[subprocess.Popen[bytes]] = field(default_factory=list)
    job_id: int = 0


def report_phase(setup: Setup, procs: Processes, timeout: float = 10.0) -> float:
    """The monotonic time of a report reaching the server, seen by polling its last_seq (not the agent)."""
    path = f"/api/v1/nodes/{NODE}"
    first = api(setup.server_port, "GET", path, setup.admin)["last_seq"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive(setup.agent)
        if api(setup.server_port, "GET", path, setup.admin)["last_seq"] != first:
            return time.monotonic()
        time.sleep(0.02)
    raise BenchError(f"the agent sent no report in {timeout:.0f}s")


def sleep_until(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def measure_window(setup: Setup, procs: Processes, seconds: int, interval: float, *, agent: bool,
                   exporter: psutil.Process | None, scraper: Scraper | None) -> Window:
    """One window of `seconds` whole intervals, starting half an interval after a report."""
    agent_ps, server_ps = psutil.Process(setup.agent.pid), psutil.Process(setup.server.pid)
    start = report_phase(setup, procs) + interval / 2
    sleep_until(start - 0.2)
    r0 = reports_sent(setup.agent_port) if agent else 0  # read before the CPU window opens
    sleep_until(start)
    a0, s0 = cpu_seconds(agent_ps), cpu_seconds(server_ps)
    e0 = cpu_seconds(exporter) if exporter is not None else 0.0
    scrapes0, failures0 = (scraper.scrapes, scraper.failures) if scraper is not None else (0, 0)
    for k in range(seconds):
        sleep_until(start + k * interval)
        if scraper is not None:
            scraper.scrape()
        procs.check_alive(setup.agent)
    sleep_until(start + seconds * interval)
    a1, s1 = cpu_seconds(agent_ps), cpu_seconds(server_ps)
    e1 = cpu_seconds(exporter) if exporter is not None else 0.0
    r1 = reports_sent(setup.agent_port) if agent else 0  # read after the CPU window closed
    window = Window(seconds=seconds * interval)
    if agent:
        window.agent_cpu, window.reports, window.server_cpu = a1 - a0, r1 - r0, s1 - s0
    if exporter is not None and scraper is not None:
        window.exporter_cpu = e1 - e0
        window.scrapes, window.scrape_failures = scraper.scrapes - scrapes0, scraper.failures - failures0
    return window


def start_exporter(procs: Processes, env: dict[str, str], data_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    textfiles = data_dir / "textfile"
    textfiles.mkdir(exist_ok=True)
    proc = procs.start("prometheus-node-exporter", [NODE_EXPORTER, f"--web.listen-address={HOST}:{port}",
                                                     f"--collector.textfile.directory={textfiles}"],
                       env, data_dir / "node-exporter.log")
    wait_until("node exporter /metrics", lambda: http_call(port, "GET", "/metrics", timeout=5)[0] == 200,
               procs, [proc], 30)
    return proc, port


def setup_cluster(args: argparse.Namespace, procs: Processes, env: dict[str, str], data_dir: Path,
                  say: Callable[[str], None]) -> Setup:
    python = sys.executable
    server_port, agent_port = free_port(), free_port()
    say(f"starting the server on {HOST}:{server_port} (SQLite in {data_dir})")
    server = procs.start("server", [python, "-m", "sentinel.cli", "server", "--host", HOST, "--port",
                                    str(server_port)], env, data_dir / "server.log")
    wait_until("server /readyz", lambda: http_call(server_port, "GET", "/readyz", timeout=5)[0] == 200,
               procs, [server], args.start_timeout)
    tokens = {}
    for role in ("agent", "launcher"):
        # one token for every simulated node, with no rate limit: a bench load, not a real agent
        extra = ["--node", "*", "--rate-limit", "0"] if role == "agent" else ["--rate-limit", "0"]
        made = subprocess.run([python, "-m", "sentinel.cli", "token", "create", "--role", role, "--name",
                               f"bench-{role}", *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        if made.returncode != 0 or not made.stdout.strip():
            raise BenchError(f"token create --role {role} failed ({made.returncode}): {made.stderr[-2000:]}")
        tokens[role] = made.stdout.strip().splitlines()[-1].strip()
    admin_file = data_dir / "admin-token"
    wait_until("admin token file", admin_file.exists, procs, [server], 30)
    admin = admin_file.read_text().strip()
    token_file = data_dir / "agent-token"
    token_file.write_text(tokens["agent"])
    token_file.chmod(0o600)

    say(f"starting the agent: --source host --source sim:{SIM_ACCELERATORS} --interval {args.interval:g}, "
        f"listening on {HOST}:{agent_port}")
    agent = procs.start("agent", [python, "-m", "sentinel.cli", "collector", "--server",
                                  f"http://{HOST}:{server_port}", "--token-file", str(token_file),
                                  "--node-name", NODE, "--source", "host", "--source", f"sim:{SIM_ACCELERATORS}",
                                  "--interval", f"{args.interval:g}", "--listen", f"{HOST}:{agent_port}",
                                  "--state-dir", str(data_dir / "agent")], env, data_dir / "agent.log")
    setup = Setup(server_port=server_port, agent_port=agent_port, admin=admin, agent=agent, server=server)

    def node_registered() -> bool:
        status, body = http_call(server_port, "GET", f"/api/v1/nodes/{NODE}", token=admin, timeout=5)
        return status == 200 and json.loads(body)["last_seq"] > 0

    wait_until("agent registered and reporting", node_registered, procs, [server, agent], args.start_timeout)

    job = api(server_port, "POST", "/api/v1/jobs", tokens["launcher"],
              {"name": "bench-agent-cpu", "world_size": TASKS}, expect=201)
    setup.job_id = int(job["id"])
    budget = args.start_timeout + args.warmup + args.rounds * (args.duration + 15) * 2 + 120
    say(f"starting {TASKS} instrumented tasks of job {setup.job_id} ({args.step_ms:g} ms steps, SDK flushing "
        "to the agent every second)")
    for rank in range(TASKS):
        task = procs.start(f"task rank {rank}", [python, str(Path(__file__).resolve()), "--task",
                                                 "--job", str(setup.job_id), "--rank", str(rank),
                                                 "--agent-url", f"http://{HOST}:{agent_port}",
                                                 "--step-ms", f"{args.step_ms:g}", "--max-seconds", f"{budget:.0f}"],
                           env, data_dir / f"task-{rank}.log")
        setup.tasks.append(task)
        api(server_port, "POST", f"/api/v1/jobs/{setup.job_id}/tasks", tokens["launcher"],
            {"rank": rank, "node": NODE, "accelerators": [f"SIM-{NODE}-{rank}"], "pid": task.pid}, expect=201)

    def tasks_drive_sim() -> bool:
        used = metric_values(agent_metrics(agent_port), "sentinel_accelerator_memory_used_bytes")
        loaded = [k for k, v in used.items() if v > SIM_BASE_MEMORY_BYTES]
        return len(loaded) >= TASKS

    wait_until("the agent watching the tasks (sim memory above base on 4 accelerators)", tasks_drive_sim, procs,
               [server, agent, *setup.tasks], 30)
    return setup


def verify(setup: Setup) -> dict[str, Any]:
    metrics = api(setup.server_port, "GET", f"/api/v1/jobs/{setup.job_id}/metrics", setup.admin)
    text = agent_metrics(setup.agent_port)
    loaded = sum(1 for v in metric_values(text, "sentinel_accelerator_memory_used_bytes").values()
                 if v > SIM_BASE_MEMORY_BYTES)
    return {"ranks_with_steps": sum(1 for r in metrics.get("ranks", []) if r.get("last_step")),
            "step_p50": metrics.get("step_seconds_p50"), "tokens_per_second": metrics.get("tokens_per_second"),
            "allreduce_ratio": metrics.get("allreduce_time_ratio"), "loaded_accelerators": loaded,
            "push_failures": sum(metric_values(text, "sentinel_agent_push_failures_total").values()),
            "spool_reports": sum(metric_values(text, "sentinel_agent_spool_reports").values())}


def exit_watcher_mode(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "poll every 0.25 s (netlink refused)" if "process-events connector unavailable" in text else \
        "netlink (a poll only for a suspect pid, and every 10 s)"


def print_report(args: argparse.Namespace, windows: list[Window], checks: dict[str, Any], rss: dict[str, float],
                 watcher: str) -> bool:
    print()
    print(f"machine: {os.cpu_count()} CPUs, {len(psutil.pids())} processes, Python {sys.version.split()[0]}, "
          f"psutil {psutil.__version__}; "
          f"{'sequential' if args.sequential else 'simultaneous'} windows of {args.duration}s x {args.rounds}")
    print(f"agent: host + sim:{SIM_ACCELERATORS}, interval {args.interval:g}s, {TASKS} instrumented tasks "
          f"({args.step_ms:g} ms steps); exit watcher: {watcher}")
    print()
    header = (f"{'round':<7}{'agent CPU s':>12}{'reports':>9}{'ms/cycle':>10}{'exporter CPU s':>16}{'scrapes':>9}"
              f"{'ms/scrape':>11}{'ratio':>8}{'server ms/report':>18}")
    print(header)
    print("-" * len(header))
    for i, w in enumerate(windows):
        ratio = w.agent_per_cycle / w.exporter_per_scrape
        server = w.server_cpu / w.reports * 1e3 if w.server_cpu is not None and w.reports else float("nan")
        print(f"{i + 1:<7}{w.agent_cpu or 0.0:>12.3f}{w.reports:>9d}{w.agent_per_cycle * 1e3:>10.2f}"
              f"{w.exporter_cpu or 0.0:>16.3f}{w.scrapes:>9d}{w.exporter_per_scrape * 1e3:>11.2f}{ratio:>7.2f}x"
              f"{server:>18.2f}")
    agent = statistics.median(w.agent_per_cycle for w in windows)
    exporter = statistics.median(w.exporter_per_scrape for w in windows)
    ratio = statistics.median(w.agent_per_cycle / w.exporter_per_scrape for w in windows)  # same-window pairs
    print(f"{'median':<7}{'':>12}{'':>9}{agent * 1e3:>10.2f}{'':>16}{'':>9}{exporter * 1e3:>11.2f}{ratio:>7.2f}x")
    print("  (ratio: median over rounds of the same round's agent / exporter; CPU: user + system of the whole "
          f"process over the window,\n   all threads, in clock ticks of {1e3 / CLK_TCK:g} ms, nothing subtracted; "
          "agent: collect, report build,\n   spool + seq write, push + ack, HTTP server for the SDK batches, "
          "exit watcher, command long-poll, idle wakeups)")
    exporter_rss = f"{rss['exporter'] / 2**20:.0f} MiB" if rss["exporter"] == rss["exporter"] else "n/a (stopped)"
    print(f"  memory (RSS at the end): agent {rss['agent'] / 2**20:.0f} MiB, node exporter {exporter_rss}")
    print(f"  checks: {checks['loaded_accelerators']}/{TASKS} sim accelerators driven by a task, "
          f"{checks['ranks_with_steps']}/{TASKS} ranks with steps on the server (step p50 "
          f"{(checks['step_p50'] or 0) * 1e3:.1f} ms), push failures {checks['push_failures']:.0f}, "
          f"spooled {checks['spool_reports']:.0f}, scrape failures {sum(w.scrape_failures for w in windows)}")
    met = ratio <= TARGET_RATIO
    print()
    print(f"  agent CPU per cycle / node-exporter CPU per scrape {ratio:>8.2f}x   target <= {TARGET_RATIO}x "
          f"{'ok' if met else 'MISSED'}")
    return met


def record(args: argparse.Namespace, windows: list[Window], loads: tuple[str, str], watcher: str) -> None:
    ratios = [w.agent_per_cycle / w.exporter_per_scrape for w in windows]
    conditions = (f"{machine()}; {'sequential' if args.sequential else 'simultaneous'} windows of "
                  f"{args.duration}s x {args.rounds}; agent: host + sim:{SIM_ACCELERATORS}, interval "
                  f"{args.interval:g}s, {TASKS} SDK tasks ({args.step_ms:g} ms steps), exit watcher {watcher}; "
                  f"agent/exporter ratio median {statistics.median(ratios):.2f} range "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}] (target <= {TARGET_RATIO}); "
                  f"load average before {loads[0]}, after {loads[1]}")
    figures = {"sentinel_agent_cpu_seconds_per_cycle": figure([w.agent_per_cycle for w in windows]),
               "node_exporter_cpu_seconds_per_scrape": figure([w.exporter_per_scrape for w in windows])}
    record_figures(figures, source=command_line(), conditions=conditions, path=args.record)
    report_recorded(args.record, figures)


def orchestrate(args: argparse.Namespace) -> int:
    say: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
    procs = Processes()
    data_dir = Path(tempfile.mkdtemp(prefix="sentinel-agent-cpu-"))
    profiler: subprocess.Popen[bytes] | None = None
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        env["SENTINEL_DATA_DIR"] = str(data_dir)
        setup = setup_cluster(args, procs, env, data_dir, say)
        exporter_proc: subprocess.Popen[bytes] | None = None
        exporter_ps: psutil.Process | None = None
        scraper: Scraper | None = None

        def exporter_up() -> tuple[psutil.Process, Scraper]:
            nonlocal exporter_proc
            exporter_proc, port = start_exporter(procs, env, data_dir)
            say(f"node exporter on {HOST}:{port} (pid {exporter_proc.pid})")
            return psutil.Process(exporter_proc.pid), Scraper(port)

        if not args.sequential:
            exporter_ps, scraper = exporter_up()
            scraper.scrape()  # the first scrape builds the collectors' state; not measured
        say(f"warming up {args.warmup:g}s")
        time.sleep(args.warmup)
        load_before = load()
        say(f"load average before measuring: {load_before}")
        if args.py_spy:
            py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            seconds = int(args.rounds * (args.duration + 2) * (2 if args.sequential else 1))
            say(f"profiling the agent with py-spy for {seconds}s into {args.py_spy} (measurements perturbed)")
            profiler = subprocess.Popen([py_spy, "record", "--pid", str(setup.agent.pid), "--duration", str(seconds),
                                         "--rate", str(args.py_spy_rate), "--format", "raw", "--threads",
                                         "--nonblocking", "--output", args.py_spy],
                                        stdout=subprocess.DEVNULL, start_new_session=True)
        windows: list[Window] = []
        for r in range(args.rounds):
            if args.sequential:
                agent_w = measure_window(setup, procs, args.duration, args.interval, agent=True, exporter=None,
                                         scraper=None)
                exporter_ps, scraper = exporter_up()
                scraper.scrape()
                time.sleep(1.0)
                exporter_w = measure_window(setup, procs, args.duration, args.interval, agent=False,
                                            exporter=exporter_ps, scraper=scraper)
                scraper.close()
                assert exporter_proc is not None
                procs.stop(exporter_proc)
                agent_w.exporter_cpu, agent_w.scrapes = exporter_w.exporter_cpu, exporter_w.scrapes
                agent_w.scrape_failures = exporter_w.scrape_failures
                window = agent_w
            else:
                window = measure_window(setup, procs, args.duration, args.interval, agent=True, exporter=exporter_ps,
                                        scraper=scraper)
            windows.append(window)
            say(f"round {r + 1}/{args.rounds}: agent {window.agent_per_cycle * 1e3:.2f} ms/cycle over "
                f"{window.reports} reports, node exporter {window.exporter_per_scrape * 1e3:.2f} ms/scrape over "
                f"{window.scrapes} scrapes")
        checks = verify(setup)
        rss = {"agent": float(psutil.Process(setup.agent.pid).memory_info().rss),
               "exporter": float(exporter_ps.memory_info().rss) if exporter_ps is not None and not args.sequential
               else float("nan")}
        if scraper is not None:
            scraper.close()
        watcher = exit_watcher_mode(data_dir / "agent.log")
        met = print_report(args, windows, checks, rss, watcher)
        load_after = load()
        print(f"  load average: before {load_before}, after {load_after}")
        if args.record is not None:
            record(args, windows, (load_before, load_after), watcher)
        else:
            report_recorded(None, {})
        if profiler is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(timeout=30)
        if args.json:
            Path(args.json).write_text(json.dumps({"windows": [w.__dict__ for w in windows], "checks": checks,
                                                   "rss": rss, "sequential": args.sequential}, indent=2))
        if any(w.reports < args.duration - 1 for w in windows):
            print("warning: the agent sent fewer reports than intervals in a window", file=sys.stderr)
            return 1
        return 0 if met or not args.check_targets else 3
    except (BenchError, psutil.Error) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        for name, _, log in procs.procs:
            if log.exists() and log.stat().st_size and not name.startswith("task"):
                print(f"--- {name} log tail ---\n{tail(log)}", file=sys.stderr)
        return 2
    finally:
        if profiler is not None and profiler.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(profiler.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(timeout=15)
        procs.stop_all()
        if args.keep:
            print(f"kept {data_dir}", file=sys.stderr)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=30, help="seconds (= agent cycles) per window (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="windows, back to back (default 3)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after setup before measuring (default 5)")
    parser.add_argument("--interval", type=float, default=1.0, help="agent collection interval (default 1s)")
    parser.add_argument("--step-ms", type=float, default=10.0, help="the tasks' step length (default 10 ms)")
    parser.add_argument("--sequential", action="store_true",
                        help="measure the agent alone, then the exporter, in each round (default: both at once)")
    parser.add_argument("--py-spy", default=None, metavar="FILE",
                        help="also profile the agent with py-spy (raw collapsed stacks into FILE)")
    parser.add_argument("--py-spy-rate", type=int, default=250, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs) afterwards")
    add_record_arguments(parser)
    parser.add_argument("--check-targets", action="store_true", help="exit 3 when the target is missed")
    parser.add_argument("--start-timeout", type=float, default=90.0, help=argparse.SUPPRESS)
    parser.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--agent-url", help=argparse.SUPPRESS)
    parser.add_argument("--max-seconds", type=float, default=600.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task:
        run_task(args.job, args.rank, args.agent_url, args.step_ms, args.max_seconds)
        return 0
    if not (5 <= args.duration <= 3600 and 1 <= args.rounds <= 20 and 0 <= args.warmup <= 600
            and 0.2 <= args.interval <= 60 and 0 < args.step_ms <= 10_000):
        parser.error("--duration, --rounds, --warmup, --interval or --step-ms out of range")
    if not os.access(NODE_EXPORTER, os.X_OK):
        print(f"error: {NODE_EXPORTER} is not installed; this benchmark compares against it.\n"
              "  install it with: sudo apt-get install -y prometheus-node-exporter\n"
              "  (the package's service need not run: the benchmark starts its own on a loopback port)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
