"""`sentinel demo --serving`: a serving job's whole story on the embedded default.

The server on SQLite, two agents with simulated accelerators, and a serving job of two replicas of the
project's own engine (sentinel/demo/engine.py: continuous batching over a timed decode loop, not a model; it
says so) run by `sentinel launch --serve`, behind the router, with an SLO (TTFT 0.5 s, TPOT 50 ms). A client
load streams completions through the router the whole time and times every answer as its user sees it.
Then replica r1 breaks (`--fault freeze` by default: frozen mid-stream; `empty`: HTTP 200 with no token;
`exit0`: the process exits 0 with requests in flight) and the demo narrates what Sentinel does, from the
server's API: the incident with its stage and evidence, the replica drained and replaced, and what became of
the requests in flight; then the latency timeline the client saw. Detector options are the defaults: a
replica frozen mid-stream is one after 3 s without a token (`mid_stream_seconds`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich.table import Table

from sentinel.demo.demo import WIDTH, Demo, _sentinel
from sentinel.demo.load import Load, summary

SERVING_FAULTS = {"freeze": "serving_stall", "empty": "bad_completion", "exit0": "task_exit"}
SLO = "0.5,0.05"
BUCKET_SECONDS = 5.0


@dataclass
class ServingDemo(Demo):
    detector_options: dict[str, dict[str, float]] = field(default_factory=dict)  # the defaults, as benchmarks

    def run(self) -> dict[str, Any]:
        env = self._env()
        launcher_token = self._start_server(env)
        self._start_agents(env)
        job_id, load = self._start_job(env, launcher_token)
        try:
            incident, injected = self._inject(job_id)
            self._follow_timeline(incident, chapter="7", until="serving again", timeout=120.0)
            time.sleep(8)  # the client's view of the minutes after the cut-over
        finally:
            load.stop()
        self.figures = self._figures(job_id, incident, injected, load)
        self._client_timeline(load, injected)
        (self.data_dir / "timeline.json").write_text(json.dumps(self.figures, indent=2))
        return self.figures

    def _env(self) -> dict[str, str]:
        import os

        env = {**os.environ, "SENTINEL_DATA_DIR": str(self.data_dir), "SENTINEL_LOG_LEVEL": "INFO",
               "PYTHONUNBUFFERED": "1", "SENTINEL_DETECTOR_OPTIONS": json.dumps(self.detector_options)}
        env.pop("SENTINEL_DATABASE_URL", None)
        return env

    @property
    def router_port(self) -> int:
        return self.port + 20

    def _start_job(self, env: dict[str, str], launcher_token: str) -> tuple[int, Load]:  # type: ignore[override]
        """3. The serving job: two replicas behind the router, with an SLO; 4. the client load."""
        say = self.console.print
        say(f"[bold]3. A serving job[/]: 2 replicas of the project's own engine (continuous batching over a timed "
            f"decode loop, NOT a model), run by `sentinel launch --serve 127.0.0.1:{self.router_port}`, SLO TTFT "
            f"0.5 s and TPOT 50 ms")
        fault_file = str(self.data_dir / "fault-{replica}")
        self.start("launch", _sentinel("launch", "--job", "demo-chat", "--kind", "serving", "--nproc", "2",
                                       "--serve", f"127.0.0.1:{self.router_port}", "--slo", SLO,
                                       "--preload", "sentinel.sdk", "--", sys.executable, "-m",
                                       "sentinel.demo.engine", "--fault-file", fault_file),
                   {**env, "SENTINEL_SERVER": self.url, "SENTINEL_TOKEN": launcher_token})
        job = self.wait("the job registering", lambda: [j for j in self.api("GET", "/jobs")
                                                        if j["name"] == "demo-chat"], 60)[0]
        job_id = int(job["id"])
        self.wait("both replicas answering", lambda: self._log("launch").count(" ready on port ") >= 2, 60)
        load = Load("127.0.0.1", self.router_port)
        load.start()
        say(f"[bold]4. Client load[/]: {load.rate:g} streamed completions/s of {load.max_tokens} tokens through the "
            "router, each timed as its user sees it")
        serving = self.wait("request signals reaching the server", lambda: self._serving(job_id), 60)
        self._signals_table(serving)
        return job_id, load

    def _serving(self, job_id: int) -> dict[str, Any] | None:
        out = self.api("GET", f"/jobs/{job_id}/serving")
        replicas = out.get("replicas") or []
        return out if len(replicas) >= 2 and all(r["signals"]["requests"] >= 10 for r in replicas) else None

    def _signals_table(self, out: dict[str, Any]) -> None:
        table = Table(title="per replica (GET /api/v1/jobs/{id}/serving, last 60 s)", width=WIDTH)
        for column in ("replica", "requests", "TTFT p99", "TPOT p99", "SLO attained", "running", "waiting"):
            table.add_column(column, justify="right")
        for r in out["replicas"]:
            s = r["signals"]
            lat = s.get("latency_seconds", {})
            table.add_row(r["replica"], str(s["requests"]), _ms(lat.get("ttft", {}).get("p99")),
                          _ms(lat.get("tpot", {}).get("p99")), _pct(s.get("slo_attainment_ratio")),
                          str(r.get("running") if r.get("running") is not None else "-"),
                          str(r.get("waiting") if r.get("waiting") is not None else "-"))
        self.console.print(table)

    def _inject(self, job_id: int) -> tuple[dict[str, Any], float]:
        """5-6. Replica r1 breaks; the incident it opens."""
        say = self.console.print
        kind = self.fault[0]
        say(f"[bold]5. Fault[/]: replica r1 — {kind} (" + {"freeze": "its decode freezes mid-stream: streams hang, "
            "health checks that read the first chunk still pass", "empty": "it answers HTTP 200 with no token",
            "exit0": "it exits 0 with requests in flight"}[kind] + ")")
        injected = time.time()
        (self.data_dir / "fault-r1").write_text(kind)
        detector = SERVING_FAULTS[kind]
        incident = self.wait("detection", lambda: [i for i in self.api("GET", "/incidents", state="all")["incidents"]
                                                   if i["detector"] == detector and i["job_id"] == job_id], 90)[0]
        detail = self.api("GET", f"/incidents/{incident['id']}")
        say(f"[bold]6. Detected[/] by {incident['detector']}, {time.time() - injected:.1f}s after the fault: incident "
            f"#{incident['id']} [red]{incident['severity']}[/] — {incident['title']}")
        for heading, body in (("Seen", detail["seen"]), ("Compared with", detail["comparison"]),
                              ("Points at", detail["layer"]), ("Check next", "; ".join(detail["next_steps"][:2]))):
            if body:
                say(f"   [dim]{heading}:[/] {body}")
        return incident, injected

    def _figures(self, job_id: int, incident: dict[str, Any], injected: float, load: Load) -> dict[str, Any]:
        order = next(o for o in self.api("GET", f"/jobs/{job_id}/orders", state="all")
                     if o["incident_id"] == incident["id"] and o["completed_at"])
        opened = datetime.fromisoformat(incident["opened_at"]).timestamp()
        served = datetime.fromisoformat(order["completed_at"]).timestamp()
        before, after = load.between(0, injected), load.between(injected, served)
        return {"job_id": job_id, "incident_id": incident["id"], "order_id": order["id"], "fault": self.fault[0],
                "detector": incident["detector"], "injected_at": injected,
                "detection_latency_seconds": incident["detection_latency_seconds"],
                "injected_to_open_seconds": opened - injected, "injected_to_serving_seconds": served - injected,
                "order_result": order["result"], "client_before_fault": summary(before),
                "client_fault_to_cutover": summary(after),
                "client_after_cutover": summary(load.between(served, time.time()))}

    def _client_timeline(self, load: Load, injected: float) -> None:
        f = self.figures
        table = Table(title="what the clients saw (every request timed by the demo's own load, not by Sentinel)",
                      width=WIDTH)
        for column in ("seconds from the fault", "requests", "ok", "failed", "TTFT p99"):
            table.add_column(column, justify="right")
        first = min((a.started for a in load.answers), default=injected)
        start = injected - BUCKET_SECONDS * max(1, int((injected - first) // BUCKET_SECONDS))
        end = max((a.started for a in load.answers), default=injected) + 1e-6
        while start < end:
            s = summary(load.between(start, start + BUCKET_SECONDS))
            if s["requests"]:
                table.add_row(f"{start - injected:+.0f} to {start + BUCKET_SECONDS - injected:+.0f}",
                              str(s["requests"]), str(s["ok"]), str(s["failed"]), _ms(s["ttft_p99_seconds"]))
            start += BUCKET_SECONDS
        self.console.print(table)
        summary_table = Table(title="timeline (figures from the server's API)", width=WIDTH)
        for column in ("what", "figure", "where it comes from"):
            summary_table.add_column(column)
        summary_table.add_row("fault → incident open", f"{f['injected_to_open_seconds']:.2f} s",
                              "the incident's opened_at − the fault")
        summary_table.add_row("fault → serving again", f"{f['injected_to_serving_seconds']:.2f} s",
                              "the replace_replica order's completed_at − the fault")
        cut = f["client_fault_to_cutover"]
        summary_table.add_row("requests failed, fault → cut-over", f"{cut['failed']} of {cut['requests']}",
                              "the client's own count")
        summary_table.add_row("the replacement", f["order_result"][:200], "the order's result (the launcher's)")
        self.console.print(summary_table)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f} %"
