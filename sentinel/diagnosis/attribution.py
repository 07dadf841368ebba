"""Slowdown attribution: which component of the step grew, on which ranks, and which layer that points at.

A job is slower when its iteration (wall time per step) is `margin` above its baseline. The rise is then
split over the components (sentinel/diagnosis/components.py), per rank:

* communication counts by its *smallest* rise over the ranks: a slow link or collective slows every rank's
  communication alike, while the ranks waiting for a straggler show a rise the straggler itself does not;
* every other component counts by its largest rise on any rank (a slow loader or a slow accelerator on one
  rank is the whole job's problem in a synchronous job);
* the component that explains the most of the rise (at least `explain` of it) is named. Compute is refined
  by the node signals of the ranks whose compute grew: throttle reasons or a clock drop → hardware; the
  process waiting for a CPU → host (contention); host memory pressure → host; MoE expert imbalance → compute
  (routing); else a straggler rank when only some ranks grew, compute when all did.

Everything else is listed as ruled out, with its numbers. Derived from measured signals only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sentinel.diagnosis.components import COMPONENTS, LAYER_OF, RankProfile
from sentinel.diagnosis.schemas import ComponentChange, ExperimentKind, ExperimentProposal, RuledOut
from sentinel.diagnosis.signals import MEMORY_PRESSURE, RankSignals
from sentinel.live.samples import throttle_flags


@dataclass
class Thresholds:
    margin: float = 0.2  # iteration this much above baseline is a slowdown
    explain: float = 0.4  # the named component explains at least this share of the rise
    cpu_wait_rise: float = 0.15  # CPU wait this much above baseline is contention
    clock_drop: float = 0.15  # an SM clock this much below the baseline's is throttling
    imbalance_rise: float = 1.3  # expert imbalance this many times its baseline


@dataclass
class Attribution:
    layer: str
    component: str
    title: str
    ranks: list[int]
    nodes: list[str]
    straggler: bool
    slowdown: float
    before: float
    after: float
    changes: list[ComponentChange]
    ruled_out: list[RuledOut]
    signals: dict[str, object]
    experiment: ExperimentProposal


# component → (layer, what grew, the experiment, why, what confirms it): the components one experiment settles
STAGES: dict[str, tuple[str, str, ExperimentKind, str, str]] = {
    "data_wait": ("input_pipeline", "the loop waits for its data loader", "data_loader",
                  "time the loader's delivery over a fresh window",
                  "confirmed if it delivers under 0.5× the batches/s it did at baseline"),
    "checkpoint": ("checkpoint_io", "checkpoint saves stall the loop", "disk_write",
                   "measure write + fsync throughput of the checkpoint directory",
                   "confirmed below 0.5× the throughput calibrated while the job was healthy"),
}


def iteration_of(profiles: dict[int, RankProfile]) -> float:
    return statistics.fmean(p.iteration for p in profiles.values())


def attribute(base: dict[int, RankProfile], now: dict[int, RankProfile], signals: dict[int, RankSignals],
              base_clocks: dict[str, float], t: Thresholds) -> Attribution | None:
    ranks = sorted(set(base) & set(now))
    if not ranks:
        return None
    before = statistics.fmean(base[r].iteration for r in ranks)
    after = statistics.fmean(now[r].iteration for r in ranks)
    if before <= 0 or after < before * (1 + t.margin):
        return None
    rise = after - before
    delta = {c: {r: now[r].components[c] - base[r].components[c] for r in ranks} for c in COMPONENTS}
    score = {c: (min(delta[c].values()) if c == "communication" else max(delta[c].values())) for c in COMPONENTS}
    component = max(COMPONENTS, key=lambda c: score[c])
    if score[component] < t.explain * rise:
        component = "unexplained"
    grew = [r for r in ranks if component != "unexplained" and delta[component][r] >= 0.5 * score[component]]
    if component == "communication":
        grew = ranks
    nodes = sorted({now[r].node for r in grew})
    evidence: dict[str, object] = {str(r): signals[r].as_evidence() for r in grew if r in signals}
    layer, why, experiment, straggler, checked = _layer(component, grew, ranks, base, now, signals, base_clocks, t)
    changes = [_change(c, grew or ranks, base, now) for c in COMPONENTS]
    changes.sort(key=lambda ch: ch.after_seconds - ch.before_seconds, reverse=True)
    ruled = [RuledOut(what=c, why=_why_not(c, score[c], max(delta[c].values()), rise))
             for c in COMPONENTS if c != component]
    ruled += checked
    who = _who(grew, ranks)
    title = f"{who}: {why}; iteration {before:.3f} → {after:.3f} s (+{after / before - 1:.0%})"
    return Attribution(layer=layer, component=component, title=title, ranks=grew, nodes=nodes, straggler=straggler,
                       slowdown=after / before - 1, before=before, after=after, changes=changes, ruled_out=ruled,
                       signals=evidence, experiment=experiment)


def _layer(component: str, grew: list[int], ranks: list[int], base: dict[int, RankProfile],
           now: dict[int, RankProfile], signals: dict[int, RankSignals], base_clocks: dict[str, float],
           t: Thresholds) -> tuple[str, str, ExperimentProposal, bool, list[RuledOut]]:
    """(layer, what grew in words, the experiment that would confirm it, straggler?, signals ruled out)."""
    first = grew[0] if grew else ranks[0]
    node = now[first].node
    nodes = sorted({now[r].node for r in ranks})
    peer = next((n for n in nodes if n != node), node)
    ruled: list[RuledOut] = []
    if component in STAGES:
        layer, what, kind, why, expect = STAGES[component]
        return (layer, f"{what} {_dur(now[first].components[component])} per step (was "
                f"{_dur(base[first].components[component])})",
                ExperimentProposal(kind=kind, rank=first, node=node, why=why, expect=expect), False, ruled)
    if component in ("communication", "all_to_all"):
        what = "all-to-all (MoE dispatch/combine)" if component == "all_to_all" else "exposed communication"
        return ("interconnect", f"{what} grew on every rank, compute did not",
                ExperimentProposal(kind="collective", node=node, peer=peer,
                                   why=f"measure bus bandwidth between {node} and {peer}",
                                   expect="confirmed below 0.5× the bandwidth calibrated while the job was healthy"),
                False, ruled)
    if component == "compute":
        return _compute(grew, ranks, base, now, signals, base_clocks, t)
    if component in ("host", "idle"):
        what = "untimed time between steps" if component == "idle" else "host-side work the job timed"
        return ("host", f"{what} grew {_dur(base[first].components[component])} → "
                f"{_dur(now[first].components[component])} per step",
                ExperimentProposal(kind="cpu", node=node, rank=first,
                                   why="measure how long the task waits for a CPU, and who else runs",
                                   expect="confirmed if the task waits ≥ 20% of its runnable time for a CPU"),
                False, ruled)
    return ("software", "no component explains the rise",
            ExperimentProposal(kind="rank_compare", why="compare the ranks' step components over a fresh window",
                               expect="names the rank and component that differ from their peers"), False, ruled)


def _compute(grew: list[int], ranks: list[int], base: dict[int, RankProfile], now: dict[int, RankProfile],
             signals: dict[int, RankSignals], base_clocks: dict[str, float],
             t: Thresholds) -> tuple[str, str, ExperimentProposal, bool, list[RuledOut]]:
    ruled: list[RuledOut] = []
    straggler = len(grew) < len(ranks)
    first = grew[0]
    node = now[first].node
    throttled = _throttled(grew, base, now, signals, base_clocks, t, ruled)
    if throttled is not None:
        return (*throttled, straggler, ruled)
    for r in grew:
        wait, was = now[r].cpu_wait, base[r].cpu_wait or 0.0
        if wait is not None and wait >= was + t.cpu_wait_rise:
            return ("host", f"compute grew {_ratio(base[r], now[r])} on rank {r}, which waits {wait:.0%} of its "
                    f"runnable time for a CPU (baseline {was:.0%}): CPU contention on {now[r].node}",
                    ExperimentProposal(kind="cpu", node=now[r].node, rank=r,
                                       why=f"measure rank {r}'s run-queue wait now and who else uses its CPUs",
                                       expect="confirmed if the task waits ≥ 20% of its runnable time for a CPU"),
                    straggler, ruled)
        ruled.append(RuledOut(what=f"CPU contention on rank {r}",
                              why=f"it waits {_pct(wait)} of its runnable time for a CPU (baseline {_pct(was)})"))
    for r in grew:
        s = signals.get(r)
        if s is not None and s.memory_ratio is not None and s.memory_ratio >= MEMORY_PRESSURE:
            return ("host", f"compute grew on rank {r} with host memory {s.memory_ratio:.0%} used on {s.node}",
                    ExperimentProposal(kind="memory_bandwidth", node=s.node, rank=r, why="measure memory bandwidth",
                                       expect="confirmed below 0.5× a peer node's"), straggler, ruled)
    for r in grew:
        imb, was_imb = now[r].imbalance, base[r].imbalance
        if imb is not None and was_imb and imb >= was_imb * t.imbalance_rise:
            return ("compute", f"expert load imbalance on rank {r} rose {was_imb:.2f} → {imb:.2f} (max ÷ mean tokens "
                    "per expert)", ExperimentProposal(kind="rank_compare", rank=r,
                                                      why="compare the ranks' compute over a fresh window",
                                                      expect=f"confirmed if rank {r}'s compute ≥ 1.3× its peers'"),
                    straggler, ruled)
    if straggler:
        return ("compute", f"a straggler: compute grew {_ratio(base[first], now[first])} there, not on the other "
                "ranks (they wait for it), with no throttling, CPU wait or memory pressure to explain it",
                ExperimentProposal(kind="rank_compare", rank=first, node=node,
                                   why="compare the ranks' compute over a fresh window",
                                   expect=f"confirmed if rank {first}'s compute ≥ 1.3× its peers' median"), True, ruled)
    uuids = signals[first].accelerators if first in signals else []
    return ("compute", f"compute grew on every rank ({_ratio(base[first], now[first])}) without throttling",
            ExperimentProposal(kind="gemm", node=node, rank=first, accelerator=uuids[0] if uuids else None,
                               why="a GEMM against the accelerator's expected rate",
                               expect="confirmed below 0.8× the expected rate"), False, ruled)


def _throttled(grew: list[int], base: dict[int, RankProfile], now: dict[int, RankProfile],
               signals: dict[int, RankSignals], base_clocks: dict[str, float], t: Thresholds,
               ruled: list[RuledOut]) -> tuple[str, str, ExperimentProposal] | None:
    """Hardware throttling on the accelerator of a rank whose compute grew: throttle reasons or a clock drop."""
    for r in grew:
        s = signals.get(r)
        if s is None:
            continue
        for uuid in s.accelerators:
            reasons = [x for x in s.throttle_reasons.get(uuid, []) if throttle_flags([x])]
            clock, was = s.clocks_hz.get(uuid), base_clocks.get(uuid)
            dropped = clock is not None and was and clock < was * (1 - t.clock_drop)
            if reasons or dropped:
                said = f"throttle reasons {', '.join(reasons)}" if reasons else \
                    f"SM clock {clock / 1e9:.2f} GHz, {1 - clock / was:.0%} below its {was / 1e9:.2f} GHz at baseline"  # type: ignore[operator]
                return ("hardware", f"compute grew {_ratio(base[r], now[r])} on rank {r}, whose accelerator {uuid} "
                        f"throttles ({said})",
                        ExperimentProposal(kind="gemm", node=s.node, accelerator=uuid, rank=r,
                                           why=f"a GEMM on {uuid} against its expected rate",
                                           expect="confirmed below 0.8× the expected rate"))
        ruled.append(RuledOut(what=f"throttling on rank {r}", why="no throttle reason and no clock drop on "
                              + (", ".join(s.accelerators) or "its accelerators")))
    return None


def _change(component: str, ranks: list[int], base: dict[int, RankProfile], now: dict[int, RankProfile]
            ) -> ComponentChange:
    b = statistics.fmean(base[r].components[component] for r in ranks)
    a = statistics.fmean(now[r].components[component] for r in ranks)
    bi = statistics.fmean(base[r].iteration for r in ranks)
    ai = statistics.fmean(now[r].iteration for r in ranks)
    return ComponentChange(component=component, before_seconds=round(b, 6), after_seconds=round(a, 6),
                           share_before=round(b / bi, 4) if bi else 0.0, share_after=round(a / ai, 4) if ai else 0.0)


def _why_not(component: str, score: float, most: float, rise: float) -> str:
    share = f"{score / rise:.0%} of the {_ms(rise)} rise"
    if component != "communication":
        return f"{_ms(score)} per step on its most affected rank ({share})"
    waiting = f"; up to {_ms(most)} on ranks waiting for a slower one" if most - score > 0.2 * rise else ""
    return f"{_ms(score)} per step on every rank, its smallest rise ({share}){waiting}"


def _who(grew: list[int], ranks: list[int]) -> str:
    if not grew or len(grew) == len(ranks):
        return "all ranks"
    return f"rank{'s' if len(grew) > 1 else ''} {', '.join(map(str, grew))}"


def _ratio(before: RankProfile, after: RankProfile) -> str:
    was, now = before.components["compute"], after.components["compute"]
    return f"{now / was:.1f}×" if was > 0 else f"by {_dur(now)}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:+.1f} ms" if abs(seconds) < 1 else f"{seconds:+.2f} s"


def _dur(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


__all__ = ["LAYER_OF", "Attribution", "Thresholds", "attribute", "iteration_of"]
