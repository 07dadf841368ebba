"""Retry or scale down (sentinel/serving/engine_faults.py): deterministic, and every reason says what was looked
at, found or not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sentinel.serving.engine_faults import RankEvidence, decide

RANK = RankEvidence("r1", 1, "unhealthy", "n1", ("GPU-2", "GPU-3"), fault="RuntimeError")


def verdict(*ranks: RankEvidence, retries: int = 0) -> tuple[str, list[str]]:
    v = decide(list(ranks) or [RANK], retries=retries, max_retries=2, retry_seconds=600, hardware_seconds=3600)
    return v.instruction, v.reasons


def test_a_clean_transient_fault_is_retried_with_what_was_checked() -> None:
    assert verdict() == ("retry", [
        "no hardware evidence on node n1's accelerators GPU-2,GPU-3 (no XID/ECC/thermal fault in the last 60 min, no "
        "open hardware incident, none out of service)", "no retry in the last 10 min"])
    assert verdict(retries=1)[1][1] == "1 retry in the last 10 min, under max_retries 2"


@pytest.mark.parametrize("evidence, words", [
    ({"faults": ("xid 79 on GPU-3 4 min ago",)},
     "hardware evidence on node n1's accelerators GPU-2,GPU-3 (replica r1): xid 79 on GPU-3 4 min ago"),
    ({"incidents": ("incident #12 (hardware on GPU-2)",)}, "incident #12 (hardware on GPU-2)"),
    ({"out_of_service": ("GPU-2 quarantined",)}, "GPU-2 quarantined"),
    ({"state": "dead"}, "the engine core of replica r1 (rank 1) is dead: it cannot take a retry"),
], ids=["xid", "open-incident", "quarantined", "dead"])
def test_hardware_evidence_or_a_dead_core_decides_scale_down(evidence: dict[str, object], words: str) -> None:
    instruction, reasons = verdict(replace(RANK, **evidence))  # type: ignore[arg-type]
    assert instruction == "scale_down" and words in reasons[0]


def test_retries_that_did_not_hold_decide_scale_down() -> None:
    assert verdict(retries=2) == ("scale_down", ["2 retries in the last 10 min did not hold (max_retries 2)"])


def test_evidence_on_one_rank_of_several_decides_for_the_group_and_names_it() -> None:
    other = RankEvidence("r0", 0, "unhealthy", "n0", ("GPU-0",))
    bad = RankEvidence("r1", 1, "unhealthy", "n1", ("GPU-2",), faults=("ecc on GPU-2 1 min ago",))
    instruction, reasons = verdict(other, bad)
    assert instruction == "scale_down" and reasons == [
        "hardware evidence on node n1's accelerators GPU-2 (replica r1): ecc on GPU-2 1 min ago"]
    assert verdict(other, bad) == verdict(other, bad), "deterministic"
