"""HTML for the status page: plain strings with every value passed through `html.escape`.

No template engine, no script: the page refreshes itself with `<meta http-equiv="refresh">`, so the
Content-Security-Policy the router sends can forbid scripts altogether.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from html import escape

from sentinel.jobs.schemas import JobMetrics

REFRESH_SECONDS = 10
GIB = 2**30

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1d1d1f;background:#fafafa}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
header{display:flex;justify-content:space-between;align-items:baseline;flex-wrap:wrap;gap:1rem}
.muted{color:#666}.summary span{margin-right:1.2rem}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:.25rem .45rem;text-align:left}
th{background:#f0f0f0;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.acc{min-width:5.5rem;font-size:12px;white-space:nowrap}
.healthy{background:#d7f0d8;color:#1b5e20}.suspect{background:#fff1c2;color:#7a4f00}
.quarantined{background:#f9c9c9;color:#8e0000;font-weight:600}
.absent{background:#e6e6e6;color:#8a8a8a;font-style:italic}
.state-active{color:#1b5e20}.state-cordoned,.state-draining{color:#7a4f00}.state-down{color:#8e0000;font-weight:600}
.labels{font-size:12px;color:#555}
.incident{background:#fff;border:1px solid #ddd;border-left:6px solid #999;padding:.5rem .9rem;margin:.6rem 0}
.incident.critical{border-left-color:#c62828}.incident.warning{border-left-color:#f9a825}
.incident.info{border-left-color:#1565c0}.incident h3{font-size:1rem;margin:.2rem 0}
.incident h4{font-size:.85rem;margin:.6rem 0 .1rem;color:#444}
.incident pre{white-space:pre-wrap;font:inherit;margin:0}
.sev{text-transform:uppercase;font-size:11px;font-weight:700;padding:0 .35rem;border-radius:3px;color:#fff}
.sev.critical{background:#c62828}.sev.warning{background:#b77900}.sev.info{background:#1565c0}
.breaker-open{background:#f9c9c9;color:#8e0000;padding:.4rem .7rem;font-weight:600}
.breaker-closed{color:#1b5e20}
form.inline{display:inline}.login{max-width:26rem;margin:4rem auto;background:#fff;border:1px solid #ddd;padding:1.2rem}
.login input[type=password]{width:100%;box-sizing:border-box;padding:.4rem;margin:.4rem 0 .8rem}
.error{color:#8e0000;font-weight:600}
"""


@dataclass(frozen=True)
class AcceleratorCell:
    index: int
    uuid: str
    model: str
    health: str
    health_reason: str
    present: bool
    utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int = 0
    sample_age_seconds: float | None = None


@dataclass(frozen=True)
class NodeRow:
    name: str
    state: str
    labels: dict[str, str]
    last_seen_age_seconds: float | None
    accelerators: list[AcceleratorCell]


@dataclass(frozen=True)
class IncidentView:
    id: int
    severity: str
    state: str
    title: str
    subject: str
    age_seconds: float
    occurrences: int
    sections: list[tuple[str, str]]


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    kind: str
    state: str
    world_size: int
    metrics: JobMetrics


@dataclass(frozen=True)
class StatusView:
    """Everything the page shows, gathered by the router in one read-only session."""

    actor: str
    generated_at: datetime
    version: str
    nodes: list[NodeRow]
    nodes_total: int
    node_counts: dict[str, int]
    health_counts: dict[str, int]
    incidents: list[IncidentView]
    incidents_total: int
    jobs: list[JobRow]
    breaker_open: bool
    breaker_reason: str = ""
    notes: list[str] = field(default_factory=list)


def e(value: object) -> str:
    return escape(str(value), quote=True)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    for limit, unit, div in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / div:.0f} {unit}"
    return f"{seconds / 86400:.0f} d"


def pct(ratio: float | None) -> str:
    return "—" if ratio is None else f"{100 * ratio:.1f} %"


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GIB:.1f} GiB"


def page(title: str, body: str, *, refresh: bool = False) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">{meta}'
            f"<title>{e(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>")


def login_page(base: str, message: str = "") -> str:
    """The only thing shown without a valid session: a token field, no fleet data."""
    error = f'<p class="error" role="alert">{e(message)}</p>' if message else ""
    return page("Sentinel · sign in", (
        f'<main class="login"><h1>Sentinel status</h1>{error}'
        f'<form method="post" action="{e(base)}/ui/login">'
        '<label for="token">API token (any role that may read: viewer, operator, launcher, admin)</label>'
        '<input type="password" id="token" name="token" autocomplete="off" required autofocus>'
        '<button type="submit">Sign in</button></form>'
        '<p class="muted">The token is kept in an HttpOnly cookie for this page only.</p></main>'))


def status_page(view: StatusView, base: str) -> str:
    return page("Sentinel status", "".join((
        _header(view, base), _fleet(view), _incidents(view), _jobs(view),
        f'<p class="muted">Refreshes every {REFRESH_SECONDS} s. Read-only; change things with the '
        "<code>sentinel</code> CLI or the REST API.</p>")), refresh=True)


def _header(view: StatusView, base: str) -> str:
    # colour only what is there: "down: 0" in red would draw the eye to nothing
    nodes = " ".join(f'<span class="{f"state-{e(s)}" if n else "muted"}">{e(s)}: {n}</span>'
                     for s, n in sorted(view.node_counts.items()))
    health = " ".join(f'<span class="{e(h) if n else "muted"}">{e(h)}: {n}</span>'
                      for h, n in view.health_counts.items())
    if view.breaker_open:
        breaker = (f'<p class="breaker-open" id="breaker" data-open="true">Circuit breaker OPEN: automatic '
                   f"quarantines and drains are stopped until an operator resets it. {e(view.breaker_reason)}</p>")
    else:
        breaker = ('<p class="breaker-closed" id="breaker" data-open="false">Circuit breaker closed: automatic '
                   "remediation may act.</p>")
    notes = "".join(f'<p class="muted">{e(n)}</p>' for n in view.notes)
    stamp = view.generated_at.isoformat(timespec="seconds")
    return (f'<header><div><h1>Sentinel status</h1><span class="muted">{e(stamp)} · v{e(view.version)}</span></div>'

            f'<div>signed in as <b>{e(view.actor)}</b> '
            f'<form class="inline" method="post" action="{e(base)}/ui/logout"><button type="submit">Sign out</button>'
            f"</form></div></header>"
            f'<p class="summary"><span>Nodes {view.nodes_total}: {nodes or "none"}</span>'
            f"<span>Accelerators: {health}</span><span>Open incidents: {view.incidents_total}</span></p>"
            f"{breaker}{notes}")


def _fleet(view: StatusView) -> str:
    if not view.nodes:
        return '<h2>Fleet</h2><p class="muted">No node has registered yet.</p>'
    width = max(len(n.accelerators) for n in view.nodes)
    head = "".join(f"<th>#{i}</th>" for i in range(width))
    rows = []
    for node in view.nodes:
        labels = " ".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
        cells = "".join(_accelerator(a) for a in node.accelerators)
        cells += "<td></td>" * (width - len(node.accelerators))
        rows.append(f'<tr data-node="{e(node.name)}"><th scope="row">{e(node.name)}'
                    f'<div class="labels">{e(labels)}</div></th>'
                    f'<td class="state-{e(node.state)}" title="last report {e(age(node.last_seen_age_seconds))} ago">'
                    f"{e(node.state)}</td>{cells}</tr>")
    return (f'<h2>Fleet</h2><table id="fleet"><thead><tr><th>Node</th><th>State</th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _accelerator(acc: AcceleratorCell) -> str:
    status = acc.health if acc.present else "absent"
    if acc.sample_age_seconds is None:
        reading, tip = "no sample", "no sample yet"
    else:
        temp = "—" if acc.temperature_celsius is None else f"{acc.temperature_celsius:.0f} °C"
        reading = f"{pct(acc.utilization_ratio)} · {temp}"
        tip = (f"utilization {pct(acc.utilization_ratio)}, temperature {temp}, memory "
               f"{gib(acc.memory_used_bytes)} of {gib(acc.memory_total_bytes)}, "
               f"sampled {age(acc.sample_age_seconds)} ago")
    title = f"{acc.uuid} ({acc.model}): {status}" + (f" — {acc.health_reason}" if acc.health_reason else "")
    return (f'<td class="acc {e(status)}" data-uuid="{e(acc.uuid)}" data-health="{e(status)}" '
            f'title="{e(title)}; {e(tip)}">{e(status)}<br>{e(reading)}</td>')


def _incidents(view: StatusView) -> str:
    if not view.incidents:
        return '<h2>Open incidents</h2><p class="muted" id="incidents">None.</p>'
    shown = len(view.incidents)
    more = f" (newest {shown} of {view.incidents_total})" if view.incidents_total > shown else ""
    return f'<h2>Open incidents{more}</h2><div id="incidents">{"".join(_incident(i) for i in view.incidents)}</div>'


def _incident(i: IncidentView) -> str:
    sections = "".join(f"<h4>{e(heading)}</h4><pre>{e(text)}</pre>" for heading, text in i.sections)
    repeats = f" · seen {i.occurrences} times" if i.occurrences > 1 else ""
    return (f'<article class="incident {e(i.severity)}" data-incident="{i.id}">'
            f'<h3><span class="sev {e(i.severity)}">{e(i.severity)}</span> #{i.id} {e(i.title)}</h3>'
            f'<div class="muted">{e(i.subject)} · opened {e(age(i.age_seconds))} ago · {e(i.state)}{repeats}</div>'
            f"{sections}</article>")


def _jobs(view: StatusView) -> str:
    if not view.jobs:
        return '<h2>Jobs</h2><p class="muted" id="jobs">No job has registered yet.</p>'
    head = ("<tr><th>Job</th><th>State</th><th>MFU</th><th>All-reduce share</th><th>Peak memory</th>"
            "<th>Failures</th><th>Step time p50</th></tr>")
    return (f'<h2>Jobs</h2><table id="jobs"><thead>{head}</thead>'
            f"<tbody>{''.join(_job(j) for j in view.jobs)}</tbody></table>")


def _job(job: JobRow) -> str:
    m = job.metrics
    exposed = f" (exposed {pct(m.allreduce_exposed_ratio)})" if m.allreduce_exposed_ratio is not None else ""
    memory = "—"
    if m.memory_peak_bytes is not None:
        memory = gib(m.memory_peak_bytes)
        if m.memory_capacity_bytes:
            memory += f" of {gib(m.memory_capacity_bytes)} ({pct(m.memory_peak_bytes / m.memory_capacity_bytes)})"
    reasons = ", ".join(f"{r}: {n}" for r, n in sorted(m.task_failures.items()))
    per_hour = f" ({m.failures_per_hour:.2f}/h)" if m.failures_per_hour is not None else ""
    step = "—" if m.step_seconds_p50 is None else f"{m.step_seconds_p50 * 1000:.0f} ms"
    return (f'<tr data-job="{job.id}"><th scope="row">#{job.id} {e(job.name)}'
            f'<div class="labels">{e(job.kind)}, {job.world_size} ranks</div></th><td>{e(job.state)}</td>'
            f'<td class="num mfu">{e(pct(m.mfu_ratio))}</td>'
            f'<td class="num allreduce">{e(pct(m.allreduce_time_ratio))}{e(exposed)}</td>'
            f'<td class="num memory">{e(memory)}</td>'
            f'<td class="num failures" title="{e(reasons or "no failures")}">{m.task_failures_total}{e(per_hour)}</td>'
            f'<td class="num step">{e(step)}</td></tr>')
