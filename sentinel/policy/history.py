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

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from sentinel.incidents.models import Incident
from sentinel.policy.features import Fault, faults_by_node, kind_of_layer

HARDWARE_LAYERS = ("hardware", "interconnect", "accelerator", "node", "host")
LOOK_BACK = timedelta(days=120)


def node_fault_history(session: Session, now: datetime, *, look_back: timedelta = LOOK_BACK
                       ) -> dict[str, list[Fault]]:
    """Each node's faults (start order) that opened within `look_back` of `now`, or are still open."""
    since = now - look_back
    rows = session.execute(
        select(Incident.node, Incident.opened_at, Incident.resolved_at, Incident.layer, Incident.detector)
        .where(Incident.node.is_not(None), Incident.layer.in_(HARDWARE_LAYERS),
               or_(Incident.severity == "critical", Incident.detector == "heartbeat"),
               or_(Incident.opened_at >= since, Incident.resolved_at.is_(None)),
               Incident.opened_at <= now))
    return faults_by_node(
        (str(node), opened.timestamp(), resolved.timestamp() if resolved is not None else None,
         kind_of_layer("node" if detector == "heartbeat" else layer))  # a silent node: the host, not its GPUs
        for node, opened, resolved, layer, detector in rows)
