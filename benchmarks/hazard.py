"""Hazard model benchmark: how well the learned policy's node risk ranks the nodes that fault next, on the
trace's held-out days, against the fleet's base rate, and whether fleet-wide features would help.

    PYTHONPATH=. python benchmarks/hazard.py [--trace FILE] [--split 120]

Rows: every node on every whole day (not out that day), its 17 fault-history features
(sentinel/policy/features.py) against "a fault starts within 7 days" — the dataset the shipped model is
fitted on (sentinel/simulate/learn.py:hazard_dataset), days 0–split to fit, split+1–end to judge. Printed:
ROC AUC (ties averaged: most nodes share the no-history row) on both, the base rate, the re-fault rate of
nodes back from repair within a day, and the same model with three fleet-wide features added (faults in the
last 7 days per 1,000 nodes, network faults likewise, the share of the fleet out now). The baseline is
AUC 0.5, a risk that ranks nothing, and the base rate itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from support import say

from sentinel.policy.features import NODE_FEATURES, Fault, node_features
from sentinel.policy.hazard import fit
from sentinel.simulate.trace import DAY, SHIPPED, load_trace

HORIZON_DAYS = 7.0


def rows(trace_path: Path, first: float, last: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node features, fleet features, label) per node-day in [first, last), as learn.hazard_dataset builds them."""
    trace = load_trace(trace_path)
    by_node: dict[str, list[Fault]] = {}
    for f in trace.faults:
        by_node.setdefault(f.node, []).append(Fault(f.start, f.end, f.kind))
    xs, fleets, ys = [], [], []
    n = len(trace.nodes)
    for day in np.arange(first + 1, last - HORIZON_DAYS):
        now = float(day) * DAY
        known = {node: [Fault(f.start, f.end if f.end is not None and f.end <= now else None, f.kind)
                        for f in faults if f.start < now] for node, faults in by_node.items()}
        recent = [f for faults in known.values() for f in faults if now - 7 * DAY <= f.start]
        fleet = [1000.0 * len(recent) / n, 1000.0 * sum(f.kind == "network" for f in recent) / n,
                 sum(any(f.end is None for f in faults) for faults in known.values()) / n]
        for node in trace.nodes:
            mine = known.get(node, [])
            if any(f.end is None for f in mine):
                continue
            xs.append(node_features(mine, now))
            fleets.append(fleet)
            ys.append(1.0 if any(now < f.start <= now + HORIZON_DAYS * DAY for f in by_node.get(node, [])) else 0.0)
    return np.array(xs), np.array(fleets), np.array(ys)


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """ROC AUC by the rank-sum, tied scores given their average rank."""
    _, tie = np.unique(np.round(score, 12), return_inverse=True)
    order = np.argsort(score, kind="stable")
    rank = np.empty(len(score))
    rank[order] = np.arange(1, len(score) + 1)
    rank = (np.bincount(tie, weights=rank) / np.bincount(tie))[tie]
    pos = label == 1
    npos, nneg = int(pos.sum()), int((~pos).sum())
    return float((rank[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=SHIPPED)
    parser.add_argument("--split", type=float, default=120.0, help="fit on days [0, split), judge on the rest")
    parser.add_argument("--last", type=float, default=174.0)
    args = parser.parse_args()
    x, fx, y = rows(args.trace, 0.0, args.split)
    xt, ft, yt = rows(args.trace, args.split, args.last)
    back = NODE_FEATURES.index("returned_within_1d")
    say(f"{args.trace.name}: fit on days 0–{args.split:g} ({len(y):,} node-days, {int(y.sum())} with a fault within "
        f"{HORIZON_DAYS:g} d), judged on days {args.split + 1:g}–{args.last:g} ({len(yt):,}, {int(yt.sum())})")
    say(f"base rate (a fault within {HORIZON_DAYS:g} d): fit {y.mean():.3f}, judged {yt.mean():.3f}; nodes back "
        f"from repair within a day: fit {y[x[:, back] == 1].mean():.3f} of {int((x[:, back] == 1).sum())}, judged "
        f"{yt[xt[:, back] == 1].mean():.3f} of {int((xt[:, back] == 1).sum())}")
    model = fit(x, y, horizon_days=HORIZON_DAYS)
    wider = fit(np.hstack([x, fx]), y, horizon_days=HORIZON_DAYS)
    say(f"{'features':38} {'AUC fit':>8} {'AUC judged':>11}   (0.5: ranks nothing)")
    say(f"{'17 node features (the shipped model)':38} {auc(model.risk(x), y):8.3f} {auc(model.risk(xt), yt):11.3f}")
    say(f"{'+ 3 fleet-wide features':38} {auc(wider.risk(np.hstack([x, fx])), y):8.3f} "
        f"{auc(wider.risk(np.hstack([xt, ft])), yt):11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
