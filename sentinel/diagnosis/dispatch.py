"""Starting experiments: check the target, turn a proposal into an agent command (or a server-side reading of
fresh telemetry), and the calibrations a job's baseline leaves as references."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sentinel.diagnosis import experiments as catalog
from sentinel.diagnosis.components import RankProfile
from sentinel.diagnosis.schemas import ExperimentProposal

if TYPE_CHECKING:
    from sentinel.diagnosis.context import LiveContext as DetectionContext
    from sentinel.nodes.commands import CommandQueue
    from sentinel.telemetry.schemas import Assignment

log = logging.getLogger("sentinel.diagnosis")

MAX_CALIBRATION_PAIRS = 4


class Dispatch:
    def __init__(self, book: catalog.ExperimentBook, commands: CommandQueue | None,
                 attributes: Callable[[int], dict[str, Any]]):
        self.book = book
        self.commands = commands
        self.attributes = attributes

    def start(self, ctx: DetectionContext, job_id: int, p: ExperimentProposal, now: float, *,
              index_of: Callable[[str], int | None], baseline_cpu_wait: float | None = None,
              calibration: bool = False) -> catalog.Running:
        """Raises LookupError for an unknown job, node or accelerator, ValueError for a target that cannot be."""
        ranks = {t.rank: (node_id, t) for node_id, tasks in ctx.assignments().items() for t in tasks
                 if t.job_id == job_id}
        if not ranks:
            raise ValueError(f"job {job_id} is not running: no task of it is placed on a node")
        if p.kind in catalog.SERVER_KINDS:
            if p.rank is None:
                raise ValueError(f"a {p.kind} experiment needs the rank to measure")
            target = f"rank {p.rank}'s " + ("data loader" if p.kind == "data_loader" else "compute against its peers")
            return self.book.open(job_id, p, target, now)
        if p.node is None:
            raise ValueError(f"a {p.kind} experiment needs the node to run on")
        live = ctx.fleet.get(p.node)
        if live is None:
            raise LookupError(f"node {p.node} is not registered")
        if self.commands is None:
            raise ValueError("this server cannot reach agents")
        spec, target, key = self._spec(ctx, job_id, p, live.id, live.accelerators, ranks, index_of)
        item = self.book.open(job_id, p, target, now, calibration=calibration, baseline_cpu_wait=baseline_cpu_wait,
                              key=key)
        spec["id"] = item.out.id
        self.commands.push_experiment(p.node, spec)
        log.info("experiment started: id=%s job=%d kind=%s node=%s target=%s%s", item.out.id, job_id, p.kind, p.node,
                 target, " (calibration)" if calibration else "")
        return item

    def _spec(self, ctx: DetectionContext, job_id: int, p: ExperimentProposal, node_id: int, on_node: set[str],
              ranks: dict[int, tuple[int, Assignment]], index_of: Callable[[str], int | None]
              ) -> tuple[dict[str, Any], str, str]:
        """(the agent's spec, what it measures in words, its calibration reference key)."""
        assert p.node is not None
        spec: dict[str, Any] = {"kind": p.kind}
        key = ""
        if p.kind == "gemm":
            placed = [u for _, t in ranks.values() if t.rank == p.rank for u in t.accelerators]
            uuid = p.accelerator or (placed[0] if placed else None)
            if uuid is None or uuid not in on_node:
                raise LookupError(f"accelerator {uuid} is not on node {p.node}")
            index = index_of(uuid)
            if index is None:
                raise LookupError(f"accelerator {uuid} has no index on record")
            spec["accelerator_index"], target = index, f"GEMM on {uuid}"
        elif p.kind == "cpu":
            pids = [t.pid for node_id, t in ranks.values() if node_id == node_id and t.pid
                    and (p.rank is None or t.rank == p.rank)]
            if not pids:
                raise LookupError(f"job {job_id} has no task with a known pid on node {p.node}")
            spec["pids"], target = pids, f"CPU wait of job {job_id}'s task on {p.node}"
        elif p.kind == "disk_write":
            path = str(self.attributes(job_id).get("checkpoint_dir") or "")
            if not path:
                raise ValueError(f"job {job_id} registered no checkpoint_dir attribute to measure")
            spec["path"], target, key = path, f"write throughput of {path} on {p.node}", \
                catalog.reference_key("disk_write", p.node, path)
        elif p.kind == "collective":
            peer = p.peer or p.node
            address = ctx.network.plan.participants().get(peer) if ctx.network is not None else None
            if ctx.fleet.get(peer) is None:
                raise LookupError(f"node {peer} is not registered")
            if not address:
                raise ValueError(f"node {peer} registered no probe address to exchange with")
            spec["peer"], target, key = address, f"bus bandwidth {p.node}↔{peer}", \
                catalog.reference_key("collective", p.node, peer)
        else:  # memory_bandwidth
            target, key = f"memory bandwidth of {p.node}", catalog.reference_key("memory_bandwidth", p.node, "")
        return spec, target, key

    def calibrate(self, ctx: DetectionContext, job_id: int, profiles: dict[int, RankProfile], now: float) -> None:
        """References for the experiments that need one, measured while the job is healthy."""
        nodes = sorted({p.node for p in profiles.values()})
        if not nodes:
            return
        wanted: list[ExperimentProposal] = []
        if self.attributes(job_id).get("checkpoint_dir"):
            wanted += [ExperimentProposal(kind="disk_write", node=n, why="calibration", expect="") for n in nodes]
        first = nodes[0]
        for peer in (nodes[1:] or [first])[:MAX_CALIBRATION_PAIRS]:
            wanted.append(ExperimentProposal(kind="collective", node=first, peer=peer, why="calibration", expect=""))
            if peer != first:
                wanted.append(ExperimentProposal(kind="collective", node=peer, peer=first, why="calibration",
                                                 expect=""))
        for proposal in wanted:
            try:
                self.start(ctx, job_id, proposal, now, index_of=lambda uuid: None, calibration=True)
            except (LookupError, ValueError) as exc:
                log.info("calibration skipped: job=%d kind=%s node=%s: %s", job_id, proposal.kind, proposal.node, exc)

    def finish_server_side(self, item: catalog.Running, profiles: dict[int, RankProfile],
                           base: dict[int, RankProfile], now: float) -> None:
        rank = item.proposal.rank if item.proposal.rank is not None else -1
        if item.proposal.kind == "data_loader":
            found = catalog.loader_rate(profiles, base, rank)
            if found is None:
                self.book.finish(item, None, "", "", now, error=f"rank {rank} timed no data-loader wait in the "
                                                                 f"{catalog.FRESH_WINDOW_SECONDS:.0f} s window")
                return
            delivered, consumed, detail = found
            item.out.expected, item.out.expected_from = consumed, "the loader's batches/s at the job's baseline"
            self.book.finish(item, delivered, "batches/s", detail, now)
            return
        ratio = catalog.compute_ratio(profiles, rank)
        if ratio is None:
            self.book.finish(item, None, "", "", now, error=f"rank {rank} or its peers sent no steps in the window")
            return
        self.book.finish(item, ratio[0], "ratio", ratio[1], now)
