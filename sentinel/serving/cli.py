"""`sentinel jobs`: the serving table under the jobs table, a row per job (`all`) and per replica."""

from __future__ import annotations

from typing import Any

from sentinel.console import table

HEADERS = ["JOB", "REPLICA", "STAGE", "NODE", "REQ/S", "TTFT p50/p99", "TPOT p50/p99", "QUEUE p99", "KV SHARE",
           "SLO MET", "FAILED", "RUN/WAIT", "KV CACHE"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _pair(signals: dict[str, Any], signal: str) -> str:
    q = signals["latency_seconds"].get(signal, {})
    return f"{_ms(q.get('p50'))}/{_ms(q.get('p99'))}"


def row(job_id: int, name: str, stage: str, node: str, signals: dict[str, Any], replica: dict[str, Any] | None
        ) -> list[object]:
    rate = signals["requests_per_second"]
    failed = sum(signals["failed"].values())
    run_wait = "-" if replica is None or replica["running"] is None else (
        f"{replica['running']}/{'-' if replica['waiting'] is None else replica['waiting']}")
    cache = "-" if replica is None else _pct(replica["kv_cache_usage_ratio"])
    return [job_id, name, stage, node, "-" if rate is None else f"{rate:.1f}", _pair(signals, "ttft"),
            _pair(signals, "tpot"), _ms(signals["latency_seconds"].get("queue", {}).get("p99")),
            _pct(signals["kv_transfer_ratio"]), _pct(signals["slo_attainment_ratio"]),
            f"{failed}" + (f" ({_pct(signals['failed_ratio'])})" if failed else ""), run_wait, cache]


def serving_table(client: Any, jobs: list[dict[str, Any]]) -> str | None:
    """The serving jobs' request signals over the server's window; None when no job serves."""
    rows: list[list[object]] = []
    for job in jobs:
        if job["kind"] != "serving":
            continue
        out = client.get(f"/jobs/{job['id']}/serving")
        rows.append(row(job["id"], "all", "", "", out["signals"], None))
        for r in out["replicas"]:
            rows.append(row(job["id"], r["replica"], r["stage"], r["node"], r["signals"], r))
    if not rows:
        return None
    return table(HEADERS, rows)
