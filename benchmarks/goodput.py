"""Goodput benchmark: the recovery policies on a real fault trace, side by side in one run.

    PYTHONPATH=. python benchmarks/goodput.py [--seeds 10] [--plot docs/goodput.png]

* **Held-out trace days.** The InfiniteHBD trace (sentinel/simulate/traces/, 400 servers) replayed
  on days 121–174 — the shipped learned model (sentinel/policy/learned.json) was fitted and tuned on days
  0–120 only — onto the default scenario (`sentinel simulate --help`: training jobs of 128, 64, 64 and 32
  nodes, serving jobs of 16 and 8 replicas, 8 GiB of state per node) under no Sentinel, Sentinel's
  heuristics and the learned policy. Seeds change the scheduler's node order and the serving spikes, never
  the faults. Printed: ETTR (productive time ÷ wall time) and serving SLO attainment, mean and 95% interval
  over the seeds, and the learned − heuristic margin per seed with its interval. Target: the margin's
  interval above 0 on ETTR, and no loss of serving SLO attainment.
* **Llama 3 rates.** Poisson faults at 419 interruptions in 54 days on 16,384 GPUs (3.79 per 1,000
  8-GPU-node-days) on the same 400 nodes, one 1,024-accelerator job (128 nodes) and the serving jobs, 54
  days. Target: Sentinel's policies keep that job's ETTR ≥ 0.98; no Sentinel alongside.
* **The model check.** Poisson faults, one job, the fixed interval: the simulator's ETTR against
  E[ETTR] ≈ (1 − N·r_f·(u0 + Δt/2)) / (1 + w/Δt); target within 2%.
* **The plot** (matplotlib, when installed): ETTR per policy in 14-day windows over the whole trace.

Costs per event are benchmarks/measured.json's (written by recovery.py and checkpoint.py); what they are
and when they were measured is printed first. The baseline's knobs (collective timeout 600 s, a 30-minute
checkpoint interval) are the scenario's, not measurements.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from support import REPO, say

from sentinel.policy.hazard import HazardModel
from sentinel.simulate.cluster import Scenario
from sentinel.simulate.costs import DEFAULT_PATH, Costs, load_costs
from sentinel.simulate.run import ci95, ettr_model, simulate
from sentinel.simulate.trace import DAY, SHIPPED, Trace, load_trace, synthetic_trace

POLICIES = ["none", "heuristic", "learned"]


def interval(values: list[float]) -> str:
    mean, low, high = ci95(values)
    return f"{mean:.5f} [{low:.5f}, {high:.5f}]"


def held_out(trace: Trace, costs: Costs, model: HazardModel, seeds: int) -> dict[str, Any]:
    runs = [simulate(trace, costs, replace(Scenario(), seed=s), policies=POLICIES, first_day=121, last_day=174,
                     model=model)["policies"] for s in range(1, seeds + 1)]
    say(f"\nheld-out days 121–174 of the trace ({runs[0]['none']['faults']} faults, "
        f"{runs[0]['none']['faults_per_1000_node_days']:.2f} per 1,000 node-days), {seeds} seeds")
    say(f"{'policy':10} {'ETTR mean [95% CI]':>28} {'serving SLO attainment':>28} {'interruptions':>14} "
        f"{'acc-h lost':>11} {'spare acc-h':>11}")
    for p in POLICIES:
        say(f"{p:10} {interval([r[p]['ettr'] for r in runs]):>28} "
            f"{interval([r[p]['serving_slo_attainment'] for r in runs]):>28} "
            f"{statistics.median(sum(j['interruptions'] for j in r[p]['training_jobs']) for r in runs):>14g} "
            f"{statistics.median(r[p]['accelerator_hours_lost']['total'] for r in runs):>11,.0f} "
            f"{statistics.median(r[p]['spare_accelerator_hours_idle'] for r in runs):>11,.0f}")
    margin = [r["learned"]["ettr"] - r["heuristic"]["ettr"] for r in runs]
    slo = [r["learned"]["serving_slo_attainment"] - r["heuristic"]["serving_slo_attainment"] for r in runs]
    m, low, high = ci95(margin)
    say(f"learned − heuristic ETTR: {m:+.5f} [{low:+.5f}, {high:+.5f}] (wins {sum(x > 0 for x in margin)}/{seeds} "
        f"seeds) — target: interval above 0: {'met' if low > 0 else 'MISSED'}")
    say(f"learned − heuristic serving SLO attainment: {interval(slo)} — target: no loss: "
        f"{'met' if min(slo) >= -1e-4 else 'MISSED'}")
    lost = {c: statistics.median(r["learned"]["accelerator_hours_lost"][c] - r["heuristic"]["accelerator_hours_lost"][c]
                                 for r in runs) for c in runs[0]["learned"]["accelerator_hours_lost"]}
    say("learned − heuristic accelerator-hours lost by cause (median): " +
        ", ".join(f"{c} {v:+,.0f}" for c, v in lost.items()))
    return {"runs": runs, "margin": margin, "slo_margin": slo}


def llama3(costs: Costs, model: HazardModel, seeds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p: [] for p in POLICIES}
    for s in range(1, seeds + 1):
        trace = synthetic_trace(nodes=400, days=54, per_1000_node_days=3.79, repair_hours=24, seed=s)
        res = simulate(trace, costs, replace(Scenario(training_nodes=(128,)), seed=s), policies=POLICIES,
                       first_day=0, last_day=54, model=model)["policies"]
        for p in POLICIES:
            out[p].append(res[p]["training_jobs"][0]["ettr"])
    say(f"\nLlama 3 rates (3.79 faults per 1,000 node-days, Poisson, repairs 24 h), one 1,024-accelerator job, "
        f"54 days, {seeds} seeds")
    for p in POLICIES:
        verdict = "" if p == "none" else f" — target ≥ 0.98: {'met' if min(out[p]) >= 0.98 else 'MISSED'}"
        say(f"{p:10} ETTR {interval(out[p])}, min {min(out[p]):.4f}{verdict}")
    return out


def model_check(costs: Costs) -> list[float]:
    say("\nETTR model check (Poisson, one job, the baseline's fixed interval, 1,500 days)")
    errors = []
    for rate, dt, n in ((20.0, 1800.0, 128), (5.0, 1800.0, 256), (100.0, 900.0, 64), (4.0, 3600.0, 128)):
        s = Scenario(training_nodes=(n,), serving_replicas=(), baseline_interval_seconds=dt)
        trace = synthetic_trace(nodes=400, days=1500, per_1000_node_days=rate, repair_hours=24, seed=3)
        got = simulate(trace, costs, s, policies=["none"], first_day=0, last_day=1500)["policies"]["none"]["ettr"]
        u0 = s.baseline_timeout_seconds + costs.cold_restart + s.state_gib_per_node * costs.baseline_restore_per_gib
        want = ettr_model(nodes=n, rate_per_node_second=rate / 1000 / DAY, restart_seconds=u0, interval_seconds=dt,
                          stall_seconds=s.state_gib_per_node * costs.baseline_stall_per_gib)
        errors.append((got - want) / want)
        say(f"  N={n:4} r_f={rate:5.1f}/1000 node-days Δt={dt:5.0f}s: simulated {got:.5f}, model {want:.5f}, "
            f"{100 * errors[-1]:+.2f}% — target within 2%: {'met' if abs(errors[-1]) <= 0.02 else 'MISSED'}")
    return errors


def plot(trace: Trace, costs: Costs, model: HazardModel, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(f"\nno plot: matplotlib is not installed (pip install matplotlib), {path} left as it is")
        return
    starts = list(range(14, 174, 14))
    series: dict[str, list[float]] = {p: [] for p in POLICIES}
    for a in starts:
        res = simulate(trace, costs, Scenario(), policies=POLICIES, first_day=a, last_day=min(174, a + 14),
                       model=model)["policies"]
        for p in POLICIES:
            series[p].append(res[p]["ettr"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for p in POLICIES:
        ax.step([a + 7 for a in starts], series[p], where="mid", label=p)
    ax.axvline(120.5, color="grey", linestyle="--", linewidth=1)
    ax.text(122, ax.get_ylim()[0], " held out →", va="bottom", color="grey")
    ax.set_xlabel("trace day (14-day windows)")
    ax.set_ylabel("ETTR")
    ax.set_title("ETTR per policy over the InfiniteHBD trace (400 nodes)")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    say(f"\nplot: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=SHIPPED)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--costs", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--model", type=Path, default=None, help="default: sentinel/policy/learned.json")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "goodput.png")
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = parser.parse_args()
    costs = load_costs(args.costs)
    model = HazardModel.load(args.model) if args.model else HazardModel.load()
    trace = load_trace(args.trace)
    data = json.loads(args.costs.read_text())["figures"]
    say(f"costs from {args.costs}:")
    for name, entry in sorted(data.items()):
        say(f"  {name} = {entry['value']:g} {entry.get('unit', '')} ({entry.get('source', '?')}, "
            f"{entry.get('measured_at', '?')})")
    for note in costs.notes:
        say(f"  note: {note}")
    say(f"learned model: {model.trained_on}; knobs {json.dumps({k: round(v, 3) for k, v in model.params.items()})}")
    say(f"trace: {trace.source}: {len(trace.nodes)} nodes, {len(trace.faults)} faults, "
        f"{trace.rate_per_1000_node_days(0, 174):.2f} per 1,000 node-days over days 0–174")
    result = {"held_out": held_out(trace, costs, model, args.seeds), "llama3": llama3(costs, model, args.seeds),
              "model_check": model_check(costs)}
    plot(trace, costs, model, args.plot)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
