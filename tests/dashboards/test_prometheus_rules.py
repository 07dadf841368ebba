"""The Prometheus rules in dashboards/prometheus: promtool accepts them and their unit tests pass, every
alert is labelled and annotated, and every expression reads only series Sentinel exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "prometheus" / "sentinel-rules.yml"
RULE_TESTS = ROOT / "dashboards" / "prometheus" / "sentinel-rules.test.yml"
RUNBOOK = ROOT / "docs" / "alerts.md"
RUNBOOK_URL = "https://github.com/sentinel/sentinel/blob/main/docs/alerts.md#"

# Metric families Sentinel exports, as Prometheus sees them (counters with `_total`). Kept by hand on
# purpose: a rule that names anything else is a typo, or a metric that must be added here first.
AGENT_METRICS = {
    "sentinel_accelerator_utilization_ratio",
    "sentinel_accelerator_memory_used_bytes",
    "sentinel_accelerator_memory_peak_bytes",
    "sentinel_accelerator_memory_total_bytes",
    "sentinel_accelerator_power_watts",
    "sentinel_accelerator_temperature_celsius",
    "sentinel_accelerator_xid_errors_total",
    "sentinel_accelerator_ecc_errors_total",
    "sentinel_accelerator_throttled",
    "sentinel_accelerator_health",
    "sentinel_agent_source_up",
    "sentinel_agent_reports_sent_total",
    "sentinel_agent_reports_rejected_total",
    "sentinel_agent_push_failures_total",
    "sentinel_agent_spool_dropped_total",
    "sentinel_agent_spool_reports",
    "sentinel_agent_last_seq",
    "sentinel_agent_server_connected",
}
SERVER_METRICS = {
    "sentinel_nodes",
    "sentinel_accelerators",
    "sentinel_ingest_reports_total",
    "sentinel_ingest_duplicates_total",
    "sentinel_ingest_rejected_total",
    "sentinel_plugin_errors_total",
    "sentinel_fleet_hardware_fault_rate",
    "sentinel_node_hardware_faults",
    "sentinel_job_mfu_ratio",
    "sentinel_job_allreduce_time_ratio",
    "sentinel_job_allreduce_exposed_time_ratio",
    "sentinel_job_tokens_per_second",
    "sentinel_job_memory_peak_bytes",
    "sentinel_job_memory_capacity_bytes",
    "sentinel_job_step_seconds",
    "sentinel_job_rank_step_seconds",
    "sentinel_job_rank_allreduce_time_ratio",
    "sentinel_job_task_failures_total",
    "sentinel_incidents_open",
    "sentinel_notifications_total",
    "sentinel_breaker_open",
    "sentinel_detection_latency_seconds_bucket",
    "sentinel_detection_latency_seconds_sum",
    "sentinel_detection_latency_seconds_count",
}
PROMETHEUS_METRICS = {"up", "ALERTS", "ALERTS_FOR_STATE"}
SEVERITIES = {"info", "warning", "critical"}

PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                   "offset", "bool", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])[a-zA-Z_:][a-zA-Z0-9_:]*")
_TEMPLATE_QUERY = re.compile(r'printf\s+"((?:[^"\\]|\\.)*)"[^}]*\|\s*query')


def metric_names(expr: str) -> set[str]:
    """Series names a PromQL expression selects: what is left once strings, label matchers, ranges,
    label lists, keywords and function calls are taken out."""
    text = _LABEL_LIST.sub(" ", _RANGE.sub(" ", _MATCHERS.sub(" ", _STRING.sub('""', expr))))
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group().lower() in PROMQL_KEYWORDS:
            continue
        names.add(match.group())
    return names


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in load_rules() if "alert" in rule]


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not on PATH; CI must install it (apt-get install prometheus)")
        pytest.skip("promtool is not on PATH (apt-get install prometheus)")
    return subprocess.run([promtool, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_metric_names_are_read_from_promql() -> None:
    expr = ('sum without (reason, instance) (increase(sentinel_job_task_failures_total{job=~"a|b"}[1h] offset 5m))'
            ' / on (job) group_left sentinel_job_mfu_ratio > 1e6 and ALERTS{alertname="X"}')
    assert metric_names(expr) == {"sentinel_job_task_failures_total", "sentinel_job_mfu_ratio", "ALERTS"}


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"


def test_promtool_unit_tests() -> None:
    result = run_promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"


def test_every_alert_is_labelled_and_annotated() -> None:
    headings = set(re.findall(r"^## (\w+)\s*$", RUNBOOK.read_text(), flags=re.MULTILINE))
    problems = []
    for rule in alerts():
        name, labels, annotations = rule["alert"], rule.get("labels", {}), rule.get("annotations", {})
        if labels.get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity {labels.get('severity')!r} is not one of {sorted(SEVERITIES)}")
        if labels.get("service") != "sentinel" or not labels.get("component"):
            problems.append(f"{name}: needs labels service=sentinel and component")
        for key in ("summary", "description", "runbook_url"):
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{name}: annotation {key} is missing")
        if annotations.get("runbook_url") != RUNBOOK_URL + name.lower():
            problems.append(f"{name}: runbook_url should be {RUNBOOK_URL + name.lower()}")
        if name not in headings:
            problems.append(f"{name}: docs/alerts.md has no '## {name}' section")
    assert not problems, "\n".join(problems)


def test_alert_names_are_unique() -> None:
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_rules_read_only_series_sentinel_exports() -> None:
    recorded = {rule["record"] for rule in load_rules() if "record" in rule}
    known = AGENT_METRICS | SERVER_METRICS | PROMETHEUS_METRICS | recorded
    unknown = []
    for rule in load_rules():
        name = rule.get("alert") or rule.get("record")
        queries = [rule["expr"]]
        queries += [q for text in rule.get("annotations", {}).values() for q in _TEMPLATE_QUERY.findall(str(text))]
        for query in queries:
            unknown += [f"{name}: {metric}" for metric in sorted(metric_names(str(query)) - known)]
    assert not unknown, "rules name series Sentinel does not export:\n" + "\n".join(unknown)


def test_every_alert_fires_in_a_unit_test() -> None:
    document = yaml.safe_load(RULE_TESTS.read_text())
    cases = [case for test in document["tests"] for case in test.get("alert_rule_test", [])]
    fired = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    names = {rule["alert"] for rule in alerts()}
    assert names - fired == set(), f"alerts no unit test shows firing: {sorted(names - fired)}"
    assert {case["alertname"] for case in cases} <= names, "unit tests name alerts the rules do not have"
    assert len(quiet) >= len(names) // 2, "most alerts should also have a case where they stay quiet"


def _xids(expr: str, op: str) -> set[int]:
    [codes] = set(re.findall(r'sentinel_accelerator_xid_errors_total\{xid' + re.escape(op) + r'"([0-9|]+)"\}', expr))
    return {int(c) for c in codes.split("|")}


def test_the_xid_alerts_follow_the_fault_catalog() -> None:
    """AcceleratorFatalXid fires on exactly the XIDs the built-in catalog calls critical; AcceleratorXidErrors on
    every other XID the catalog does not merely record (info): the alerts and the incidents agree."""
    from sentinel.detection.catalog import FaultCatalog

    catalog = FaultCatalog.load()
    critical = {x for x, e in catalog.xids.items() if e.severity == "critical"}
    info = {x for x, e in catalog.xids.items() if e.severity == "info"}
    rules = {r["alert"]: r["expr"] for r in load_rules() if "alert" in r}
    assert _xids(rules["AcceleratorFatalXid"], "=~") == critical
    assert _xids(rules["AcceleratorXidErrors"], "!~") == critical | info
