"""Where ranks go: spare accelerators that are healthy, free, of the same model, with enough memory, on
nodes that take work; a job's ranks that shared a node (a tensor-parallel group) stay together when
one node can hold them. The policy is a plugin (`placement_policy`, entry points `sentinel.placement`);
the learned one, and the shadow that runs beside the active one, are in sentinel/policy/.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import entry_points
from typing import ClassVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.jobs.models import Job, Task
from sentinel.nodes.models import Node


class NoCapacity(Exception):
    """No placement fits; the message says what was missing."""


@dataclass(frozen=True)
class Slot:
    uuid: str
    node: str
    index: int
    model: str
    memory_total_bytes: int


@dataclass
class Inventory:
    slots: dict[str, Slot]  # every present accelerator
    free: set[str]  # healthy, present, on a node taking work, no running task of another job
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, session: Session, *, job_id: int | None = None,
             node_states: dict[str, str] | None = None) -> Inventory:
        """`node_states` (from memory) wins over the rows: the fleet view knows a node went down first."""
        slots: dict[str, Slot] = {}
        free: set[str] = set()
        labels: dict[str, dict[str, str]] = {}
        busy: set[str] = set()
        nodes: dict[int, tuple[str, str]] = {}  # id → (name, state)
        for task_job, accelerators in session.execute(select(Task.job_id, Task.accelerators)
                                                      .where(Task.state == "running")):
            if task_job != job_id:
                busy.update(accelerators)
        # Plain columns, not ORM objects: at 100,000 accelerators the objects took seconds of the GIL per load,
        # and a fault's remediation loads the fleet twice (the breaker, then the moves).
        for node_id, name, node_labels, node_state in session.execute(
                select(Node.id, Node.name, Node.labels, Node.state)):
            labels[name] = {str(k): str(v) for k, v in (node_labels or {}).items()}
            nodes[node_id] = (name, (node_states or {}).get(name, node_state))
        rows = session.execute(select(Accelerator.uuid, Accelerator.node_id, Accelerator.index, Accelerator.model,
                                      Accelerator.memory_total_bytes, Accelerator.health)
                               .where(Accelerator.present.is_(True)))
        for uuid, node_id, index, model, memory, health in rows:
            name, state = nodes[node_id]
            slots[uuid] = Slot(uuid, name, index, model, memory)
            if health == "healthy" and state == "active" and uuid not in busy:
                free.add(uuid)
        held = {slot.node for slot in slots.values()}  # nodes with a present accelerator, as before
        return cls(slots=slots, free=free, node_labels={n: labels[n] for n in held})


@dataclass(frozen=True)
class PlacementRequest:
    job_id: int
    ranks: dict[int, list[str]]  # rank → its accelerators now ([] when it has none yet)
    replace: frozenset[int]  # ranks that need new accelerators
    accelerators_per_rank: int = 1
    avoid_nodes: frozenset[str] = frozenset()


Placement = dict[int, tuple[str, list[str]]]  # rank → (node, accelerators)


class PlacementPolicy(ABC):
    name: ClassVar[str] = ""

    def prepare(self, session: Session, now: datetime, *, incident_id: int | None = None) -> PlacementPolicy:
        """The policy for one decision, given what it may read (the learned one: the nodes' fault history) and
        the incident it serves; called before `place` in the same transaction. Default: itself, unchanged."""
        return self

    @abstractmethod
    def place(self, request: PlacementRequest, inventory: Inventory) -> Placement:
        """A full placement for every rank of the request (kept ranks unchanged); raises NoCapacity."""

    def explanation(self) -> list[str]:
        """Lines for the incident's timeline about the last `place`: why these nodes. Default: none."""
        return []


class BestFitSameModel(PlacementPolicy):
    """Ranks keep what they have unless listed in `replace`. The ranks to move are grouped by the node
    they were on; each group goes whole to the node whose matching free accelerators fit it most
    tightly (best fit keeps large free nodes for large jobs), else rank by rank. Matching: the model
    of the accelerators being replaced (for a new job: the model with the most free accelerators),
    and at least their memory."""

    name = "best-fit"

    def place(self, request: PlacementRequest, inventory: Inventory) -> Placement:
        out: Placement = {}
        free = set(inventory.free)
        for rank, uuids in request.ranks.items():
            if rank not in request.replace and uuids:
                node = inventory.slots[uuids[0]].node if uuids[0] in inventory.slots else ""
                out[rank] = (node, list(uuids))
                free.difference_update(uuids)
        moving = sorted(request.replace)
        if not moving:  # a restart in place: every rank keeps its accelerators, even on a full fleet
            return out
        old = [inventory.slots[u] for r in moving for u in request.ranks.get(r, []) if u in inventory.slots]
        if old:
            model = Counter(s.model for s in old).most_common(1)[0][0]
            memory = max(s.memory_total_bytes for s in old)
        else:
            counts = Counter(inventory.slots[u].model for u in free
                             if inventory.slots[u].node not in request.avoid_nodes)
            if not counts:
                raise NoCapacity("no free healthy accelerator on a node that takes work")
            model, memory = counts.most_common(1)[0][0], 0
        candidates = sorted((s for u in free if (s := inventory.slots[u]).model == model
                             and s.memory_total_bytes >= memory and s.node not in request.avoid_nodes),
                            key=lambda s: (s.node, s.index))
        by_node: dict[str, list[Slot]] = {}
        for slot in candidates:
            by_node.setdefault(slot.node, []).append(slot)
        groups: dict[str, list[int]] = {}
        for rank in moving:
            uuids = request.ranks.get(rank, [])
            home = inventory.slots[uuids[0]].node if uuids and uuids[0] in inventory.slots else ""
            groups.setdefault(home, []).append(rank)
        k = request.accelerators_per_rank
        for _home, ranks in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            need = k * len(ranks)
            fitting = self.order_nodes([n for n, slots in by_node.items() if len(slots) >= need], by_node)
            if fitting:
                self._take(out, ranks, fitting[0], by_node, k)
                continue
            for rank in ranks:  # no node holds the whole group: rank by rank
                single = self.order_nodes([n for n, slots in by_node.items() if len(slots) >= k], by_node)
                if not single:
                    have = sum(len(s) for s in by_node.values())
                    raise NoCapacity(f"{len(moving) * k} accelerator(s) of model {model!r} needed for job "
                                     f"{request.job_id}, {have} healthy and free on nodes that take work")
                self._take(out, [rank], single[0], by_node, k)
        return out

    def order_nodes(self, nodes: list[str], by_node: dict[str, list[Slot]]) -> list[str]:
        """The nodes that fit, best first: the tightest fit (fewest matching free accelerators), then by name."""
        return sorted(nodes, key=lambda n: (len(by_node[n]), n))

    @staticmethod
    def _take(out: Placement, ranks: list[int], node: str, by_node: dict[str, list[Slot]], k: int) -> None:
        for rank in ranks:
            taken, by_node[node] = by_node[node][:k], by_node[node][k:]
            out[rank] = (node, [s.uuid for s in taken])
        if not by_node[node]:
            del by_node[node]


POLICIES: dict[str, type[PlacementPolicy]] = {BestFitSameModel.name: BestFitSameModel}


def load_policy(name: str) -> PlacementPolicy:
    if name not in POLICIES:
        for ep in entry_points(group="sentinel.placement"):
            if ep.name == name:
                POLICIES[name] = ep.load()
    if name not in POLICIES:
        raise ValueError(f"placement policy {name!r} is unknown; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]()


def first_placement(session: Session, placement: PlacementPolicy, job: Job, node_states: dict[str, str], *,
                    accelerators_per_rank: int, avoid_nodes: frozenset[str], only_nodes: list[str], now: datetime
                    ) -> dict[int, tuple[str, list[str]]]:
    """A placement for every rank of a new job from the policy; `only_nodes` (when given) are the nodes it
    may use, e.g. the launcher's own. NoCapacity when none fits."""
    if only_nodes:
        node_states = {name: (state if name in only_nodes else "elsewhere") for name, state in node_states.items()}
    inventory = Inventory.load(session, job_id=job.id, node_states=node_states)
    request = PlacementRequest(job.id, {r: [] for r in range(job.world_size)}, frozenset(range(job.world_size)),
                               accelerators_per_rank, avoid_nodes)
    return placement.prepare(session, now).place(request, inventory)
