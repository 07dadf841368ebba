"""Network-tier benchmark: what the probe mesh costs as the fleet grows, and how fast it places a real fault.

    PYTHONPATH=. python benchmarks/network.py [--sizes 100,1000,10000] [--runs 10] [--hosts 16]
                                              [--skip-cost] [--skip-lab]

1. **Cost per node per interval** at N simulated nodes, against a full mesh measured in the same run.
   *Agent side*: a real `Prober` (collectors/probes.py) sends one round to its targets on loopback, answered by
   four real `ProbeResponder`s (rate limit lifted) standing for the peers: CPU seconds and packets per round
   with the mesh's k targets, and with the full mesh's N - 1. *Server side* (in process, no I/O): the real
   `NetworkView` with N participants; each round every node takes its targets (the ack) and reports its
   results for the round, then the localisation runs once over a window of two rounds; the CPU of a
   steady-state round ÷ N. The full mesh runs the same code with k = N - 1, up to `--full-max` nodes (its
   state grows as N², 10,000 nodes would hold 10^8 pairs); above that its packets are counted, not run.
2. **Link down → incident** (root, network namespaces; tests/network/netlab.py): `--hosts` agents, each in
   its own namespace on a bridge, probing `probe_peers` others every `--probe-interval` s; a Sentinel server on
   the bridge. Each run takes one host's veth down with `ip link set … down` and times from just before
   that to the probe_mesh incident's `opened_at` (the server's clock, same machine). A different host per
   run; the link comes back and the window clears before the next.
3. **Degraded link → localisation**: each run slows one pair (a seeded random pair, different each run) by
   `--delay` s each way through the lab's TUN delay line (this kernel has no netem), and waits for a
   probe_mesh "slow link" incident; right = it names exactly that pair. Time from the change to `opened_at`.

Settings of the lab's server: probe_peers 6, probe_round_seconds 2, probe_window_seconds 12 (the drill's);
`--shipped-defaults` runs it at 8 / 10 s / 60 s, which makes localisation slower, not the link-down page.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime
from pathlib import Path
from typing import Any

from collectors.probes import Prober, ProbeResponder
from sentinel.network.localise import Thresholds
from sentinel.network.view import NetworkView
from sentinel.telemetry.schemas import ProbeResult, ProbeTarget

K = 8
ROUND = 10.0


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def say(text: str) -> None:
    print(text, flush=True)


# -- 1. cost ---------------------------------------------------------------------------------------------------

def agent_round(responders: list[ProbeResponder], targets: int, rounds: int = 3) -> tuple[float, int]:
    """(CPU seconds of one probe round with `targets` peers, replies received in it), median of `rounds`."""
    prober = Prober("bench", timeout_seconds=0.2, max_targets=targets)  # the full mesh: no cap
    prober.set_targets([ProbeTarget(node=f"p{i}", address=responders[i % len(responders)].address)
                        for i in range(targets)])
    costs, got = [], []
    for _ in range(rounds):
        before = cpu()
        rtts = prober.probe_round()
        costs.append(cpu() - before)
        got.append(sum(1 for r in rtts.values() if r is not None))
        prober.drain()
    prober.close()
    return statistics.median(costs), int(statistics.median(got))


def server_round(n: int, k: int, rounds: int = 3) -> tuple[float, int]:
    """(CPU seconds per node of a steady-state round, pairs held) for N nodes probing k peers each."""
    view = NetworkView.build(peers=k, round_seconds=ROUND, window_seconds=2 * ROUND, rules=[],
                             thresholds=Thresholds(), domain_labels=("rack",))
    for i in range(n):
        view.registered(f"n{i}", {"probe_addr": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:9600",
                                  "rack": f"r{i // 32}"})
    rng = random.Random(n)
    costs = []
    now = 1_000_000.0
    for r in range(2 + rounds):  # two rounds fill the window; the rest are measured
        now += ROUND
        before = cpu()
        for i in range(n):
            node = f"n{i}"
            targets = view.targets(node, now) or []
            results = [ProbeResult(target=t.node, sent=10, received=10, rtt_p50_seconds=0.0002 + rng.random() * 1e-4,
                                   rtt_p99_seconds=0.0005, rtt_max_seconds=0.0006, started_at=now - ROUND,
                                   ended_at=now) for t in targets]
            view.reported(node, results, [], now)
        view.matrix.prune(now)
        view.localisation(now, fresh=True)
        if r >= 2:
            costs.append((cpu() - before) / n)
    return statistics.median(costs), len(view.matrix.pairs(now))


def cost(sizes: list[int], full_max: int) -> None:
    say("\n1. probe cost per node per interval (one round = one interval)")
    responders = [ProbeResponder("127.0.0.1", 0, rate=1e7, burst=1e7) for _ in range(4)]
    for r in responders:
        r.start()
    try:
        rows = []
        for n in sizes:
            mesh_agent, mesh_got = agent_round(responders, min(K, n - 1))
            full_agent, full_got = agent_round(responders, n - 1)
            mesh_server, mesh_pairs = server_round(n, K)
            full = server_round(n, n - 1) if n <= full_max else None
            rows.append((n, mesh_agent, full_agent, mesh_got, full_got, mesh_server, mesh_pairs, full))
            say(f"  N={n:>6,}: agent mesh {mesh_agent * 1e3:7.2f} ms/round ({min(K, n - 1)} probes, {mesh_got} back)"
                f"   full mesh {full_agent * 1e3:8.2f} ms/round ({n - 1:,} probes, {full_got:,} back)"
                f"   ratio {mesh_agent / full_agent if full_agent else float('nan'):.4f}×")
            server_full = (f"full mesh {full[0] * 1e6:9.1f} µs/node ({full[1]:,} pairs)   ratio "
                           f"{mesh_server / full[0]:.4f}×") if full else f"full mesh not run (N² = {n * n:,} pairs)"
            say(f"            server mesh {mesh_server * 1e6:7.1f} µs/node ({mesh_pairs:,} pairs)   {server_full}")
        tracemalloc.start()
        server_round(sizes[-1], K, rounds=1)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        say(f"  server memory at {sizes[-1]:,} nodes (window of two rounds): {peak / 1e6:.0f} MB peak (tracemalloc)")
        first, last = rows[0], rows[-1]
        say(f"  flatness {last[0]:,} : {first[0]:,} nodes — agent {last[1] / first[1]:.2f}×, server per node "
            f"{last[5] / first[5]:.2f}× (flat = 1.0); probes per node per interval: {K} at every size, "
            f"full mesh {first[0] - 1:,} … {last[0] - 1:,}")
    finally:
        for r in responders:
            r.close()


# -- 2 and 3. the lab ------------------------------------------------------------------------------------------

def opened(incident: dict[str, Any]) -> float:
    return datetime.fromisoformat(incident["opened_at"]).timestamp()


def lab_runs(args: argparse.Namespace) -> int:
    from tests.network.mesh import Mesh, node_name, opened_after, wait_incident
    from tests.network.netlab import Lab

    reason = Lab.available()
    if reason is not None:
        say(f"\n2-3. lab skipped: {reason}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="sentinel-net-"))
    say(f"\n2-3. lab: {args.hosts} agents in namespaces, probe interval {args.probe_interval:g}s (work: {work})")
    env = ({"SENTINEL_PROBE_ROUND_SECONDS": "10", "SENTINEL_PROBE_WINDOW_SECONDS": "60", "SENTINEL_PROBE_PEERS": "8"}
           if args.shipped_defaults else {})
    clear = 62.0 if args.shipped_defaults else 14.0  # how long the window needs to forget a fault
    if env:
        say("  server at the shipped probe settings: probe_peers 8, round 10 s, window 60 s")
    mesh = Mesh(work, args.hosts, probe_interval=args.probe_interval, env=env).start()
    assert mesh.lab is not None
    try:
        down: list[float] = []
        for run in range(args.runs):
            host = (run * 5 + 1) % args.hosts
            t0 = time.time()
            mesh.lab.link_down(host)
            try:
                _, incident = wait_incident(mesh, t0, 30, title="unreachable", node=node_name(host))
                down.append(opened(incident) - t0)
                say(f"  link down {node_name(host)}: incident after {down[-1]:.2f}s")
            except AssertionError:
                say(f"  link down {node_name(host)}: no incident in 30 s")
            finally:
                mesh.lab.link_up(host)
            time.sleep(3)
        if down:
            say(f"  link down → incident: median {statistics.median(down):.2f}s, range {min(down):.2f}–"
                f"{max(down):.2f}s over {len(down)}/{args.runs} runs (target < 2 s: "
                f"{'met' if statistics.median(down) < 2 else 'MISSED'} at the median, "
                f"{sum(1 for d in down if d < 2)}/{args.runs} runs under 2 s)")
        time.sleep(clear)  # the window forgets the cuts
        rng = random.Random(args.seed)
        right, times = 0, []
        for _ in range(args.runs):
            a, b = sorted(rng.sample(range(args.hosts), 2))
            t0 = time.time()
            mesh.lab.degrade_pair(a, b, delay_seconds=args.delay)
            want = f"slow link {node_name(a)}↔{node_name(b)}:"
            try:
                _, incident = wait_incident(mesh, t0, args.localise_timeout, title="slow link", detector="probe_mesh")
                named = [i["title"] for i in opened_after(mesh.incidents(detector="probe_mesh"), t0)]
                ok = incident["title"].startswith(want) and len(named) == 1
                right += ok
                times.append(opened(incident) - t0)
                say(f"  slowed {node_name(a)}↔{node_name(b)}: {'right' if ok else 'WRONG'} after {times[-1]:.1f}s "
                    f"({'; '.join(named)})")
            except AssertionError:
                say(f"  slowed {node_name(a)}↔{node_name(b)}: not localised in {args.localise_timeout:g}s")
            finally:
                mesh.lab.restore_pair(a, b)
            time.sleep(clear)  # the window forgets the slowed pair
        say(f"  degraded link (+{args.delay * 1000:g} ms each way) → localisation: right pair in {right}/{args.runs}"
            f" runs (target ≥ 9/10: {'met' if right >= 0.9 * args.runs else 'MISSED'})"
            + (f", median {statistics.median(times):.1f}s, range {min(times):.1f}–{max(times):.1f}s" if times else ""))
    finally:
        mesh.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--full-max", type=int, default=1000, help="largest N the full-mesh baseline runs at")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--probe-interval", type=float, default=0.5)
    parser.add_argument("--delay", type=float, default=0.02, help="seconds added each way on the slowed pair")
    parser.add_argument("--localise-timeout", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shipped-defaults", action="store_true",
                        help="run the lab's server at the shipped probe settings (8 peers, 10 s round, 60 s window)")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-lab", action="store_true")
    args = parser.parse_args()
    if not args.skip_cost:
        cost([int(x) for x in args.sizes.split(",")], args.full_max)
    if not args.skip_lab:
        return lab_runs(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
