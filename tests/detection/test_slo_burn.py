"""The SLO burn detector on a live ServingView (Google SRE workbook, multi-window burn rates): a job whose
requests start failing is ticketed (6 h and 30 m over 6×) before it is paged (1 h and 5 m over 14.4×), under one
fingerprint; healthy jobs and a job with too few requests are not judged; it clears once the burn stops."""

from __future__ import annotations

from sentinel.detection.detectors.slo_burn import SloBurn
from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired


def test_a_failing_job_is_ticketed_then_paged_under_one_fingerprint():
    _, _, stream = scenarios.slo_burn()
    found = fired(stream)
    assert {f.key for _, f in found} == {"job=9"}, "jobs 10 and 11 stay within budget"
    first_at, first = found[0]
    assert first.severity == "warning" and 650.0 <= first_at <= 680.0, "30 m ratio ≥ 6% from ~660 s"
    paged = [(at, f) for at, f in found if f.severity == "critical"]
    assert paged and 770.0 <= paged[0][0] <= 800.0, "1 h ratio ≥ 14.4% from ~780 s: (t − 590)·0.6 / t"
    f = paged[0][1]
    assert "1h and 5m over 14.4×" in f.title and "5m " in f.seen and "decode replica d0 on node-s" in f.seen
    assert f.evidence["burn_rates"]["1h"] >= 14.4 and f.evidence["burn_rates"]["5m"] >= 14.4
    assert "no failed request for 99%" in f.comparison
    assert_dense(f)


def test_too_few_requests_are_not_judged():
    world = World({"slo_burn": {"min_requests": 21}})
    world.add_node("node-s", accelerators=1)
    world.serve("node-s", 9, 0, "d0", failed=20, running=0)
    detector = SloBurn(world.settings)
    assert detector.evaluate(world.ctx, world.now).subjects == 0, "20 requests, all failed, under the minimum"
    world.serve("node-s", 9, 0, "d0", failed=20, running=0)
    assert detector.evaluate(world.ctx, world.now).findings, "40: judged, and burning"


def test_it_clears_once_the_burn_stops():
    _, detector, stream = scenarios.slo_burn(recover_at=700.0, seconds=1500.0)
    assert fired(stream) and stream[-1][1].findings == [] and detector.active == set()
