"""`sentinel simulate --trace FILE`: replay a fault trace (or synthetic faults) under the policies, side by
side, print the table and write the summary (`--json OUT`, `-` for standard output); `--train OUT` fits
and tunes the learned policy on the given days and writes its model."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from sentinel.console import table
from sentinel.policy.hazard import DEFAULT_PATH as MODEL_PATH
from sentinel.policy.hazard import HazardModel
from sentinel.simulate.cluster import Scenario
from sentinel.simulate.costs import DEFAULT_PATH as COSTS_PATH
from sentinel.simulate.costs import CostsError, load_costs
from sentinel.simulate.run import ci95, simulate
from sentinel.simulate.trace import Trace, TraceError, load_trace, synthetic_trace

POLICIES = ("none", "heuristic", "learned")


def days_range(text: str) -> tuple[float, float]:
    try:
        a, b = (float(p) for p in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--days {text!r}: expected A:B, e.g. 121:174") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"--days {text!r}: need 0 ≤ A < B")
    return a, b


def sizes(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected node counts like 128,64") from None
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be ≥ 1")
    return out


def scenario_of(args: argparse.Namespace, seed: int) -> Scenario:
    return Scenario(training_nodes=args.training, serving_replicas=args.serving, state_gib_per_node=args.state_gib,
                    baseline_timeout_seconds=args.baseline_timeout, baseline_interval_seconds=args.baseline_interval,
                    seed=seed)


def load(args: argparse.Namespace) -> tuple[Trace, tuple[float, float]]:
    nodes = args.nodes if args.nodes is not None else 400
    if args.trace == "synthetic":
        days = args.days or (0.0, 54.0)
        return synthetic_trace(nodes=nodes, days=days[1], per_1000_node_days=args.rate, repair_hours=args.repair_hours,
                               seed=args.seed, shape=args.weibull_shape), days
    trace = load_trace(Path(args.trace), nodes=nodes, inventory=args.inventory)
    return trace, args.days or (0.0, max(trace.last_day, 1.0))


def print_table(summary: dict[str, Any], out: Any = sys.stdout) -> None:
    a, b = summary["days"]
    print(f"{summary['trace']}: {summary['nodes']} nodes, days {a:g}–{b:g}, {summary['faults']} faults "
          f"({summary['faults_per_1000_node_days']:.2f} per 1,000 node-days)", file=out)
    rows = []
    for name, p in summary["policies"].items():
        lost = p["accelerator_hours_lost"]
        top = sorted(((k, v) for k, v in lost.items() if k != "total" and v > 0), key=lambda kv: -kv[1])[:2]
        big = max(p["training_jobs"], key=lambda j: j["nodes"], default=None)
        rows.append((name, f"{p['ettr']:.4f}" if p["ettr"] is not None else "-",
                     f"{big['ettr']:.4f} ({big['accelerators']})" if big else "-",
                     f"{p['serving_slo_attainment']:.4f}" if p["serving_slo_attainment"] is not None else "-",
                     sum(j["interruptions"] for j in p["training_jobs"]), f"{lost['total']:,.0f}",
                     ", ".join(f"{k} {v:,.0f}" for k, v in top), f"{p['spare_accelerator_hours_idle']:,.0f}"))
    print(table(["POLICY", "ETTR", "LARGEST JOB ETTR (ACC)", "SERVING SLO", "INTERRUPTIONS", "ACC-H LOST",
                 "LARGEST CAUSES", "SPARE ACC-H IDLE"], rows), file=out)
    for note in summary["costs"].get("notes", []):
        print(f"note: {note}", file=out)


def over_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per policy: mean and 95% interval of ETTR and SLO attainment over the seeds' runs, and the learned
    policy's margin over the heuristic per seed."""
    out: dict[str, Any] = {}
    for name in runs[0]["policies"]:
        for key in ("ettr", "serving_slo_attainment"):
            values = [r["policies"][name][key] for r in runs if r["policies"][name][key] is not None]
            if values:
                out.setdefault(name, {})[key] = dict(zip(("mean", "low", "high"), ci95(values), strict=True))
    if "learned" in runs[0]["policies"] and "heuristic" in runs[0]["policies"]:
        for key in ("ettr", "serving_slo_attainment"):
            margins = [r["policies"]["learned"][key] - r["policies"]["heuristic"][key] for r in runs
                       if r["policies"]["learned"][key] is not None]
            if margins:
                out.setdefault("learned_minus_heuristic", {})[key] = dict(
                    zip(("mean", "low", "high"), ci95(margins), strict=True))
    return out


def cmd_trace(args: argparse.Namespace) -> int:
    try:
        trace, (first, last) = load(args)
        costs = load_costs(args.costs)
        if args.train:
            return train(args, trace, costs, first, last)
        policies = args.policy or list(POLICIES)
        model = HazardModel.load(args.model) if "learned" in policies else None
        runs = [simulate(trace, costs, scenario_of(args, args.seed + k), policies=policies, first_day=first,
                         last_day=last, model=model) for k in range(args.seeds)]
    except (TraceError, CostsError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = runs[0] | ({"seeds": args.seeds, "over_seeds": over_seeds(runs)} if args.seeds > 1 else {})
    print_table(summary, sys.stderr if args.json == "-" else sys.stdout)
    if args.seeds > 1:
        for name, stats in summary["over_seeds"].items():
            text = ", ".join(f"{k} {v['mean']:+.5f} [{v['low']:+.5f}, {v['high']:+.5f}]" if name.startswith("learned_")
                             else f"{k} {v['mean']:.5f} [{v['low']:.5f}, {v['high']:.5f}]" for k, v in stats.items())
            print(f"{name} over {args.seeds} seeds (mean [95% CI]): {text}",
                  file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(summary, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


def train(args: argparse.Namespace, trace: Trace, costs: Any, first: float, last: float) -> int:
    from sentinel.simulate.learn import fit_hazard, tune

    print(f"fitting the hazard model on days {first:g}–{last:g} of {trace.source}", file=sys.stderr)
    model = fit_hazard(trace, first, last)
    seeds = [args.seed + k for k in range(max(1, args.seeds))]
    warm = min(last - 1, first + 14)  # the replay starts once there is history to read

    def progress(it: int, best: float) -> None:
        print(f"  CEM iteration {it + 1}/{args.iterations}: best mean ETTR {best:.5f}", file=sys.stderr, flush=True)

    model = tune(trace, costs, scenario_of(args, args.seed), model, first_day=warm, last_day=last, seeds=seeds,
                 iterations=args.iterations, progress=progress)
    model = replace(model, trained_on=f"{Path(trace.source).name} days {first:g}–{last:g} (hazard), replays of days "
                                      f"{warm:g}–{last:g} × seeds {seeds} (knobs, CEM)")
    model.save(Path(args.train))
    print(f"wrote {args.train}: knobs {json.dumps({k: round(v, 3) for k, v in model.params.items()})}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fault-trace replay (with --trace)")
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="replay this fault trace (InfiniteHBD JSON), or 'synthetic' for Poisson/Weibull faults")
    g.add_argument("--policy", action="append", choices=POLICIES, default=None,
                   help="a policy to run; repeat (default: all three, side by side)")
    g.add_argument("--days", type=days_range, default=None, metavar="A:B", help="replay days [A, B) of the trace")
    g.add_argument("--seeds", type=int, default=1, help="repeat over this many seeds and report 95%% intervals")
    g.add_argument("--costs", type=Path, default=COSTS_PATH, help="the benchmarks' measured figures")
    g.add_argument("--model", type=Path, default=MODEL_PATH, help="the learned policy's model")
    g.add_argument("--train", default=None, metavar="OUT", help="fit and tune the learned policy on --days, write it")
    g.add_argument("--iterations", type=int, default=10, help="CEM iterations with --train")
    g.add_argument("--inventory", type=Path, default=None, help="a file of valid node ids, one per line")
    g.add_argument("--training", type=sizes, default=(128, 64, 64, 32), help="training jobs' node counts")
    g.add_argument("--serving", type=sizes, default=(16, 8), help="serving jobs' replica counts (a node each)")
    g.add_argument("--state-gib", type=float, default=8.0, help="checkpointed state per node, GiB")
    g.add_argument("--baseline-timeout", type=float, default=600.0,
                   help="no Sentinel: seconds until the collective timeout notices a fault")
    g.add_argument("--baseline-interval", type=float, default=1800.0,
                   help="no Sentinel: the fixed checkpoint interval, seconds")
    g.add_argument("--rate", type=float, default=3.79, help="synthetic faults per 1,000 node-days "
                   "(default: Llama 3's 419 interruptions in 54 days on 16k GPUs, per 8-GPU node)")
    g.add_argument("--repair-hours", type=float, default=24.0, help="synthetic faults' mean repair time")
    g.add_argument("--weibull-shape", type=float, default=1.0, help="synthetic gaps' Weibull shape (1 = Poisson)")
