"""KV transfer: the KV cache moved between the stages of a disaggregated deployment (prefill → decode, through
NIXL, Mooncake or NCCL) fails, or takes a share of the first token's time far above the replica's own usual.

The share is KV-transfer seconds ÷ TTFT seconds over the replica's window (sentinel/serving/signals.py): the
seed's disaggregated deployment cut it from over 30% to under 1%, so a replica back at 30% has lost what
made it fast, while its requests still succeed. The baseline is the replica's own median share over the last
hour, from points taken while the condition did not hold; a replica without one yet is judged against
`absolute_share` alone. Where the replica says which peer each transfer came from (the SDK's `peer`), the
incident names the peer that holds `peer_part` of the KV-transfer time (or of the failures): "decode replica d1:
KV transfer from prefill p1 takes 31% of TTFT"; where none does, or no peer is said, it names none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import JobBaseline, Onsets, prune
from sentinel.incidents.findings import Finding, Subject

if TYPE_CHECKING:
    from sentinel.config import Settings
    from sentinel.serving.signals import ReplicaStats
    from sentinel.telemetry.serving import ServingStats

SAMPLE_SECONDS = 10.0
KEEP_SECONDS = 3600.0
PEERS_IN_EVIDENCE = 8


@dataclass(frozen=True)
class Peer:
    """The replica most of a replica's KV-transfer time (or of its failures) came from."""

    name: str
    label: str  # "prefill p1", as a title says it; "replica p1" where its stage is not known
    node: str | None
    part: float  # its part of the window's KV-transfer seconds (or failures)
    per_transfer: float | None  # its mean seconds per transfer
    others_per_transfer: float | None  # the mean of the replica's other transfers


def dominant_peer(window: ServingStats, by: str, part: float, known: dict[str, ReplicaStats]) -> Peer | None:
    """The peer that holds at least `part` of the window's KV-transfer "seconds" or "failures", or None (no peer
    said, or none holds that much: the path is slow on the replica's own side, or everywhere)."""
    peers = window.kv_transfer_peers
    total = (window.sums.get("kv_transfer", 0.0) if by == "seconds"
             else max(window.kv_transfer_failures, window.failed.get("kv_transfer", 0)))
    if not peers or total <= 0:
        return None
    name, top = max(peers.items(), key=lambda kv: (getattr(kv[1], by), kv[0]))
    mine = getattr(top, by) / total
    if mine < part:
        return None
    count = sum(window.histograms.get("kv_transfer", {}).values())
    rest_seconds = max(window.sums.get("kv_transfer", 0.0) - top.seconds, 0.0)
    other = known.get(name)
    label = f"{other.stage} {name}" if other is not None and other.stage != "mixed" else f"replica {name}"
    return Peer(name, label, other.node or None if other is not None else None, round(min(mine, 1.0), 4),
                top.seconds / top.count if top.count else None,
                rest_seconds / (count - top.count) if count > top.count else None)


def peers_evidence(window: ServingStats) -> dict[str, dict[str, Any]]:
    """The peers that moved the most KV-transfer time, with their sums."""
    ranked = sorted(window.kv_transfer_peers.items(), key=lambda kv: (-kv[1].seconds, kv[0]))[:PEERS_IN_EVIDENCE]
    return {name: {"seconds": round(kv.seconds, 6), "transfers": kv.count, "failures": kv.failures,
                   "bytes": kv.bytes} for name, kv in ranked}


def _from_peer(peer: Peer, what: str) -> str:
    """How `seen` says the peer's part: "97% of the time from prefill p1, 31.0 ms per transfer (others: 0.8 ms)"."""
    out = f"{peer.part:.0%} of the {what} from {peer.label}"
    if peer.per_transfer is not None:
        out += f", {peer.per_transfer * 1000:.1f} ms per transfer"
        if peer.others_per_transfer is not None:
            out += f" (the others: {peer.others_per_transfer * 1000:.1f} ms)"
    return out


@register
class KvTransfer(Detector):
    """A serving replica with `min_failures` KV transfers failed in its window (critical), or whose KV-transfer
    share of TTFT is at least `min_share`, `factor` times its baseline and `min_rise` above it, for
    `persist_seconds` (warning); without a baseline (under `min_points` normal points), a share of at least
    `absolute_share`. Shares are judged only with `min_requests` first tokens in the window. A replica whose
    latest report is older than `fresh_seconds` is not judged. One incident per replica; it names the peer
    replica that holds `peer_part` of the time (or failures), where the replica says its peers.

    Options (defaults): min_failures 3, min_share 0.1, factor 3, min_rise 0.05, absolute_share 0.3,
    persist_seconds 30, min_points 6, min_requests 20, fresh_seconds 30, peer_part 0.6. Layer: interconnect
    (the transfer's path); action: record (the incident names the stage, the peer and the share; replacing a
    replica does not mend the path between two).
    """

    name = "kv_transfer"
    periodic = True

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.history: dict[tuple[int, str], JobBaseline] = {}

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        findings: list[Finding] = []
        subjects = 0
        seen: set[tuple[int, str]] = set()
        known: dict[int, dict[str, ReplicaStats]] = {}  # a job's replicas by name: the peers' stage and node
        for job_id, r in view.fresh(now, self.option("fresh_seconds", 30.0)):
            window = view.window(job_id, r.replica, now)
            first_tokens = sum(window.histograms.get("ttft", {}).values())
            failures = max(window.kv_transfer_failures, window.failed.get("kv_transfer", 0))
            if failures == 0 and "kv_transfer" not in window.sums:
                continue  # no KV transfers here: not a disaggregated replica
            subjects += 1
            key = (job_id, r.replica)
            seen.add(key)
            if window.kv_transfer_peers and job_id not in known:
                known[job_id] = {x.replica: x for x in view.replicas(job_id, now)}
            share = self._share(window) if first_tokens >= self.option("min_requests", 20) else None
            history = self.history.setdefault(key, JobBaseline(SAMPLE_SECONDS, KEEP_SECONDS))
            finding, held = self._judge(job_id, r, window, share, failures, now, view.window_seconds,
                                        known.get(job_id, {}))
            if share is not None:  # a point taken while the condition holds never enters the baseline
                history.record(now, {"share": share}, held=held)
            if finding is not None:
                findings.append(finding)
        self.onsets.sweep()
        prune(self.history, seen)
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, subjects)

    @staticmethod
    def _share(window: ServingStats) -> float | None:
        ttft = window.sums.get("ttft")
        return min(1.0, window.sums.get("kv_transfer", 0.0) / ttft) if ttft else None

    def _judge(self, job_id: int, r: ReplicaStats, window: ServingStats, share: float | None, failures: int,
               now: float, window_seconds: float, known: dict[str, ReplicaStats]) -> tuple[Finding | None, bool]:
        """The finding, if one is due; and whether the condition holds (persisting or not)."""
        key = f"job={job_id}|replica={r.replica}"
        history = self.history.get((job_id, r.replica))
        base = history.baseline("share", now - KEEP_SECONDS, now - window_seconds) if history else None
        usual = base.median if base is not None and base.points >= self.option("min_points", 6) else None
        part = self.option("peer_part", 0.6)
        if failures >= self.option("min_failures", 3):
            onset = self.onsets.hold(key, now)
            peer = dominant_peer(window, "failures", part, known)
            what = (f"{failures} KV transfers" + (f" from {peer.label}" if peer else "")
                    + f" failed in the last {window_seconds:.0f} s")
            return self._finding(job_id, r, window, share, usual, failures, now, onset, "critical", what, key,
                                 peer), True
        if share is None:
            return None, False
        if usual is not None:
            spiking = (share >= self.option("min_share", 0.1) and share >= self.option("factor", 3.0) * usual
                       and share - usual >= self.option("min_rise", 0.05))
        else:
            spiking = share >= self.option("absolute_share", 0.3)
        if not spiking:
            return None, False
        onset = self.onsets.hold(key, now)
        if now - onset < self.option("persist_seconds", 30.0):
            return None, True
        peer = dominant_peer(window, "seconds", part, known)
        what = ("KV transfer" + (f" from {peer.label}" if peer else "") + f" takes {share:.0%} of TTFT"
                + (f", baseline {usual:.1%}" if usual is not None else ""))
        return self._finding(job_id, r, window, share, usual, failures, now, onset, "warning", what, key,
                             peer), True

    def _finding(self, job_id: int, r: ReplicaStats, window: ServingStats, share: float | None, usual: float | None,
                 failures: int, now: float, onset: float, severity: str, what: str, key: str,
                 peer: Peer | None) -> Finding:
        moved = window.kv_transfer_bytes
        transfers = sum(window.histograms.get("kv_transfer", {}).values())
        per = f"{moved / transfers / 2**20:.1f} MiB per transfer" if transfers and moved else "bytes not reported"
        if peer is not None:
            per += "; " + _from_peer(peer, "time" if severity == "warning" else "failures")
        history = self.history.get((job_id, r.replica))
        path = f"from {peer.node or peer.label} to" if peer is not None else "to"
        return Finding(
            detector=self.name, key=key, severity=severity, layer="interconnect",
            subject=Subject(node=r.node or None, job_id=job_id, rank=r.rank),
            title=f"serving job {job_id}: {r.label}: {what}",
            seen=f"{r.label} (rank {r.rank}, node {r.node}): {what}; {transfers} transfers, "
                 f"{per}" + (f"; share of TTFT {share:.1%}" if share is not None and failures else ""),
            comparison=(f"its own median share over the last hour: {usual:.1%}" if usual is not None
                        else "no baseline of this replica yet (under an hour of normal points)"),
            evidence={"replica": r.replica, "stage": r.stage, "source": r.source, "share": share,
                      "baseline_share": usual, "failures": failures, "transfers": transfers,
                      "bytes": moved, "peer": peer.name if peer else None, "peer_part": peer.part if peer else None,
                      "peers": peers_evidence(window), "window": history.window("share", now) if history else {
                          "metric": "share", "times": [], "values": []}},
            next_steps=[f"Check the path the KV cache takes {path} {r.node or 'its node'} (the NIC's counters: "
                        "`sentinel status`, the network dashboard; the transfer library's log: NIXL, Mooncake)",
                        "Compare with the job's other replicas of this stage: one replica slow is its node or "
                        "link; all of them is the prefill side or the fabric"
                        + (f"; those that take from {peer.label} too say whether it is that side" if peer else ""),
                        "If it lasts, move the replica off the node (`sentinel incidents` has its id)"],
            action="record", observed_at=onset)
