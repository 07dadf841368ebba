"""The interconnect detectors: the probe mesh (an unreachable node, a bad node, a slow link, a bad domain) and
the RDMA port rules (error counters, link flaps, CNP storms). A NIC port going down is an event
(`link_down`), classified by the fault catalog like an XID (detectors/hardware.py). The logic that decides
lives in sentinel/network/; these adapt it to findings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.incidents.findings import Finding, Subject
from sentinel.jobs.service import ClosedTask
from sentinel.live.fleet import NodeLive
from sentinel.network.localise import BadDomain, BadNode, Link, Localisation
from sentinel.network.matrix import PairStats, unreachable
from sentinel.network.nics import PortLive, fired
from sentinel.network.rules import NicRule
from sentinel.network.view import NetworkView
from sentinel.telemetry.schemas import NodeReport

HOLD_SECONDS = 15.0  # an unreachable node stays so while every probe of it in this long was lost
CHECK_NODE = ["On {node}, from its console or BMC: `ip -br link`, `ethtool <nic>` (link detected?), `dmesg -T | tail`",
              "From a peer: `ping -c 3 {address}`; the switch port {node} hangs off (its counters and logs)",
              "`sentinel network` for the pair matrix; `sentinel nodes` for whether {node} still reports"]


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.2f} ms"


def _pair(p: PairStats) -> dict[str, Any]:
    return {"source": p.source, "target": p.target, "sent": p.sent, "received": p.received,
            "loss_ratio": round(p.loss_ratio, 4), "rtt_p50_seconds": p.rtt_p50_seconds,
            "rtt_p99_seconds": p.rtt_p99_seconds}


@register
class ProbeMeshDetector(Detector):
    """Reads the probe mesh (sentinel/network/). At once, on a report carrying lost probes: a node every recent
    probe of which was lost by at least `probe_unreachable_probers` peers is unreachable (critical; pages,
    drains nothing: a partition is a person's call). Twice a probe round, from the localisation over
    `probe_window_seconds`: a bad domain, a bad node, a slow link (warnings), or one fleet-wide finding.
    Each carries the probe results behind it as its metric window (RTT, or the share of probes answered).
    Options (defaults): `every` (probe_round_seconds ÷ 2); the thresholds are the probe_* settings."""

    name = "probe_mesh"
    periodic = True

    @property
    def cadence(self) -> float:
        """Twice a probe round (5 s at the default 10 s): the localisation is O(pairs held), ~0.1 s per 1,000
        nodes; an unreachable node does not wait for it (on_report)."""
        return self.option("every", self.settings.probe_round_seconds / 2)

    def on_report(self, ctx: DetectionContext, live: NodeLive, report: NodeReport,
                  exits: list[ClosedTask]) -> list[Finding]:
        net = ctx.network
        if net is None or not report.probes:
            return []
        now = ctx.clock.time()
        lost = sorted({p.target for p in report.probes if p.received == 0})
        return [_with_window(f, net, now) for target in lost
                if (f := self._unreachable(ctx, net, target, now)) is not None]

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        net = ctx.network
        if net is None:
            return Evaluation([], 0)
        net.matrix.prune(now)
        found, pairs = net.snapshot(now, fresh=True)
        findings = [f for t in net.matrix.targets() if (f := self._unreachable(ctx, net, t, now)) is not None]
        held = {f.subject.node for f in findings}
        if found.fleet_wide:
            findings.append(self._fleet_wide(found, pairs))
        else:
            findings += [self._domain(d, found, pairs) for d in found.domains]
            findings += [self._node(n, found, pairs, net) for n in found.nodes if n.node not in held]
            findings += [self._link(link, found, pairs) for link in found.links if link.confident]
        findings = [_with_window(f, net, now) for f in findings]
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, max(1, len(net.plan.participants())))

    def _unreachable(self, ctx: DetectionContext, net: NetworkView, target: str, now: float) -> Finding | None:
        probers = unreachable(net.matrix, target, now - HOLD_SECONDS, ctx.settings.probe_unreachable_probers)
        if not probers:
            return None
        recent = net.matrix.towards(target, now - HOLD_SECONDS)
        first = min(s.at for _, s in recent if s.received == 0)
        address = net.plan.participants().get(target, "?")
        return Finding(
            detector=self.name, key=f"node={target}", severity="critical", layer="interconnect",
            title=f"node {target} unreachable on the probe mesh: {len(probers)} peers lost every probe",
            subject=Subject(node=target),
            seen=f"{len(probers)} agents ({', '.join(probers[:8])}) sent {sum(s.sent for _, s in recent)} probes to "
                 f"{target} at {address} in the last {HOLD_SECONDS:g}s and got none back.",
            comparison="No peer reached it since the first loss; a prober's own fault would show on its other "
                       "targets too.",
            evidence={"probers": probers, "address": address,
                      "samples": [{"source": src, "at": s.at, "sent": s.sent, "received": s.received}
                                  for src, s in recent[-20:]]},
            next_steps=[s.format(node=target, address=address.rpartition(":")[0]) for s in CHECK_NODE]
            + ["Nothing is drained for this alone: if only the management network is down, its jobs may still run"],
            action="record", observed_at=first)

    def _node(self, n: BadNode, found: Localisation, pairs: list[PairStats], net: NetworkView) -> Finding:
        mine = [p for p in pairs if n.node in (p.source, p.target)]
        address = net.plan.participants().get(n.node, "?")
        return Finding(
            detector=self.name, key=f"node={n.node}", severity="warning", layer="interconnect",
            title=f"node {n.node} slow or lossy on {n.bad_peers} of {n.measured_peers} probed pairs",
            subject=Subject(node=n.node),
            seen=f"Every direction of most pairs with {n.node} is bad: median RTT "
                 f"{_ms(max((p.rtt_p50_seconds or 0 for p in mine), default=None))} at worst, loss up to "
                 f"{max((p.loss_ratio for p in mine), default=0):.0%}.",
            comparison=f"The fleet's median pair RTT is {_ms(found.baseline_rtt_seconds)}; {found.bad_pairs} of "
                       f"{found.pairs} probed pairs are bad. The fault is at this node (its NIC, cable, switch port "
                       "or a loaded host), not on one path.",
            evidence={"pairs": [_pair(p) for p in mine[:64]], "baseline_rtt_seconds": found.baseline_rtt_seconds},
            next_steps=[s.format(node=n.node, address=address.rpartition(":")[0]) for s in CHECK_NODE],
            action="record")

    def _link(self, link: Link, found: Localisation, pairs: list[PairStats]) -> Finding:
        both = [p for p in pairs if {p.source, p.target} == {link.a, link.b}]
        ends = {end: [p for p in pairs if end in (p.source, p.target) and p not in both] for end in (link.a, link.b)}
        def usual(end: str) -> str:
            rtts = sorted(p.rtt_p50_seconds for p in ends[end] if p.rtt_p50_seconds is not None)
            return f"{end} {_ms(rtts[len(rtts) // 2]) if rtts else 'n/a'} to {len(ends[end])} other peers"
        return Finding(
            detector=self.name, key=f"link={link.name}", severity="warning", layer="interconnect",
            title=f"slow link {link.name}: median RTT {_ms(link.rtt_seconds)}, loss {link.loss_ratio:.0%}",
            subject=Subject(node=link.a),
            seen=f"Probes between {link.a} and {link.b} take {_ms(link.rtt_seconds)} (median, worse direction) "
                 f"with {link.loss_ratio:.0%} loss.",
            comparison=f"Fleet median {_ms(found.baseline_rtt_seconds)}; both ends are fine with everyone else "
                       f"({usual(link.a)}; {usual(link.b)}), so the path between them is at fault.",
            evidence={"pair": [_pair(p) for p in both],
                      "ends": {e: [_pair(p) for p in ps[:16]] for e, ps in ends.items()},
                      "baseline_rtt_seconds": found.baseline_rtt_seconds, "link": [link.a, link.b]},
            next_steps=[f"`mtr -u {link.b}` from {link.a} (and back): which hop adds the delay or drops",
                        "The switches on that path: a congested or erroring port, an ECMP member link that is bad "
                        "(other pairs hash onto healthy members)",
                        "`sentinel network` for the matrix; with network_exclude_slow_nodes on, both ends take no "
                        "new work while this holds"],
            action="record")

    def _domain(self, d: BadDomain, found: Localisation, pairs: list[PairStats]) -> Finding:
        return Finding(
            detector=self.name, key=f"domain={d.label}={d.value}", severity="critical", layer="interconnect",
            title=f"{d.label} {d.value}: {len(d.bad_nodes)} of {d.nodes} nodes bad on the probe mesh",
            subject=Subject(),
            seen=f"Nodes {', '.join(d.bad_nodes[:16])} in {d.label}={d.value} are slow or unreachable on most of "
                 "their pairs.",
            comparison=f"{found.bad_pairs} of {found.pairs} probed pairs are bad fleet-wide; they concentrate in "
                       f"this {d.label}: its switch or uplink, not its nodes.",
            evidence={"label": d.label, "value": d.value, "nodes": d.bad_nodes,
                      "pairs": [_pair(p) for p in pairs if p.source in d.bad_nodes or p.target in d.bad_nodes][:64]},
            next_steps=[f"The {d.label} {d.value} switch: its uplinks, logs and error counters",
                        "Do not drain these nodes one by one: their fault is shared"],
            action="record")

    def _fleet_wide(self, found: Localisation, pairs: list[PairStats]) -> Finding:
        return Finding(
            detector=self.name, key="fleet-wide", severity="warning", layer="interconnect",
            title=f"{found.bad_pairs} of {found.pairs} probed pairs bad at once", subject=Subject(),
            seen=f"More than half of the probed pairs are slow or lossy (fleet median RTT "
                 f"{_ms(found.baseline_rtt_seconds)}).",
            comparison="Independent link faults do not line up like this: the management network, or the probing "
                       "hosts themselves (CPU saturation delays the answers), is the shared cause.",
            evidence={"worst": [_pair(p) for p in sorted(pairs, key=lambda p: -(p.rtt_p50_seconds or 0))[:32]]},
            next_steps=["Check the management network's core switches and the hosts' load (`uptime` on a few)",
                        "Nothing is named or excluded while this holds"],
            action="record")


@register
class NicRulesDetector(Detector):
    """The RDMA port rules (sentinel/network/nic_rules.toml, or the `nic_rules_file` setting) over every port the
    `rdma` source reports: a counter that grew by a rule's `increase` within its window, or whose rate reached
    its `per_second`. One finding per (node, port, rule), with the counter's recent totals as its metric window.
    Options (defaults): `every` (10 s)."""

    name = "nic_counters"
    periodic = True
    every = 10.0

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        net = ctx.network
        if net is None:
            return Evaluation([], 0)
        ports = net.nics.ports()
        findings = [f for live in ports for rule in net.rules if (f := self._check(live, rule, now)) is not None]
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, max(1, len(ports)))

    def _check(self, live: PortLive, rule: NicRule, now: float) -> Finding | None:
        hit = fired(live, rule)
        if hit is None:
            return None
        value, measured = hit
        port = live.port
        values = {"node": live.node, "nic": port.name, "device": port.device, "port": port.port, "value": value}
        return Finding(
            detector=self.name, key=f"node={live.node}|nic={port.name}|rule={rule.name}", severity=rule.severity,
            title=rule.fill(rule.title, **values), layer="interconnect", subject=Subject(node=live.node),
            seen=f"{rule.counter} on {port.name} of {live.node}: {measured}. {rule.fill(rule.explanation, **values)}",
            comparison=f"Port state {port.state or '?'} ({port.phys_state or '?'}), rate "
                       f"{(port.rate_bytes_per_second or 0) * 8 / 1e9:g} Gb/s, {port.link_flaps_total} flaps seen "
                       "by the agent.",
            evidence={"rule": rule.name, "counter": rule.counter, "value": value, "counters": port.counters,
                      "rates": port.rates, "saturated": port.saturated, "state": port.state,
                      "phys_state": port.phys_state, "window": _counter_window(live, rule.counter, now)},
            next_steps=[rule.fill(s, **values) for s in rule.next_steps], action=rule.action,
            observed_at=_first_growth(live, rule.counter, now - rule.window_seconds if rule.increase else live.at))


def _first_growth(live: PortLive, counter: str, since: float) -> float:
    """When the counter was first seen above where it stood at `since` (the report that showed it, at the latest)."""
    points = [(at, values[counter]) for at, values in live.history if counter in values and at >= since]
    points.append((live.at, live.latest.get(counter, 0)))
    base = points[0][1]
    return next((at for at, v in points if v > base), live.at)


def _counter_window(live: PortLive, counter: str, now: float) -> dict[str, Any]:
    points = [(at, values[counter]) for at, values in live.history if counter in values]
    if counter in live.latest and (not points or points[-1][0] < live.at):
        points.append((live.at, live.latest[counter]))
    points = points[-60:]
    return {"metric": f"{counter} total", "times": [round(min(0.0, at - now), 3) for at, _ in points],
            "values": [v for _, v in points]}


def _with_window(finding: Finding, net: NetworkView, now: float) -> Finding:
    """The probe results behind a finding as its metric window (a link's RTT both ways, else the share of probes
    that reached the node, the first bad one of a domain; newest 60), and when the first bad one was measured."""
    link = finding.evidence.get("link")
    if link:
        a, b = link
        samples = sorted(net.matrix.history(a, b) + net.matrix.history(b, a), key=lambda s: s.at)
        samples = [s for s in samples if s.received_at >= now - net.matrix.window_seconds][-60:]
        window = {"metric": f"probe RTT p50 seconds {a}↔{b}",
                  "times": [round(min(0.0, s.at - now), 3) for s in samples], "values": [s.p50 for s in samples]}
    else:
        node = finding.subject.node or next(iter(finding.evidence.get("nodes", ())), None)
        if node is None:
            return finding
        samples = [s for _, s in net.matrix.towards(node, now - net.matrix.window_seconds)][-60:]
        window = {"metric": f"share of probes to {node} answered",
                  "times": [round(min(0.0, s.at - now), 3) for s in samples],
                  "values": [round(s.received / s.sent, 3) for s in samples]}
    if not samples:
        return finding
    limit = net.thresholds.rtt_seconds
    bad = [s.at for s in samples if s.received < s.sent or (s.p50 or 0.0) > limit] or [samples[0].at]
    observed = finding.observed_at if finding.observed_at is not None else min(now, bad[0])
    return dataclasses.replace(finding, evidence={**finding.evidence, "window": window}, observed_at=observed)
