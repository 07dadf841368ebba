"""One text for an incident, used by the alert payloads, the API and the CLI alike (DESIGN §5)."""

from __future__ import annotations

from sentinel.incidents.models import Incident

LAYER_NAMES = {"hardware": "hardware", "interconnect": "interconnect", "compute": "compute",
               "input_pipeline": "input pipeline", "checkpoint_io": "checkpoint I/O", "software": "software",
               "unknown": "unknown"}


def labels(incident: Incident) -> dict[str, str]:
    """Labels for routing, silences and Alertmanager. Absent subjects are left out, never empty."""
    out = {"alertname": alertname(incident.detector), "severity": incident.severity, "detector": incident.detector,
           "layer": incident.layer, "fingerprint": incident.fingerprint, "source": "sentinel"}
    if incident.node:
        out["node"] = incident.node
    if incident.accelerator_uuid:
        out["accelerator"] = incident.accelerator_uuid
    if incident.job_id is not None:
        out["job"] = str(incident.job_id)
    if incident.rank is not None:
        out["rank"] = str(incident.rank)
    return out


def alertname(detector: str) -> str:
    """`task_exit` → `SentinelTaskExit`."""
    return "Sentinel" + "".join(part.capitalize() for part in detector.replace("-", "_").split("_"))


def subject(incident: Incident) -> str:
    parts = []
    if incident.job_id is not None:
        parts.append(f"job {incident.job_id}" + (f" rank {incident.rank}" if incident.rank is not None else ""))
    if incident.node:
        parts.append(f"node {incident.node}")
    if incident.accelerator_uuid:
        parts.append(f"accelerator {incident.accelerator_uuid}")
    return ", ".join(parts) or "the fleet"


def did(incident: Incident) -> list[str]:
    """What Sentinel did, oldest first, one line each."""
    return [str(a.get("text", "")) for a in incident.actions]


def sections(incident: Incident) -> list[tuple[str, str]]:
    """(heading, text) pairs in reading order: seen, compared with, layer, done, next."""
    out = [("What was seen", incident.seen)]
    if incident.comparison:
        out.append(("Compared with", incident.comparison))
    out.append(("Points at", f"{LAYER_NAMES.get(incident.layer, incident.layer)} layer"))
    done = did(incident)
    if done:
        out.append(("What Sentinel did", "\n".join(f"- {line}" for line in done)))
    if incident.next_steps:
        out.append(("What to check next", "\n".join(f"{i}. {s}" for i, s in enumerate(incident.next_steps, 1))))
    return out


def headline(incident: Incident) -> str:
    return f"[{incident.severity.upper()}] #{incident.id} {incident.title}"


def text(incident: Incident) -> str:
    """Plain text: the headline, then every section."""
    lines = [headline(incident), f"State: {incident.state} · subject: {subject(incident)} · "
                                 f"fingerprint: {incident.fingerprint}"]
    for heading, body in sections(incident):
        lines.append("")
        lines.append(f"{heading}:")
        lines.extend(f"  {line}" for line in body.splitlines())
    return "\n".join(lines)
