"""The live fleet's node fault history, from its incidents: what the learned policy reads on the server, as
`features.Fault`s (the simulator reads the same from a fault trace).

A fault is an incident about a node that points at the hardware: a node, an accelerator on it, or its
interconnect (`HARDWARE_LAYERS`), and that is either critical (an XID or ECC error from the fault catalog, a
fatal event) or a node that stopped reporting (heartbeat). Warnings on those layers are left out: thermal
throttling, a straggler, and the lemon detector's roll-up of faults already counted. The fault starts when
the incident opened and ends when it was resolved (a latched incident stays open until the accelerator is
released: the node is still out). Deduplication makes repeats of one condition one fault.

The look-back is bounded (`LOOK_BACK`, 120 days, past the model's longest window of 90); incidents still
open are kept whatever their age. One query per decision, for every node at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from sentinel.incidents.models import Incident
from sentinel.policy.features import Fault, faults_by_node, kind_of_layer

HARDWARE_LAYERS = ("hardware", "interconnect", "accelerator", "node", "host")
LOOK_BACK = timedelta(days=120)


def fault_filter() -> tuple[Any, ...]:
    """What counts as a node fault (the module's docstring), as SQL conditions on Incident."""
    return (Incident.node.is_not(None), Incident.layer.in_(HARDWARE_LAYERS),
            or_(Incident.severity == "critical", Incident.detector == "heartbeat"))


def faults_opened(session: Session, nodes: Iterable[str], since: datetime, until: datetime
                  ) -> dict[str, list[datetime]]:
    """When each of `nodes` faulted (its fault incidents' opening times) within (since, until], in order."""
    out: dict[str, list[datetime]] = {}
    names = sorted(set(nodes))
    if not names or until <= since:
        return out
    for node, opened in session.execute(
            select(Incident.node, Incident.opened_at).where(*fault_filter(), Incident.node.in_(names),
                                                            Incident.opened_at > since, Incident.opened_at <= until)
            .order_by(Incident.opened_at)):
        out.setdefault(str(node), []).append(opened)
    return out


def node_fault_history(session: Session, now: datetime, *, look_back: timedelta = LOOK_BACK
                       ) -> dict[str, list[Fault]]:
    """Each node's faults (start order) that opened within `look_back` of `now`, or are still open."""
    since = now - look_back
    rows = session.execute(
        select(Incident.node, Incident.opened_at, Incident.resolved_at, Incident.layer, Incident.detector)
        .where(*fault_filter(), or_(Incident.opened_at >= since, Incident.resolved_at.is_(None)),
               Incident.opened_at <= now))
    return faults_by_node(
        (str(node), opened.timestamp(), resolved.timestamp() if resolved is not None else None,
         kind_of_layer("node" if detector == "heartbeat" else layer))  # a silent node: the host, not its GPUs
        for node, opened, resolved, layer, detector in rows)
