"""Serving (issue 16): adaptive batching against fixed batch limits under a 3x spike, replica failover, and
detection of a frozen and an empty-answering replica.

Every request is timed by the benchmark's own client (sentinel/demo/load.py), never by Sentinel. The engine
is the project's own (sentinel/demo/engine.py: continuous batching over a timed decode loop — a step takes
10 ms + 2 ms per request in the batch + 0.2 ms per prompt token admitted — not a model): vLLM on two CPU
cores is too slow to show a spike (ENVIRONMENT.md). A request is within the SLO when its TTFT ≤ 0.5 s and its
TPOT ((end − first token) ÷ (tokens − 1)) ≤ 50 ms, as the client saw them, and it came to its [DONE].

batching: one replica behind the router, in this process; the load is 2 requests/s of 48 tokens, 3x for the
middle third. Each fixed limit of `--limits` runs once, then the controller (sentinel/serving/batching.py, fed
the replica's SDK sums each second as the server would be, ticking as often as the server's default
`batching_interval_seconds`) `--rounds` times, starting from the smallest limit: it must find its way itself.
Baseline in the same run: the best fixed limit (highest SLO attainment during the spike, then throughput, on the
first round's arrivals), run again on each further round's arrivals: the load is Poisson with seed 7 + round, so
the rounds see different bursts (one seed for all would repeat one burst pattern and its result). The figures
are the controller's median (and range) spike attainment, and its throughput outside the spike against the best
fixed limit's on the same arrivals.

Who holds the limit (`--held-by`): by default the router, as for vLLM (the engine takes none and reports none;
the launcher says the router's limit and queue): the fixed limits are the router's limit alone, the
controller's runs add what `sentinel launch --serve --slo` adds, admission past the limit for a request that
has waited half its TTFT target while the replica's tokens have room under the TPOT target
(sentinel/serving/router.py). `--held-by engine`: the engine limits itself and the controller alone acts (on
6 December: median 0.960, range 0.932-1.000, one step behind bursts shorter than its loop).

failover, detection: `sentinel demo --serving`'s whole stack per round (a server on SQLite, two agents, the
launcher with the router and two replicas, the client load): replica r1 freezes mid-stream (`freeze`) or
answers 200 with no token (`empty`); fault → incident open, fault → the replacement serving (the order's
completed_at), and the client's requests that failed between the fault and the cut-over. Detector options
are the defaults (a stall is one after 10 s) unless `--stall-seconds` says otherwise.

    PYTHONPATH=. .venv/bin/python benchmarks/serving.py --part batching --rounds 3 [--phase-seconds 20]
    PYTHONPATH=. .venv/bin/python benchmarks/serving.py --part failover --rounds 3 [--stall-seconds 3]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from support import free_port, load, say  # noqa: E402

from sentinel.config import Settings  # noqa: E402
from sentinel.demo.engine import Engine, serve  # noqa: E402
from sentinel.demo.load import Answer, Load  # noqa: E402
from sentinel.sdk.serving import Requests  # noqa: E402
from sentinel.serving.batching import BatchingController, Limits  # noqa: E402
from sentinel.serving.router import Router  # noqa: E402
from sentinel.serving.signals import ServingView, Slo  # noqa: E402
from sentinel.telemetry.serving import ServingStats  # noqa: E402

TTFT, TPOT = 0.5, 0.05
TICK = max(1, round(Settings().batching_interval_seconds))  # the controller's turn, as the server's default
NORMAL_RATE = 2.0
SEED = 7  # the load's arrivals (Poisson): round r of the controller runs seed 7 + r


def within(a: Answer) -> bool:
    if not a.ok or a.ttft is None or a.ttft > TTFT:
        return False
    return a.tokens <= 1 or (a.seconds - a.ttft) / (a.tokens - 1) <= TPOT


def one_run(limit: int, adaptive: bool, phase: float, seed: int = 7, held_by: str = "router") -> dict[str, Any]:
    requests = Requests(replica="r0")
    by_router = held_by == "router"
    # held by the router: the engine takes no limit (as vLLM) and the router holds it, with the SLO for the
    # controller's runs (admission past the limit near the TTFT target); held by the engine: it limits itself
    engine = Engine(max_batch=4096 if by_router else limit, requests=requests, takes_limit=not by_router)
    httpd = serve(engine, "127.0.0.1", 0)
    router = Router(queue_seconds=60.0, read_seconds=30.0, limit=limit if by_router else None,
                    slo=(TTFT, TPOT) if by_router and adaptive else None)
    router.wait_ready(router.add("r0", int(httpd.server_address[1])), timeout=5)
    view = ServingView(window_seconds=60.0)
    view.set_slo(1, Slo(TTFT, TPOT))
    changes: list[tuple[float, int, int]] = []

    def apply(job_id: int, params: dict[str, int], reason: str) -> str:  # as the launcher does for this engine
        if by_router:
            router.set_limit(params["batch_limit"])
        else:
            with engine.wake:
                engine.max_batch = params["batch_limit"]
        changes.append((time.time(), limit if not changes else changes[-1][2], params["batch_limit"]))
        return "applied"

    controller = BatchingController(view, apply, limits=Limits(cooldown_seconds=5.0, window_seconds=10.0))
    stop = threading.Event()

    def feed() -> None:  # the agent and the server, in one: the replica's sums each second into the view
        ticks = 0
        while not stop.wait(1.0):
            view.add("bench", 1, 0, ServingStats(**requests.take()), time.time())
            with router.cond:  # what the launcher says of its router (sentinel/launcher/router_queue.py)
                waiting, held = router.waiting, router.limit
            view.set_router_waiting(1, waiting, time.time(), limit=held)
            ticks += 1
            if adaptive and ticks % TICK == 0:
                controller.tick(time.time())

    threading.Thread(target=feed, daemon=True).start()
    client = Load("127.0.0.1", router.httpd.server_address[1], rate=NORMAL_RATE, max_tokens=48, seed=seed)
    start = time.time()
    client.start()
    time.sleep(phase)
    client.rate = 3 * NORMAL_RATE
    spike = time.time()
    time.sleep(phase)
    client.rate = NORMAL_RATE
    calm = time.time()
    time.sleep(phase)
    end = time.time()
    client.stop(wait=60)
    stop.set()
    router.close()
    httpd.shutdown()
    httpd.server_close()
    outside = client.between(start, spike) + client.between(calm, end)
    during = client.between(spike, calm)
    rushed = router.snapshot()["counts"]["rushed"]
    return {"limit": limit, "adaptive": adaptive, "seed": seed, "rushed": rushed,
            "spike_attainment": sum(map(within, during)) / max(len(during), 1), "spike_requests": len(during),
            "outside_attainment": sum(map(within, outside)) / max(len(outside), 1),
            "outside_throughput": sum(a.ok for a in outside) / (2 * phase),
            "final_limit": changes[-1][2] if changes else limit, "changes": len(changes),
            "steps": [(round(at - spike, 1), after) for at, _, after in changes]}


def batching(args: argparse.Namespace) -> None:
    limits = sorted(int(x) for x in args.limits.split(","))
    say(f"batching: one replica, {NORMAL_RATE:g} req/s, 3x for {args.phase_seconds:g} s in the middle; SLO TTFT "
        f"{TTFT * 1000:.0f} ms, TPOT {TPOT * 1000:.0f} ms; the limit held by the {args.held_by}; load {load()}")
    runs = []
    for limit in limits:
        runs.append(one_run(limit, False, args.phase_seconds, SEED, args.held_by))
        say(row(runs[-1]))
    fixed = list(runs)
    best = max(fixed, key=lambda r: (r["spike_attainment"], r["outside_throughput"]))
    mine, baseline = [], {SEED: best}
    for round_ in range(args.rounds):  # each round its own arrivals; the best fixed limit on the same arrivals
        seed = SEED + round_
        if seed not in baseline:
            baseline[seed] = one_run(best["limit"], False, args.phase_seconds, seed, args.held_by)
            say(row(baseline[seed]))
        mine.append(one_run(limits[0], True, args.phase_seconds, seed, args.held_by))
        say(row(mine[-1]))
    spike = [r["spike_attainment"] for r in mine]
    ratio = [r["outside_throughput"] / max(baseline[r["seed"]]["outside_throughput"], 1e-9) for r in mine]
    median, ratio_median = statistics.median(spike), statistics.median(ratio)
    fixed_spike = [baseline[r["seed"]]["spike_attainment"] for r in mine]
    say(f"best fixed limit: {best['limit']} (spike attainment {best['spike_attainment']:.3f} on seed {SEED}; on the "
        f"rounds' arrivals {', '.join(f'{x:.3f}' for x in fixed_spike)})")
    say(f"controller (from {limits[0]}) vs best fixed, {len(mine)} run(s): spike attainment median {median:.3f} "
        f"(range {min(spike):.3f}–{max(spike):.3f}) vs {statistics.median(fixed_spike):.3f} (target >= 0.99: "
        f"{'met' if median >= 0.99 else 'MISSED'}); throughput outside the spike median {ratio_median:.3f}x (range "
        f"{min(ratio):.3f}–{max(ratio):.3f}; target >= 0.95: {'met' if ratio_median >= 0.95 else 'MISSED'})")


def row(r: dict[str, Any]) -> str:
    who = f"controller from {r['limit']} (ended at {r['final_limit']}, {r['changes']} changes)" if r["adaptive"] \
        else f"fixed limit {r['limit']}"
    who += f", seed {r['seed']}"
    steps = ", ".join(f"{after} at {at:+.0f} s" for at, after in r["steps"])
    return (f"  {who:48} spike: {r['spike_attainment']:.3f} within SLO of {r['spike_requests']}; outside: "
            f"{r['outside_attainment']:.3f} within, {r['outside_throughput']:.2f} ok/s"
            + (f"; limit {steps} (from the spike's start)" if steps else "")
            + (f"; {r['rushed']} admitted past the limit" if r["rushed"] else ""))


def failover(args: argparse.Namespace) -> None:
    from sentinel.demo.serving import ServingDemo

    options = {"serving_stall": {"stall_seconds": args.stall_seconds}} if args.stall_seconds else {}
    say(f"failover: `sentinel demo --serving` per round; detector options {options or 'defaults'}; load {load()}")
    results: dict[str, list[dict[str, Any]]] = {}
    for fault in args.faults.split(","):
        for n in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="sentinel-bench-serving-") as tmp:
                demo = ServingDemo(data_dir=Path(tmp), port=free_port(), fault=(fault, None),
                                   console=Console(file=io.StringIO(), width=100), detector_options=options)
                try:
                    figures = demo.run()
                finally:
                    demo.stop()
            cut = figures["client_fault_to_cutover"]
            results.setdefault(fault, []).append(figures)
            say(f"  {fault} round {n + 1}: fault → incident {figures['injected_to_open_seconds']:.2f} s, → serving "
                f"again {figures['injected_to_serving_seconds']:.2f} s; client requests failed fault → cut-over: "
                f"{cut['failed']} of {cut['requests']}; {figures['order_result'][:160]}")
    for fault, rounds in results.items():
        opened = [r["injected_to_open_seconds"] for r in rounds]
        served = [r["injected_to_serving_seconds"] for r in rounds]
        failed = sum(r["client_fault_to_cutover"]["failed"] for r in rounds)
        sent = sum(r["client_fault_to_cutover"]["requests"] for r in rounds)
        say(f"{fault}: fault → incident median {statistics.median(opened):.2f} s (range {min(opened):.2f}–"
            f"{max(opened):.2f}); fault → serving again median {statistics.median(served):.2f} s (range "
            f"{min(served):.2f}–{max(served):.2f}; target < 5 s: "
            f"{'met' if statistics.median(served) < 5 else 'MISSED'}); failed {failed} of {sent} client requests "
            f"between fault and cut-over ({100 * failed / max(sent, 1):.1f} %, target <= 1 %)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["batching", "failover", "all"], default="all")
    parser.add_argument("--limits", default="4,8,16,64", help="the fixed batch limits to run (the controller "
                        "starts from the smallest)")
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--held-by", choices=["router", "engine"], default="router",
                        help="batching: who holds the batch limit (router: as for vLLM, with admission past it near "
                             "the TTFT target in the controller's runs; engine: the engine limits itself)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--faults", default="freeze,empty")
    parser.add_argument("--stall-seconds", type=float, default=None)
    args = parser.parse_args()
    if args.part in ("batching", "all"):
        batching(args)
    if args.part in ("failover", "all"):
        failover(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
