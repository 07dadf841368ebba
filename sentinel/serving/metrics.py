"""`sentinel_job_*` serving series (DESIGN §7): per job (labels `job`, `kind`), and per replica (`replica`,
`stage`). The job-wide series carry empty `replica` and `stage`, which Prometheus stores as absent labels, so
`{replica=""}` selects them and `sum by (job)` over the per-replica ones never counts a request twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sentinel.clock import Clock
from sentinel.serving.signals import BURN_WINDOWS, ServingView, burn_rates, summary

LABELS = ["job", "kind", "replica", "stage"]
LATENCIES = (("ttft", "Time to first token"), ("itl", "Inter-token latency"), ("tpot", "Time per output token"),
             ("e2e", "End-to-end request latency"), ("queue", "Time waiting in the queue before the engine starts"),
             ("kv_transfer", "KV-cache transfer time per transfer"))
GAUGES = (("kv_transfer_ratio", "KV-transfer time ÷ time to first token over the window"),
          ("slo_attainment_ratio", "Share of requests meeting both the TTFT and TPOT targets (DistServe)"),
          ("goodput_per_second", "Requests per second finished within the SLO"),
          ("requests_per_second", "Requests finished per second over the window"),
          ("mbu_ratio", "Model-bandwidth utilisation: weight bytes ÷ TPOT ÷ peak memory bandwidth (a lower bound)"))


class ServingCollector(Collector):
    def __init__(self, view: Callable[[], ServingView], clock: Clock):
        self._view, self._clock = view, clock  # the view is looked up per scrape: a new lead rebuilds it

    def collect(self) -> Iterator[Metric]:
        view, now = self._view(), self._clock.time()
        f = _families()
        for job_id in view.job_ids():
            job = str(job_id)
            slo = view.slo(job_id)
            rows: list[tuple[list[str], dict[str, Any]]] = [
                ([job, "serving", "", ""], summary(view.window(job_id, None, now), seconds=view.window_seconds,
                                                   slo=slo))]
            for r in view.replicas(job_id, now):
                lv = [job, "serving", r.replica, r.stage]
                rows.append((lv, summary(view.window(job_id, r.replica, now), seconds=view.window_seconds, slo=slo)))
                for name, value in (("running", r.running), ("waiting", r.waiting),
                                    ("kv_cache_usage_ratio", r.kv_cache_usage_ratio), ("batch_limit", r.batch_limit),
                                    ("oldest_request_seconds", r.oldest_inflight_seconds)):
                    if value is not None:
                        f[name].add_metric(lv, value)
                f["requests_total"].add_metric(lv, r.requests_total)
                for reason, n in sorted(r.failed_total.items()):
                    f["requests_failed_total"].add_metric([*lv, reason], n)
            for lv, signals in rows:
                _add_signals(f, lv, signals)
            requests, failed = view.totals(job_id)
            f["requests_total"].add_metric([job, "serving", "", ""], requests)
            for reason, n in sorted(failed.items()):
                f["requests_failed_total"].add_metric([job, "serving", "", "", reason], n)
            for window, rate in zip(BURN_WINDOWS, burn_rates(view, job_id, now), strict=True):
                if rate is not None:
                    f["slo_burn_rate"].add_metric([job, "serving", window], rate)
        yield from f.values()


def _add_signals(f: dict[str, Any], lv: list[str], signals: dict[str, Any]) -> None:
    for signal, _ in LATENCIES:
        for q, value in signals["latency_seconds"].get(signal, {}).items():
            if value is not None:
                f[signal].add_sample(f"sentinel_job_{signal}_seconds",
                                     {**dict(zip(LABELS, lv, strict=True)), "quantile": str(int(q[1:]) / 100)}, value)
    for name, _ in GAUGES:
        if signals.get(name) is not None:
            f[name].add_metric(lv, signals[name])
    for stage, share in signals["stage_ratio"].items():
        f["stage_time_ratio"].add_metric([lv[0], lv[1], lv[2], stage], share)


def _families() -> dict[str, Any]:
    f: dict[str, Any] = {}
    for signal, doc in LATENCIES:
        # a summary, as sentinel_job_step_seconds: quantiles over the window, read from the histograms
        f[signal] = Metric(f"sentinel_job_{signal}_seconds", f"{doc}, over the window", "summary")
    for name, doc in GAUGES:
        f[name] = GaugeMetricFamily(f"sentinel_job_{name}", doc, labels=LABELS)
    f["stage_time_ratio"] = GaugeMetricFamily("sentinel_job_stage_time_ratio",
                                              "A stage's share of end-to-end request time", labels=LABELS)
    for name, doc in (("running", "Requests the engine is running"), ("waiting", "Requests waiting in its queue"),
                      ("kv_cache_usage_ratio", "KV-cache blocks in use"),
                      ("batch_limit", "The engine's admission limit (the batching controller's setting)"),
                      ("oldest_request_seconds", "Age of the oldest request in flight")):
        f[name] = GaugeMetricFamily(f"sentinel_job_requests_{name}" if name in ("running", "waiting")
                                    else f"sentinel_job_{name}", doc, labels=LABELS)
    f["requests_total"] = CounterMetricFamily("sentinel_job_requests", "Requests finished, well or not",
                                              labels=LABELS)
    f["requests_failed_total"] = CounterMetricFamily("sentinel_job_requests_failed", "Requests failed, by reason",
                                                     labels=[*LABELS, "reason"])
    f["slo_burn_rate"] = GaugeMetricFamily("sentinel_job_slo_burn_rate",
                                           "Error-budget burn rate over the window (1 spends it exactly)",
                                           labels=["job", "kind", "window"])
    return f
