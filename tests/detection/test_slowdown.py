"""Slowdown attribution on crafted streams: each cause is named with its layer and the experiment that would
confirm it, what was ruled out is listed with numbers, and a healthy or barely slower job gets nothing."""

from __future__ import annotations

import pytest

from tests.detection.diagnosis_scenarios import slowdown
from tests.detection.streams import fired

CASES = [
    ({"cause": "data_wait"}, "input_pipeline", "data_wait", "data_loader", [1], False),
    ({"cause": "compute", "cpu_wait": 0.45}, "host", "compute", "cpu", [1], True),
    ({"cause": "compute", "throttle": True}, "hardware", "compute", "gemm", [1], True),
    ({"cause": "compute"}, "compute", "compute", "rank_compare", [1], True),
    ({"cause": "communication"}, "interconnect", "communication", "collective", [0, 1], False),
    ({"cause": "checkpoint"}, "checkpoint_io", "checkpoint", "disk_write", [1], False),
    ({"cause": "host"}, "host", "host", "cpu", [1], False),
    ({"cause": "compute", "on_ranks": (0, 1)}, "compute", "compute", "gemm", [0, 1], False),
]


@pytest.mark.parametrize(("given", "layer", "component", "experiment", "ranks", "straggler"), CASES,
                         ids=[f"{c[0]['cause']}-{c[1]}-{len(c[4])}" for c in CASES])
def test_each_cause_is_named_with_its_layer_and_confirming_experiment(given, layer, component, experiment, ranks,
                                                                     straggler):
    _, _, stream = slowdown(**given)
    found = fired(stream)
    assert found and found[0][0] <= 60.0, "within 10 s of the onset at 50 s"
    finding = found[-1][1]
    a = finding.evidence["attribution"]
    assert (finding.layer, a["component"], a["proposed_experiment"]["kind"], a["ranks"], a["straggler"]) == \
        (layer, component, experiment, ranks, straggler)
    ruled = {r["what"]: r["why"] for r in a["ruled_out"]}
    assert component not in ruled and len(ruled) >= 6 and all(any(ch.isdigit() for ch in w) for w in ruled.values())


def test_a_straggler_rules_out_communication_as_waiting_and_names_the_signals_it_checked():
    _, _, stream = slowdown(cause="compute")
    a = fired(stream)[-1][1].evidence["attribution"]
    ruled = {r["what"]: r["why"] for r in a["ruled_out"]}
    assert "waiting for a slower one" in ruled["communication"]
    assert "no throttle reason and no clock drop" in ruled["throttling on rank 1"]
    assert "CPU contention on rank 1" in ruled


@pytest.mark.parametrize("extra", [0.0, 0.015])  # none, and +12 %: under the 20 % margin
def test_no_diagnosis_without_a_slowdown_past_the_margin(extra):
    _, _, stream = slowdown(cause="compute", extra=extra)
    assert fired(stream) == []


def test_a_restart_learns_the_baseline_anew():
    world, detector, stream = slowdown(cause="data_wait", onset=1e9)  # never slowed
    assert fired(stream) == [] and world.ctx.diagnosis is not None
    assert world.ctx.diagnosis.baselines, "learnt"
    world.components.add("node-7", [], world.now)
    before = dict(world.ctx.diagnosis.baselines)
    world.advance(2.0)
    world.decomposed("node-7", 7, 0, 10, compute=0.3, attempt=1)
    world.decomposed("node-7", 7, 1, 10, compute=0.3, attempt=1)
    world.evaluate(detector)
    assert 7 in before and 7 not in world.ctx.diagnosis.baselines, "a new attempt's pace is not judged on the old"
