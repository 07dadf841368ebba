"""What the MCP tools answer beyond the REST API's own models: the fleet at a glance, and an incident with
its evidence (the REST route's detail view)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel

from sentinel.incidents.schemas import IncidentOut


class FleetHealth(BaseModel):
    nodes: dict[str, int]  # by state (active, cordoned, draining, down)
    accelerators: dict[str, int]  # by health
    open_incidents: dict[str, int]  # by severity
    breaker_open: bool
    worst_incidents: list[str]  # "#id severity title", the most severe first (at most 10)


class IncidentEvidence(IncidentOut):
    evidence: dict[str, Any]
    text: str


def fleet_health_of(nodes: list[dict[str, Any]], accelerators: list[dict[str, Any]], incidents: dict[str, Any],
                    breaker: dict[str, Any]) -> FleetHealth:
    rank = {"critical": 0, "warning": 1, "info": 2}
    active = sorted(incidents.get("incidents", []), key=lambda i: (rank.get(i["severity"], 3), -i["id"]))
    return FleetHealth(nodes=dict(Counter(n["state"] for n in nodes)),
                       accelerators=dict(Counter(a["health"] for a in accelerators)),
                       open_incidents=dict(Counter(i["severity"] for i in active)),
                       breaker_open=bool(breaker.get("open")),
                       worst_incidents=[f"#{i['id']} {i['severity']} {i['title']}" for i in active[:10]])
