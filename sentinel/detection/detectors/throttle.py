"""Persistent thermal or power throttling: an accelerator held below its clocks by heat or its power limit."""

from __future__ import annotations

import statistics
from typing import Any

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Placements, evidence_window
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.samples import THROTTLE_POWER, THROTTLE_THERMAL, throttle_flags

WINDOW_COLUMNS = ("time", "throttled", "temperature_celsius", "power_watts", "utilization_ratio")


@register
class ThrottleDetector(Detector):
    """An accelerator throttled for thermal or power reasons in at least `ratio` of its last `samples`
    samples; a single throttled sample is a blip, not an incident.

    Thermal: hw_thermal_slowdown, sw_thermal_slowdown, hw_slowdown; power: sw_power_cap,
    hw_power_brake_slowdown (set `power` to 0 to watch thermal reasons only, e.g. in a fleet that runs
    at its power cap by design). An accelerator whose newest sample is older than `stale_seconds` is
    not judged (its node's liveness is another detector's business).

    Options (defaults): samples 6, ratio 0.8, power 1, stale_seconds 120. Layer: hardware.
    """

    name = "throttle"
    periodic = True
    every = 10.0  # seconds between evaluations: its persist time is longer, and its cost grows with the fleet

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        size = max(1, int(self.option("samples", 6)))
        ratio, stale = self.option("ratio", 0.8), self.option("stale_seconds", 120.0)
        mask = int(THROTTLE_THERMAL) | (int(THROTTLE_POWER) if self.option("power", 1.0) else 0)
        findings: list[Finding] = []
        subjects = 0
        places: Placements | None = None
        for uuid in ctx.samples.uuids():
            tail = ctx.samples.tail(uuid, ("time", "throttled"), size)
            if tail is None or len(tail["time"]) < size or now - tail["time"][-1] > stale:
                continue
            subjects += 1
            hits = [(at, int(flags) & mask) for at, flags in zip(tail["time"], tail["throttled"], strict=True)]
            throttled = [(at, flags) for at, flags in hits if flags]
            if len(throttled) < ratio * size - 1e-9:
                continue
            places = places or Placements.of(ctx)
            findings.append(self._finding(ctx, places, now, uuid, size, throttled))
        return Evaluation(findings, subjects)

    def _finding(self, ctx: DetectionContext, places: Placements, now: float, uuid: str, size: int,
                 throttled: list[tuple[float, int]]) -> Finding:
        flags = 0
        for _, f in throttled:
            flags |= f
        kind = " and ".join(k for k, bit in (("thermal", THROTTLE_THERMAL), ("power", THROTTLE_POWER))
                            if flags & int(bit))
        window = ctx.samples.tail(uuid, WINDOW_COLUMNS) or {name: [] for name in WINDOW_COLUMNS}
        latest = ctx.samples.latest(uuid)
        sample = latest[1] if latest else None
        reasons = sorted(sample.throttle_reasons) if sample else []
        node = places.node_of.get(uuid)
        temps = [t for t in window["temperature_celsius"] if t == t]  # NaN: not reported
        power = sample.power_watts if sample else None
        now_text = ", ".join(part for part in (
            f"{sample.temperature_celsius:.0f} °C (window max {max(temps):.0f} °C)"
            if sample and sample.temperature_celsius is not None and temps else "",
            f"{power:.0f} W" if power is not None else "",
            f"SM clock {sample.sm_clock_hz / 1e9:.2f} GHz" if sample and sample.sm_clock_hz else "",
            f"utilization {sample.utilization_ratio:.0%}" if sample else "") if part)
        peers = _peers(ctx, places, node, uuid)
        times = [at - now for at in window["time"]]
        job = places.task_on.get(uuid)
        return Finding(
            detector=self.name, key=f"accelerator={uuid}", severity="warning",
            title=f"accelerator {uuid}{f' on {node}' if node else ''} is {kind}-throttled",
            layer="hardware",
            subject=Subject(node=node, accelerator=uuid, job_id=job[0] if job else None, rank=job[1] if job else None),
            seen=f"{kind} throttling in {len(throttled)} of its last {size} samples "
                 f"({', '.join(reasons) or 'reasons cleared in the newest sample'}); now {now_text or 'no readings'}.",
            comparison=peers["text"] + (f"; its own window began at {temps[0]:.0f} °C" if temps else ""),
            evidence={"window": evidence_window("temperature_celsius", times, window["temperature_celsius"], 1),
                      "power": evidence_window("power_watts", times, window["power_watts"], 1),
                      "throttled": evidence_window("throttled", times, window["throttled"], 0),
                      "reasons": reasons, "peers": peers["values"]},
            next_steps=[
                f"Read its clocks and limits{f' on {node}' if node else ''}: "
                f"`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {uuid}` (clock event reasons, slowdown "
                "temperature, enforced power limit)",
                "Thermal: check airflow, fans and inlet temperature (`ipmitool sdr type Temperature`, "
                "`ipmitool sdr type Fan`); one hot slot among cool peers points at this card (heatsink, paste)",
                "Power: compare the enforced with the default power limit (`nvidia-smi -q -d POWER`) and the "
                "node's PSU / rack power budget; a capped card runs every step slower",
                f"If it persists, run `dcgmi diag -r 2` on {node or 'the node'} and move work off it"],
            observed_at=throttled[0][0])


def _peers(ctx: DetectionContext, places: Placements, node: str | None, uuid: str) -> dict[str, Any]:
    """The other accelerators on the same node: a cooling problem heats them all, a bad card only itself."""
    temps: list[float] = []
    throttling = 0
    others = [u for u in places.accelerators_of.get(node or "", []) if u != uuid]
    for other in others:
        latest = ctx.samples.latest(other)
        if latest is None:
            continue
        if latest[1].temperature_celsius is not None:
            temps.append(latest[1].temperature_celsius)
        throttling += throttle_flags(latest[1].throttle_reasons) > 0
    if not others:
        return {"text": "no peers on its node to compare with", "values": {}}
    median = statistics.median(temps) if temps else None
    text = (f"the other {len(others)} accelerators on {node}: {throttling} throttling now"
            + (f", median {median:.0f} °C" if median is not None else ""))
    return {"text": text, "values": {"accelerators": len(others), "throttling": throttling,
                                     "median_temperature_celsius": median}}
