"""A serving engine of the project's own, for the serving demo, benchmarks/serving.py and the tests: not a model.
`python -m sentinel.demo.engine --port P` (or SENTINEL_REPLICA_PORT).

It serves what the canary and a router need of an OpenAI-compatible engine, `GET /v1/models` and `POST
/v1/completions` (streamed as server-sent events, or whole), and `POST /sentinel/batch_limit {"limit": N}` (the
batching controller's limit, applied by the launcher), with continuous batching: a scheduler admits up to
`--max-batch` requests and runs decode steps of `--step-seconds` plus `--per-request-seconds` per request in
the batch, each giving every running request one token (the first step of a request also pays its prefill,
`--prefill-seconds-per-token`). So latency grows with load as a real engine's does, on two CPU cores. Every
request is timed by the SDK (`Telemetry.serving`), so the agent relays TTFT, ITL, queue time and the gauges.

Faults come from a file (`--fault-file`, re-read each step; `{replica}` in its path is the replica's name, so
one replica can be broken alone), one word: `empty` (200 and no token, the failed
decode of vllm-ascend #13165), `freeze` (the scheduler stops: streams hang mid-answer, Dynamo #13675),
`truncate` (a stream closes after its first token without `[DONE]`), `exit0` (the process exits 0 with requests
in flight, vLLM #48966), `crash` (exits 1), `engine_core` (an engine core fails and waits for an instruction on the
fault-tolerance API, `--enable-fault-tolerance`: fault_tolerance.py). Nothing else, and no fault file, is healthy.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sentinel.demo.fault_tolerance import APPLY_PATHS, STATUS_PATHS, FaultTolerance
from sentinel.serving.forward import QuietServer, send_json

MODEL = "sentinel-demo-engine"
FAULTS = ("empty", "freeze", "truncate", "exit0", "crash", "engine_core")
DONE = object()


class Sequence:
    def __init__(self, prompt_tokens: int, max_tokens: int, sdk: Any) -> None:
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.sdk = sdk  # the SDK's Request, or None without telemetry
        self.out: queue.SimpleQueue[object] = queue.SimpleQueue()  # token texts, then DONE
        self.produced = 0
        self.prefilled = False


class Engine:
    def __init__(self, *, max_batch: int = 32, step_seconds: float = 0.01, per_request_seconds: float = 0.002,
                 prefill_seconds_per_token: float = 0.0002, fault_file: str | None = None, requests: Any = None,
                 ft: FaultTolerance | None = None, takes_limit: bool = True):
        self.max_batch = max_batch
        # False: as vLLM, no `POST /sentinel/batch_limit` and no limit reported (a router holds it to one)
        self.takes_limit = takes_limit
        self.step_seconds, self.per_request_seconds = step_seconds, per_request_seconds
        self.prefill_seconds_per_token = prefill_seconds_per_token
        self.fault_file = fault_file
        self.requests = requests  # sentinel.sdk.serving.Requests, or None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.wake = threading.Condition()
        self.steps = 0
        self.ft = ft or FaultTolerance()
        threading.Thread(target=self._loop, name="engine-scheduler", daemon=True).start()

    def fault(self) -> str | None:
        if not self.fault_file:
            return None
        try:
            with open(self.fault_file) as fh:
                word = fh.read().strip()
        except OSError:
            return None
        return word if word in FAULTS else None

    def submit(self, prompt_tokens: int, max_tokens: int) -> Sequence:
        sdk = self.requests.start(prompt_tokens) if self.requests is not None else None
        seq = Sequence(prompt_tokens, max(1, max_tokens), sdk)
        with self.wake:
            self.waiting.append(seq)
            self.wake.notify()
        return seq

    def _loop(self) -> None:
        while True:
            with self.wake:
                while not self.waiting and not self.running:
                    self.wake.wait()
                while self.waiting and len(self.running) < self.max_batch:
                    seq = self.waiting.popleft()
                    if seq.sdk is not None:
                        seq.sdk.admitted()
                    self.running.append(seq)
                batch = list(self.running)
                self._gauges()
            fault = self.fault()
            if self.ft.takes(fault) and self.ft.enabled:
                self.ft.fail(self._abort)
                continue
            if fault in ("exit0", "crash") or self.ft.takes(fault):
                os._exit(0 if fault == "exit0" else 1)
            if fault == "freeze":
                time.sleep(0.05)
                continue
            prefill = sum(s.prompt_tokens for s in batch if not s.prefilled) * self.prefill_seconds_per_token
            time.sleep(self.step_seconds + self.per_request_seconds * len(batch) + prefill)
            self.steps += 1
            for seq in batch:
                seq.prefilled = True
                if fault == "empty":
                    seq.produced = seq.max_tokens
                else:
                    seq.produced += 1
                    if seq.sdk is not None:
                        seq.sdk.token()
                    seq.out.put(f" t{seq.produced}")
                    if fault == "truncate":
                        seq.produced = seq.max_tokens
                        seq.out.put(None)  # close without [DONE]
                        continue
                if seq.produced >= seq.max_tokens:
                    seq.out.put(DONE)
            with self.wake:
                self.running = [s for s in self.running if s.produced < s.max_tokens]

    def _abort(self) -> None:
        """Every request it holds ends, its stream cut (an engine core's failure aborts them)."""
        with self.wake:
            for seq in [*self.running, *self.waiting]:
                seq.out.put(None)
            self.running, self.waiting = [], deque()

    def _set_limit(self, change: Any) -> None:
        with self.wake:
            self.max_batch = change(self.max_batch)

    def _gauges(self) -> None:
        if self.requests is not None:
            self.requests.set_state(running=len(self.running), waiting=len(self.waiting),
                                    batch_limit=self.max_batch if self.takes_limit else None,
                                    kv_cache_usage_ratio=min(1.0, len(self.running) / self.max_batch))


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        send_json(self, status, body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path in STATUS_PATHS and self.engine.ft.enabled:
            self._json(200, self.engine.ft.status())
        elif self.path == "/health":
            self._json(200, {"status": "ok", "running": len(self.engine.running), "waiting": len(self.engine.waiting)})
        else:
            self._json(404, {"error": f"no {self.path}"})

    def do_POST(self) -> None:
        if self.path in APPLY_PATHS and self.engine.ft.enabled:
            try:
                body = json.loads(self.rfile.read(min(int(self.headers.get("content-length") or 0), 1 << 16)))
            except ValueError:
                body = None
            self._json(*self.engine.ft.apply(body, self.engine._set_limit))
            return
        if self.path == "/sentinel/batch_limit" and self.engine.takes_limit:  # an adjust order, via the launcher
            try:
                limit = int(json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))["limit"])
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, {"error": f"expected {{\"limit\": N}}: {exc}"})
                return
            if not 1 <= limit <= 4096:
                self._json(400, {"error": "limit must be 1..4096"})
                return
            with self.engine.wake:
                self.engine.max_batch = limit
            self._json(200, {"limit": limit})
            return
        if self.path != "/v1/completions":
            self._json(404, {"error": f"no {self.path}"})
            return
        try:
            body = json.loads(self.rfile.read(min(int(self.headers.get("content-length") or 0), 1 << 20)))
            prompt = body.get("prompt", "")
            prompt_tokens = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt)) // 4)
            max_tokens = int(body.get("max_tokens", 16))
        except (ValueError, TypeError, AttributeError) as exc:
            self._json(400, {"error": f"bad request: {exc}"})
            return
        seq = self.engine.submit(prompt_tokens, max_tokens)
        try:
            if body.get("stream"):
                self._stream(seq)
            else:
                self._whole(seq)
        except OSError:  # the client went away
            if seq.sdk is not None:
                seq.sdk.fail("cancelled")
        finally:
            if seq.sdk is not None:
                self.engine.requests.finish(seq.sdk)

    def _next(self, seq: Sequence) -> object:
        """The next token's text, DONE at the end, or None where the stream is cut (counted truncated)."""
        item = seq.out.get()
        if item is None and seq.sdk is not None:
            seq.sdk.fail("truncated")
        return item

    def _stream(self, seq: Sequence) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        sent = 0
        while isinstance(item := self._next(seq), str):
            self._chunk({"choices": [{"index": 0, "text": item, "finish_reason": None}]})
            sent += 1
        if item is DONE:
            self._chunk({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                         "usage": {"completion_tokens": sent, "prompt_tokens": seq.prompt_tokens}})
            self._write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def _chunk(self, event: dict[str, Any]) -> None:
        self._write(b"data: " + json.dumps({"object": "text_completion", "model": MODEL, **event}).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _whole(self, seq: Sequence) -> None:
        texts = []
        while isinstance(item := self._next(seq), str):
            texts.append(item)
        self._json(200, {"object": "text_completion", "model": MODEL, "choices": [
            {"index": 0, "text": "".join(texts), "finish_reason": "length" if item is DONE else None}]})


def serve(engine: Engine, host: str, port: int) -> ThreadingHTTPServer:
    """The engine's HTTP server, started on a daemon thread; `server_address` says the port."""
    handler = type("EngineHandler", (Handler,), {"engine": engine})
    httpd = QuietServer((host, port), handler)
    threading.Thread(target=httpd.serve_forever, name="engine-http", daemon=True).start()
    return httpd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sentinel.demo.engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(os.environ.get("SENTINEL_REPLICA_PORT", "8100")))
    p.add_argument("--max-batch", type=int, default=int(os.environ.get("ENGINE_MAX_BATCH", "32")))
    p.add_argument("--step-seconds", type=float, default=0.01)
    p.add_argument("--per-request-seconds", type=float, default=0.002)
    p.add_argument("--prefill-seconds-per-token", type=float, default=0.0002)
    p.add_argument("--fault-file", default=os.environ.get("ENGINE_FAULT_FILE"))
    p.add_argument("--no-batch-limit-api", action="store_true",
                   help="take no batch limit from outside and report none, as vLLM (the router holds it to one)")
    p.add_argument("--replica", default=os.environ.get("SENTINEL_REPLICA"))
    p.add_argument("--stage", default=os.environ.get("SENTINEL_STAGE", "mixed"))
    p.add_argument("--no-telemetry", action="store_true", help="no SDK (no Sentinel agent to report to)")
    p.add_argument("--enable-fault-tolerance", action="store_true",
                   default=os.environ.get("ENGINE_FAULT_TOLERANCE") == "1",
                   help="serve the fault-tolerance API (the project's stand-in: fault_tolerance.py)")
    args = p.parse_args(argv)
    replica = args.replica or f"r{os.environ.get('RANK', '0')}"
    requests = None
    if not args.no_telemetry:
        import sentinel.sdk

        requests = sentinel.sdk.init().serving(replica=replica, stage=args.stage)
    fault_file = args.fault_file.replace("{replica}", replica) if args.fault_file else None
    engine = Engine(max_batch=args.max_batch, step_seconds=args.step_seconds,
                    per_request_seconds=args.per_request_seconds,
                    prefill_seconds_per_token=args.prefill_seconds_per_token, fault_file=fault_file,
                    requests=requests, ft=FaultTolerance(enabled=args.enable_fault_tolerance,
                                                          rank=int(os.environ.get("RANK", "0"))),
                    takes_limit=not args.no_batch_limit_api)
    httpd = serve(engine, args.host, args.port)
    print(f"engine serving on http://{args.host}:{httpd.server_address[1]} (max batch {args.max_batch})", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
