"""Lemons: accelerators and nodes that keep failing, worth pulling out of the fleet for repair."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import EVIDENCE_POINTS, evidence_window, is_application
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.faults import Fault

if TYPE_CHECKING:
    from sentinel.config import Settings

HARDWARE_SEVERITIES = ("warning", "critical")


@register
class LemonDetector(Detector):
    """At least `faults` warning/critical hardware fault episodes on one accelerator, or `node_faults` on
    one node, within `window_seconds` (from the fault history; application XIDs do not count).

    Faults on the same accelerator (node) closer than `episode_seconds` to the first fault of an episode
    are one episode: a burst of repeated XIDs is one failure, not a lemon. A node is judged a lemon only
    when its episodes are not all on one accelerator (that is the accelerator's incident). The fault list
    changes slowly, so the count is refreshed at most every `check_seconds`.

    Options (defaults): faults 3, node_faults 5, window_seconds 604800 (7 days), episode_seconds 3600,
    check_seconds 60. Layer: hardware; recommended action: quarantine (an accelerator), drain_node (a node).
    """

    name = "lemon"
    periodic = True
    every = 60.0  # fault counts over days move slowly

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self._cached: tuple[float, Evaluation] | None = None

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        if self._cached is not None and now - self._cached[0] < self.option("check_seconds", 60.0):
            return Evaluation(list(self._cached[1].findings), self._cached[1].subjects)
        window = self.option("window_seconds", 7 * 86400.0)
        episode = self.option("episode_seconds", 3600.0)
        faults = sorted((f for f in ctx.history.recent(now, window_seconds=window)
                         if f.severity in HARDWARE_SEVERITIES and not is_application(ctx, f.kind, f.xid)),
                        key=lambda f: f.at)  # events may arrive out of order
        by_accelerator: dict[str, list[Fault]] = {}
        by_node: dict[str, list[Fault]] = {}
        for fault in faults:
            if fault.accelerator is not None:
                _add(by_accelerator.setdefault(fault.accelerator, []), fault, episode)
            _add(by_node.setdefault(fault.node, []), fault, episode)
        nodes = ctx.fleet.all()
        accelerators = max(sum(len(live.accelerators) for live in nodes), len(by_accelerator), 1)
        fleet = _FleetRate(sum(len(e) for e in by_accelerator.values()), accelerators,
                           max(len(nodes), len(by_node), 1), sum(len(e) for e in by_node.values()), window)
        findings: list[Finding] = []
        per_accelerator = int(self.option("faults", 3))
        for uuid, episodes in by_accelerator.items():
            if len(episodes) >= per_accelerator:
                findings.append(self._finding(now, Subject(node=episodes[-1].node, accelerator=uuid), episodes,
                                              per_accelerator, fleet))
        per_node = int(self.option("node_faults", 5))
        for node, episodes in by_node.items():
            spread = {f.accelerator for f in episodes}
            if len(episodes) >= per_node and (len(spread) > 1 or None in spread):
                findings.append(self._finding(now, Subject(node=node), episodes, per_node, fleet))
        evaluation = Evaluation(findings, fleet.accelerators + fleet.nodes)
        self._cached = (now, evaluation)
        return evaluation

    def _finding(self, now: float, subject: Subject, episodes: list[Fault], threshold: int,
                 fleet: _FleetRate) -> Finding:
        is_node = subject.accelerator is None
        what = f"node {subject.node}" if is_node else f"accelerator {subject.accelerator} on {subject.node}"
        days = fleet.window_seconds / 86400
        rate = fleet.per_node if is_node else fleet.per_accelerator
        kinds = Counter(f"XID {f.xid}" if f.kind == "xid" and f.xid is not None else f.kind for f in episodes)
        ratio = f" ({len(episodes) / rate:.0f}× the fleet rate)" if rate > 0 else ""
        target = f"-i {subject.accelerator}" if not is_node else ""
        action = (f"Quarantine it: `POST /api/v1/accelerators/{subject.accelerator}/quarantine`; its jobs restart "
                  "on spares from their recovery plans" if not is_node else
                  f"Cordon it: `POST /api/v1/nodes/{subject.node}/cordon`, so no new work lands there; its jobs "
                  "restart elsewhere from their recovery plans")
        return Finding(
            detector=self.name, key=f"node={subject.node}" if is_node else f"accelerator={subject.accelerator}",
            severity="warning",
            title=f"{what} is a lemon: {len(episodes)} hardware faults in {days:.0f} days",
            layer="hardware", subject=subject,
            seen=f"{len(episodes)} separate hardware fault episodes in {days:.0f} days ("
                 + ", ".join(f"{k} ×{n}" for k, n in kinds.most_common()) + "); the last "
                 f"{(now - episodes[-1].at) / 3600:.1f} h ago",
            comparison=f"the fleet over the same {days:.0f} days: {fleet.text(is_node)}; this one has "
                       f"{len(episodes)}{ratio}",
            evidence={"window": evidence_window("fault_episodes", [f.at - now for f in episodes],
                                                [float(i + 1) for i in range(len(episodes))], 0),
                      "faults": [_fault(f, now) for f in episodes[-EVIDENCE_POINTS:]]},
            next_steps=[
                action,
                f"Run field diagnostics before it returns: `dcgmi diag -r 3` on {subject.node} (memory, PCIe, "
                "NVLink and stress tests)",
                f"Read its error history: `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER {target}`".rstrip()
                + " (retired pages, pending or failed row remaps)",
                "If diagnostics fail or faults recur after a reset: open an RMA with the vendor, attaching this "
                "incident's fault list"],
            action="drain_node" if is_node else "quarantine", observed_at=episodes[threshold - 1].at)


class _FleetRate:
    """Fault episodes per accelerator (node) across the fleet over the window, for comparison."""

    def __init__(self, accelerator_episodes: int, accelerators: int, nodes: int, node_episodes: int,
                 window_seconds: float):
        self.accelerators, self.nodes, self.window_seconds = accelerators, nodes, window_seconds
        self.accelerator_episodes, self.node_episodes = accelerator_episodes, node_episodes
        self.per_accelerator = accelerator_episodes / accelerators
        self.per_node = node_episodes / nodes

    def text(self, node: bool) -> str:
        if node:
            return f"{self.node_episodes} episodes over {self.nodes} nodes, {self.per_node:.2f} per node"
        per_1000_days = 1000 * self.per_accelerator / (self.window_seconds / 86400)
        return (f"{self.accelerator_episodes} episodes over {self.accelerators} accelerators, "
                f"{self.per_accelerator:.3f} per accelerator ({per_1000_days:.1f} per 1,000 accelerator-days)")


def _add(episodes: list[Fault], fault: Fault, episode_seconds: float) -> None:
    """Append a fault unless it belongs to the episode the last counted fault started."""
    if not episodes or fault.at - episodes[-1].at >= episode_seconds:
        episodes.append(fault)


def _fault(fault: Fault, now: float) -> dict[str, Any]:
    return {"seconds_ago": round(now - fault.at, 1), "kind": fault.kind, "xid": fault.xid,
            "severity": fault.severity, "accelerator": fault.accelerator}
