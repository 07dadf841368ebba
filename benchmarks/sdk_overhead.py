"""SDK overhead benchmark: what `sentinel.sdk.Telemetry` adds to one training step.

    PYTHONPATH=. python benchmarks/sdk_overhead.py [--rounds 5] [--steps 3000] [--step-rate 1000]

One iteration of the measured loop is

    with tel.step(tokens=4096):
        with tel.collective("all_reduce", nbytes=...):
            pass

and its baseline is the same structure with no SDK: `with nullcontext(): with nullcontext(): pass`.
Each iteration is timed on its own (perf_counter_ns before and after; the timer's cost is the same in
every variant and cancels in the difference). Variants, all in one process and one run:

* empty      the baseline;
* sdk        `Telemetry(start_thread=False)`; every 1,000th iteration also calls `take_batch()` inside
             its timed window, as the background flush would (it shows in the mean, not the median);
* sdk+drop   the background thread running, flushing every second to a closed loopback port: every
             batch is refused and dropped (the agent is away);
* sdk+http   the background thread running against a real HTTP server (a `http.server` in a separate
             process, like the agent: it reads and parses each POST and answers 204), so batches are
             serialized and sent for real.

Pacing: a real step is milliseconds of compute, not a tight loop, and a tight loop would also overflow
the SDK's 10,000-step buffer between two flushes (each later step then pays `list.pop(0)`) and send
10,000-step batches, neither of which happens in training. So by default every variant runs at
`--step-rate` 1,000 iterations/s, busy-waiting (holding the GIL, like Python-bound training code)
between iterations; at that rate `take_batch()` every 1,000 steps is the same once-a-second flush the
thread does. `--step-rate 0` runs unpaced.

The flush thread's own CPU (per-thread clock) is reported per step: it runs beside the loop, mostly
outside the timed windows, and under the GIL it is time the training thread could have had, so
"all-in" = mean added per step + flush-thread CPU per step is the pessimistic total.

Rounds interleave the variants (the order rotates every round) so drift on a noisy machine hits them
all alike. Reported: per-round medians, the median over rounds of (variant median - baseline median)
in µs, and the ratio variant / baseline. Target: <= 20 µs median added per step.
Loopback only; every loop is bounded and the HTTP server process is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
TARGET_ADDED_US = 20.0
TOKENS = 4096
NBYTES = 64 * 2**20
TAKE_BATCH_EVERY = 1000
VARIANTS = ("empty", "sdk", "sdk+drop", "sdk+http")
DESCRIPTIONS = {
    "empty": "with nullcontext(): with nullcontext(): pass",
    "sdk": "Telemetry(start_thread=False), take_batch() every 1,000 steps",
    "sdk+drop": "background thread on, agent port closed (batches dropped)",
    "sdk+http": "background thread on, real HTTP server takes the batches",
}


# --------------------------------------------------------------------------------------------------
# The stand-in agent endpoint (run with --sink PORT in its own process)
# --------------------------------------------------------------------------------------------------

def serve_sink(port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                json.loads(body)
                status = 204
            except ValueError:
                status = 422
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        server.serve_forever(poll_interval=0.5)
    server.server_close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the HTTP sink exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1.0):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the HTTP sink did not listen on {HOST}:{port} within {timeout:.0f}s")


# --------------------------------------------------------------------------------------------------
# The measured loops: one iteration timed at a time, the same bookkeeping in both
# --------------------------------------------------------------------------------------------------

def loop_empty(steps: int, period_ns: int) -> list[int]:
    samples = [0] * steps
    clock = time.perf_counter_ns
    next_at = clock()
    for i in range(steps):
        t0 = clock()
        with nullcontext(), nullcontext():
            pass
        if i % TAKE_BATCH_EVERY == TAKE_BATCH_EVERY - 1:
            pass
        samples[i] = clock() - t0
        if period_ns:
            next_at = max(next_at + period_ns, t0)
            while clock() < next_at:
                pass
    return samples


def loop_sdk(tel: Any, steps: int, period_ns: int, take_batch: bool) -> list[int]:
    samples = [0] * steps
    clock = time.perf_counter_ns
    next_at = clock()
    for i in range(steps):
        t0 = clock()
        with tel.step(tokens=TOKENS), tel.collective("all_reduce", nbytes=NBYTES):
            pass
        if i % TAKE_BATCH_EVERY == TAKE_BATCH_EVERY - 1 and take_batch:
            tel.take_batch()
        samples[i] = clock() - t0
        if period_ns:
            next_at = max(next_at + period_ns, t0)
            while clock() < next_at:
                pass
    return samples


def thread_cpu_seconds(thread: Any) -> float:
    if thread is None or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except OSError:  # the thread has ended
        return 0.0


@dataclass
class Segment:
    variant: str
    median_us: float
    mean_us: float
    p99_us: float
    steps: int
    thread_cpu_us_per_step: float = 0.0
    sent: int = 0
    dropped: int = 0
    dropped_steps: int = 0


def run_segment(variant: str, steps: int, period_ns: int, urls: dict[str, str]) -> Segment:
    from sentinel.sdk.telemetry import Telemetry

    gc.collect()
    if variant == "empty":
        samples = loop_empty(steps, period_ns)
        seg = Segment(variant, 0.0, 0.0, 0.0, steps)
    else:
        threaded = variant != "sdk"
        tel = Telemetry(job_id=1, rank=0, agent_url=urls.get(variant), start_thread=threaded,
                        flush_interval_seconds=1.0)
        thread = tel._thread  # the SDK's flush thread, for its CPU clock
        cpu0 = thread_cpu_seconds(thread)
        samples = loop_sdk(tel, steps, period_ns, take_batch=not threaded)
        cpu1 = thread_cpu_seconds(thread)
        tel._stop.set()  # stop the thread without the final flush that close() does
        if thread is not None:
            thread.join(timeout=5)
        seg = Segment(variant, 0.0, 0.0, 0.0, steps, thread_cpu_us_per_step=(cpu1 - cpu0) / steps * 1e6,
                      sent=tel.sent_batches, dropped=tel.dropped_batches, dropped_steps=tel.dropped_steps)
    ordered = sorted(samples)
    seg.median_us = statistics.median(ordered) / 1e3
    seg.mean_us = statistics.fmean(ordered) / 1e3
    seg.p99_us = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] / 1e3
    return seg


# --------------------------------------------------------------------------------------------------
# Orchestration and the report
# --------------------------------------------------------------------------------------------------

@dataclass
class Rounds:
    by_variant: dict[str, list[Segment]] = field(default_factory=lambda: {v: [] for v in VARIANTS})


def measure(args: argparse.Namespace, urls: dict[str, str], progress: Callable[[str], None]) -> Rounds:
    period_ns = int(1e9 / args.step_rate) if args.step_rate > 0 else 0
    warm = max(200, args.steps // 10)
    for variant in VARIANTS:  # warm-up: imports, the first connections, the allocator
        run_segment(variant, warm, period_ns, urls)
    result = Rounds()
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            result.by_variant[variant].append(run_segment(variant, args.steps, period_ns, urls))
        base = result.by_variant["empty"][-1].median_us
        progress(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{v} {result.by_variant[v][-1].median_us - base:+.2f}" for v in VARIANTS[1:]) + " µs vs empty")
    return result


def print_report(args: argparse.Namespace, rounds: Rounds) -> bool:
    empty = rounds.by_variant["empty"]
    print()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}   rounds: {args.rounds} x "
          f"{args.steps} steps per variant   pacing: "
          + (f"{args.step_rate:g} steps/s (busy-wait between steps)" if args.step_rate > 0 else "none (tight loop)"))
    for v in VARIANTS:
        print(f"  {v:<9} {DESCRIPTIONS[v]}")
    print()
    print("median µs per iteration, by round (order rotates every round):")
    header = f"{'variant':<10}" + "".join(f"{'r' + str(i + 1):>9}" for i in range(args.rounds))
    print(header)
    print("-" * len(header))
    for v in VARIANTS:
        print(f"{v:<10}" + "".join(f"{s.median_us:>9.2f}" for s in rounds.by_variant[v]))
    print()
    header = (f"{'variant':<10}{'median':>9}{'added':>9}{'ratio':>8}{'mean':>9}{'added':>9}{'p99':>9}"
              f"{'thread':>9}{'all-in':>9}{'batches':>16}")
    print(header)
    print(f"{'':<10}{'µs':>9}{'median':>9}{'':>8}{'µs':>9}{'mean':>9}{'µs':>9}{'µs/step':>9}{'µs/step':>9}"
          f"{'sent/dropped':>16}")
    print("-" * len(header))
    added_median: dict[str, float] = {}
    for v in VARIANTS:
        segs = rounds.by_variant[v]
        diffs = [s.median_us - e.median_us for s, e in zip(segs, empty, strict=True)]
        mean_diffs = [s.mean_us - e.mean_us for s, e in zip(segs, empty, strict=True)]
        ratios = [s.median_us / e.median_us for s, e in zip(segs, empty, strict=True) if e.median_us > 0]
        thread = statistics.median(s.thread_cpu_us_per_step for s in segs)
        added_median[v] = statistics.median(diffs)
        all_in = statistics.median(mean_diffs) + thread
        batches = f"{sum(s.sent for s in segs)}/{sum(s.dropped for s in segs)}" if v not in ("empty", "sdk") else "-"
        print(f"{v:<10}{statistics.median(s.median_us for s in segs):>9.2f}{added_median[v]:>+9.2f}"
              f"{statistics.median(ratios) if ratios else float('nan'):>7.2f}x"
              f"{statistics.median(s.mean_us for s in segs):>9.2f}{statistics.median(mean_diffs):>+9.2f}"
              f"{statistics.median(s.p99_us for s in segs):>9.2f}{thread:>9.2f}{all_in:>+9.2f}{batches:>16}")
    lost = sum(s.dropped_steps for v in VARIANTS for s in rounds.by_variant[v])
    print("  (median/mean/p99: of the per-iteration times, median over rounds; 'added': median over rounds of "
          "variant - empty in the same round;\n   ratio: median over rounds of variant / empty; thread: the SDK "
          "flush thread's CPU per step; all-in: added mean + thread)")
    if lost:
        print(f"  note: {lost} steps overflowed the SDK's buffer between flushes (unpaced loop?)")
    print()
    ok = True
    for v in VARIANTS[1:]:
        met = added_median[v] <= TARGET_ADDED_US
        ok = ok and met
        print(f"  {v + ': median added per step':<36}{added_median[v]:>8.2f} µs   target <= {TARGET_ADDED_US:g} µs "
              f"{'ok' if met else 'MISSED'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of all variants (default 5)")
    parser.add_argument("--steps", type=int, default=3000, help="timed iterations per variant and round (default 3000)")
    parser.add_argument("--step-rate", type=float, default=1000.0,
                        help="iterations per second, busy-waiting between them; 0 = unpaced (default 1000)")
    parser.add_argument("--json", default=None, help="also write the per-round results to this file")
    parser.add_argument("--check-targets", action="store_true", help="exit 3 when the target is missed")
    parser.add_argument("--sink", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        serve_sink(args.sink)
        return 0
    if not (1 <= args.rounds <= 100 and 100 <= args.steps <= 10_000_000 and 0 <= args.step_rate <= 1e6):
        parser.error("--rounds, --steps or --step-rate out of range")
    sys.path.insert(0, str(REPO))
    logging.getLogger("sentinel.sdk").setLevel(logging.ERROR)  # sdk+drop warns on purpose; keep the table readable

    sink_port, closed_port = free_port(), free_port()  # nothing listens on closed_port
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    sink = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--sink", str(sink_port)], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        wait_for_port(sink_port, sink)
        urls = {"sdk": f"http://{HOST}:{closed_port}", "sdk+drop": f"http://{HOST}:{closed_port}",
                "sdk+http": f"http://{HOST}:{sink_port}"}
        seconds = len(VARIANTS) * args.rounds * args.steps / args.step_rate if args.step_rate else 0
        print(f"HTTP sink on {HOST}:{sink_port} (pid {sink.pid}), closed port {closed_port}; "
              f"{args.rounds} rounds x {len(VARIANTS)} variants x {args.steps} steps"
              + (f" (~{seconds:.0f}s)" if seconds else ""), flush=True)
        rounds = measure(args, urls, lambda line: print(line, flush=True))
        if sink.poll() is not None:
            raise RuntimeError(f"the HTTP sink exited with status {sink.returncode}")
        ok = print_report(args, rounds)
        http_sent = sum(s.sent for s in rounds.by_variant["sdk+http"])
        if http_sent == 0:
            print("warning: sdk+http sent no batch: the flush thread never reached the HTTP server", file=sys.stderr)
        if args.json:
            Path(args.json).write_text(json.dumps({v: [s.__dict__ for s in segs]
                                                   for v, segs in rounds.by_variant.items()}, indent=2))
        return 0 if ok or not args.check_targets else 3
    except RuntimeError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 2
    finally:
        if sink.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sink.pid, signal.SIGTERM)
            try:
                sink.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(sink.pid, signal.SIGKILL)
                sink.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
