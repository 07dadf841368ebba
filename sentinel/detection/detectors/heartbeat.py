"""Heartbeat loss: a node the liveness check marked down (it missed `missed_intervals_down` of its own
reporting intervals). Many nodes at once collapse into one fleet-wide incident: a partition pages once."""

from __future__ import annotations

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.incidents.findings import Finding, Subject


@register
class HeartbeatLoss(Detector):
    """A node the liveness check marked down; many at once are one fleet-wide incident naming every node (a
    partition pages once and trips no drain). A node whose agent's last report said it was stopping on purpose
    (systemctl stop, Ctrl-C: `leaving`) is down without an incident; its node_down event says why.

    Options (defaults): none of its own beyond `every` (each round, and at once when liveness marks a node
    down); a node is down after the server setting missed_intervals_down (3) of its own intervals.
    """

    name = "heartbeat"
    periodic = True

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        nodes = ctx.fleet.all()
        missed = ctx.settings.missed_intervals_down
        assignments = ctx.assignments()
        reporting = sum(1 for n in nodes if n.state != "down")
        findings = []
        for live in nodes:
            if live.state != "down" or live.leaving:  # an agent that said goodbye was stopped on purpose
                continue
            silent = now - live.last_seen
            tasks = assignments.get(live.id, [])
            running = ", ".join(f"job {t.job_id} rank {t.rank}" for t in tasks[:10]) or "no tasks"
            findings.append(Finding(
                detector=self.name, key=f"node={live.name}",
                severity="critical" if tasks else "warning",
                title=f"node {live.name} stopped reporting ({silent:.0f}s silent)", layer="hardware",
                subject=Subject(node=live.name),
                seen=(f"No report from node {live.name} for {silent:.1f}s, {silent / live.interval_seconds:.1f} of its "
                      f"{live.interval_seconds:g}s intervals (down after {missed}); last seq {live.last_seq}. "
                      f"Placed there: {running}."),
                comparison=f"{reporting} of {len(nodes)} nodes are reporting normally.",
                evidence={"last_seen": live.last_seen, "interval_seconds": live.interval_seconds,
                          "last_seq": live.last_seq, "sources": live.sources,
                          "tasks": [{"job": t.job_id, "rank": t.rank, "pid": t.pid} for t in tasks[:50]]},
                next_steps=[f"Is {live.name} up? `ping {live.name}`, the BMC / console, `uptime`",
                            "Is the agent running there? `systemctl status sentinel-collector` or its log; its "
                            "spool replays what it could not send once it reaches the server",
                            "Can it reach the server? a firewall, DNS or a network change"],
                # its tasks are gone or unreachable: drain it and restart them elsewhere
                action="drain_node" if tasks else "record", observed_at=live.last_seen + live.interval_seconds))
        return Evaluation(findings, len(nodes))

    def fleet_wide(self, findings: list[Finding], subjects: int) -> Finding:
        names = [f.subject.node for f in findings]
        return Finding(
            detector=self.name, key="fleet-wide", severity="critical",
            title=f"{len(findings)} of {subjects} nodes stopped reporting at once: likely a partition",
            layer="interconnect", subject=Subject(),
            seen=f"{len(findings)} nodes went silent together: {', '.join(str(n) for n in names[:20])}"
                 + (" …" if len(names) > 20 else ""),
            comparison=f"{len(findings) / max(1, subjects):.0%} of the fleet; nodes fail independently far less often "
                       "than a network or the server's own reachability does",
            evidence={"nodes": names[:500]},
            next_steps=["Check the network between those nodes and the server (switch, route, firewall, DNS)",
                        "Check the server host: load, clock, its own network interface",
                        "Do not drain these nodes by hand: their jobs may still be running"],
            action="page", observed_at=min((f.observed_at for f in findings if f.observed_at), default=None))
