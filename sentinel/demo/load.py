"""A client load for a serving job: streamed completions at a steady rate (Poisson arrivals), each timed as its
user sees it (time to first token, end, whether the stream came to its `[DONE]` with text in it). For the
serving demo and benchmarks/serving.py; what it measures never comes from Sentinel."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    started: float  # time.time()
    ttft: float | None = None
    seconds: float = 0.0
    tokens: int = 0
    ok: bool = False
    status: int | None = None


@dataclass
class Load:
    host: str
    port: int
    rate: float = 6.0  # requests per second
    max_tokens: int = 48
    timeout: float = 60.0
    answers: list[Answer] = field(default_factory=list)
    seed: int = 7

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        threading.Thread(target=self._arrivals, name="load", daemon=True).start()

    def stop(self, wait: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + wait
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def _arrivals(self) -> None:
        rng = random.Random(self.seed)
        while not self._stop.wait(rng.expovariate(self.rate)):
            t = threading.Thread(target=self.one, daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def one(self) -> Answer:
        answer = Answer(started=time.time())
        begun = time.monotonic()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps({
                "prompt": "Tell the on-call engineer what happened.", "max_tokens": self.max_tokens,
                "stream": True}), headers={"content-type": "application/json"})
            response = conn.getresponse()
            answer.status = response.status
            done = False
            while response.status == 200:
                line = response.readline()
                if not line:
                    break
                data = line.strip()
                if data == b"data: [DONE]":
                    done = True
                    break
                if data.startswith(b"data:") and any(c.get("text") for c in json.loads(data[5:]).get("choices", [])):
                    answer.tokens += 1
                    if answer.ttft is None:
                        answer.ttft = time.monotonic() - begun
            answer.ok = done and answer.tokens > 0
        except (OSError, http.client.HTTPException, ValueError):
            answer.ok = False
        finally:
            conn.close()
            answer.seconds = time.monotonic() - begun
            with self._lock:
                self.answers.append(answer)
        return answer

    def between(self, start: float, end: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if start <= a.started < end]


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def summary(answers: list[Answer]) -> dict[str, Any]:
    ttfts = [a.ttft for a in answers if a.ttft is not None]
    return {"requests": len(answers), "ok": sum(a.ok for a in answers),
            "failed": sum(not a.ok for a in answers), "ttft_p99_seconds": p99(ttfts)}
