"""Step and collective timing inside a training or serving process.

Never slows or breaks training: a record is a tuple appended to a list (a few µs); a background
thread batches them to the local agent every second; when the agent is away the batch is dropped
and counted, never raised. Standard library only, so `import sentinel.sdk` stays cheap.
"""

from __future__ import annotations

import atexit
import http.client
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

from sentinel.sdk.agent_link import AgentRefused, _AgentConnection
from sentinel.sdk.serving import Requests

T = TypeVar("T")
log = logging.getLogger("sentinel.sdk")

DEFAULT_AGENT_URL = "http://127.0.0.1:9481"
MAX_BUFFERED_STEPS = 10_000
FLUSH_INTERVAL_SECONDS = 1.0  # how often a batch goes to the agent; the hang detector allows for it
QUIET_ERRORS = (StopIteration, StopAsyncIteration)  # the end of the data, raised through a step on purpose


def env_int(*names: str) -> int | None:
    """The first of these variables that is set."""
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return None


class Telemetry:
    """Per-process recorder. Under `sentinel launch` every argument comes from the environment."""

    def __init__(self, *, job_id: int | None = None, rank: int | None = None, attempt: int | None = None,
                 agent_url: str | None = None, flush_interval_seconds: float = FLUSH_INTERVAL_SECONDS,
                 start_thread: bool = True):
        self.job_id = job_id if job_id is not None else env_int("SENTINEL_JOB_ID")
        self.rank = rank if rank is not None else (env_int("SENTINEL_RANK") or env_int("RANK") or 0)
        # under torchrun too, as the checkpoint manager: a restart is a new attempt, whose lost steps count
        self.attempt = attempt if attempt is not None else (
            env_int("SENTINEL_ATTEMPT", "TORCHELASTIC_RESTART_COUNT") or 0)
        self.agent_url = agent_url or os.environ.get("SENTINEL_AGENT_URL") or DEFAULT_AGENT_URL
        self.pid = os.getpid()
        self._interval = flush_interval_seconds
        self._lock = threading.Lock()
        self._steps: list[tuple[int, float, float, int | None, float, float | None]] = []
        self._collectives: dict[str, list[float]] = {}
        self._model: dict[str, Any] | None = None
        self._failure: dict[str, str] | None = None
        self._step_error: dict[str, str] | None = None  # the last step or collective raised, none good since
        self._pauses: list[dict[str, Any]] = []  # open pause() blocks, outermost first
        self._pause_ended = False  # the next batch must say so, even with nothing else in it
        self._step_index = 0
        self._in_step = False
        self._step_collective = 0.0
        self._step_exposed: float | None = None
        self._phases: dict[str, list[float]] = {}  # name → [seconds, of which inside steps]
        self._experts: dict[str, float] | None = None
        self._serving: Requests | None = None
        self.sent_batches = 0
        self.dropped_batches = 0
        self.refused_batches = 0  # answered 403: not sent by the process it names, or not the task placed here
        self.dropped_steps = 0
        self._stop = threading.Event()
        self._sender = _AgentConnection(self.agent_url)
        self._thread: threading.Thread | None = None
        if start_thread and self.job_id is not None:
            self._thread = threading.Thread(target=self._run, name="sentinel-sdk", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    # -- recording (the hot path) ----------------------------------------------------------------

    @contextmanager
    def step(self, tokens: int | None = None) -> Iterator[None]:
        """Time one training step (or one serving batch); `tokens` processed by this rank in it.

        A step that raises (a peer died mid all-reduce) is not counted: the work it did is lost, and
        counting it would tell the server the rank got one step further than it did."""
        self._in_step, self._step_collective, self._step_exposed = True, 0.0, None
        started_wall = time.time()
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self._note_error(exc)
            raise
        finally:
            self._in_step = False
        self.record_step(time.perf_counter() - started, tokens=tokens, collective_seconds=self._step_collective,
                         exposed_seconds=self._step_exposed, started_at=started_wall)

    @contextmanager
    def collective(self, op: str = "all_reduce", nbytes: int = 0) -> Iterator[None]:
        """Time a blocking collective; inside `step()` it counts toward that step's communication."""
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self._note_error(exc)
            raise
        finally:
            seconds = time.perf_counter() - started
            self.record_collective(op, seconds, nbytes, exposed_seconds=seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a named part of the loop: `host` (optimizer, Python), `checkpoint`, or a name of the job's own.
        Inside `step()` it is taken out of the step's compute; between steps, out of its idle time."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record_phase(name, time.perf_counter() - started)

    def data(self, batches: Iterable[T]) -> Iterator[T]:
        """Wrap a DataLoader (or any iterable): the time the loop waits for each batch is `data_wait`."""
        iterator = iter(batches)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.record_phase("data_wait", time.perf_counter() - started)
            yield batch

    def record_phase(self, name: str, seconds: float) -> None:
        """`name` as the wire takes it (lowercase letters, digits, `_`; 32 at most): "Eval-1" counts as "eval_1"."""
        name = _phase_name(name)
        with self._lock:
            entry = self._phases.get(name)
            if entry is None:
                if len(self._phases) >= 16:
                    return
                entry = self._phases[name] = [0.0, 0.0]
            entry[0] += seconds
            if self._in_step:
                entry[1] += seconds

    def record_experts(self, tokens_per_expert: Iterable[float], dropped_tokens: int = 0) -> None:
        """Mixture-of-experts routing of one step: tokens per expert (max ÷ mean is the imbalance) and drops."""
        counts = [float(c) for c in tokens_per_expert]
        total = sum(counts)
        if not counts or total <= 0:
            return
        imbalance = max(counts) / (total / len(counts))
        with self._lock:
            e = self._experts or {"imbalance": 1.0, "routed_tokens": 0, "dropped_tokens": 0}
            e["imbalance"] = max(e["imbalance"], imbalance)
            e["routed_tokens"] += int(total)
            e["dropped_tokens"] += max(0, int(dropped_tokens))
            self._experts = e

    @contextmanager
    def pause(self, reason: str = "checkpoint") -> Iterator[None]:
        """Mark time the loop spends between steps on purpose (a checkpoint save, an evaluation): while it
        lasts the server does not judge the rank, or the peers waiting for it, hung by its step cadence
        (`CheckpointManager` marks its own saves)."""
        with self._lock:
            self._pauses.append({"reason": reason[:32] or "pause", "since": time.time()})
        started = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._pauses.pop()
                self._pause_ended = not self._pauses
            self.record_phase(reason, time.perf_counter() - started)  # a pause is a phase too: its time is not idle

    def _note_error(self, exc: Exception) -> None:
        """A step or collective raised (a peer died mid all-reduce): if the process ends without a good step
        after it, that is the error it ended on, even when it exits 0 (`close` sends it as the failure)."""
        if not isinstance(exc, QUIET_ERRORS):
            with self._lock:
                self._step_error = {"type": type(exc).__name__,
                                    "message": f"step {self._step_index + 1} raised: {exc}"[:1000]}

    def record_collective(self, op: str, seconds: float, nbytes: int = 0, exposed_seconds: float | None = None) -> None:
        """Record a collective measured elsewhere (e.g. a DDP comm hook); `exposed_seconds` is the part
        not hidden behind compute, where known."""
        with self._lock:
            entry = self._collectives.get(op)
            if entry is None:
                entry = self._collectives[op] = [0, 0.0, 0]
            entry[0] += 1
            entry[1] += seconds
            entry[2] += nbytes
            if op.replace("_", "").startswith("alltoall"):  # MoE dispatch/combine, apart from all-reduce
                phase = self._phases.setdefault("all_to_all", [0.0, 0.0])
                phase[0] += seconds
                phase[1] += seconds if self._in_step else 0.0
            if self._in_step:
                self._step_collective += seconds
                if exposed_seconds is not None:
                    self._step_exposed = (self._step_exposed or 0.0) + exposed_seconds

    def record_step(self, duration_seconds: float, *, tokens: int | None = None, collective_seconds: float = 0.0,
                    exposed_seconds: float | None = None, started_at: float | None = None) -> None:
        with self._lock:
            self._step_index += 1
            self._step_error = None
            if len(self._steps) >= MAX_BUFFERED_STEPS:
                self._steps.pop(0)
                self.dropped_steps += 1
            self._steps.append((self._step_index, started_at or time.time() - duration_seconds, duration_seconds,
                                tokens, collective_seconds, exposed_seconds))

    def add_exposed(self, seconds: float) -> None:
        """Communication time the step waited for beyond compute (set by the torch integration)."""
        with self._lock:
            if self._in_step:
                self._step_exposed = (self._step_exposed or 0.0) + seconds

    def set_model(self, *, flops_per_token: float, peak_flops_per_accelerator: float | None = None,
                  accelerators_per_rank: int = 1, dtype: str = "bf16", accelerator_model: str | None = None) -> None:
        """What MFU needs: FLOPs per token (see `sentinel.sdk.flops`) and the peak, when known here."""
        with self._lock:
            self._model = {"flops_per_token": float(flops_per_token), "dtype": dtype,
                           "peak_flops_per_accelerator": peak_flops_per_accelerator,
                           "accelerators_per_rank": accelerators_per_rank, "accelerator_model": accelerator_model}

    def serving(self, replica: str | None = None, stage: str = "mixed") -> Requests:
        """This process's request recorder (a serving replica): its sums go out with each batch.
        `stage` is the replica's role where encode, prefill and decode run on separate replica groups."""
        with self._lock:
            if self._serving is None:
                self._serving = Requests(replica, stage)
            return self._serving

    def record_failure(self, exc_type: type[BaseException], exc: BaseException) -> None:
        with self._lock:  # the uncaught exception is what it died of; a failed step before it is part of it
            self._failure = {"type": exc_type.__name__, "message": str(exc)[:1000]}
            self._step_error = None

    def resume_at(self, step: int) -> None:
        """Continue numbering steps after `step` (a restored checkpoint), so lost work is counted from it."""
        with self._lock:
            self._step_index = step

    @property
    def step_index(self) -> int:
        return self._step_index

    # -- sending ---------------------------------------------------------------------------------

    def take_batch(self) -> dict[str, Any] | None:
        with self._lock:
            if not (self._steps or self._collectives or self._failure or self._model or self._pauses
                    or self._pause_ended or self._phases
                    or (self._serving is not None and self._serving.pending())):
                return None
            batch = {"job_id": self.job_id, "rank": self.rank, "attempt": self.attempt, "pid": self.pid,
                     "steps": self._steps, "collectives": self._collectives, "model": self._model,
                     "failure": self._failure, "memory_peak_bytes": peak_memory_bytes()[0],
                     "memory_source": peak_memory_bytes()[1], "dropped_batches": self.dropped_batches}
            if self._pauses:
                batch["pause"] = dict(self._pauses[0])
            if self._phases:
                batch["phases"] = {name: tuple(v) for name, v in self._phases.items()}
            if self._experts is not None:
                batch["experts"] = self._experts
            if self._serving is not None:
                batch["serving"] = self._serving.take()
            self._steps, self._collectives, self._failure, self._pause_ended = [], {}, None, False
            self._phases, self._experts = {}, None
            return batch

    def flush(self, timeout_seconds: float = 2.0) -> bool:
        batch = self.take_batch()
        if batch is None:
            return True
        try:
            self._sender.post_json("/v1/telemetry", batch, timeout_seconds)
        except AgentRefused as exc:  # the agent would not take it as this task's telemetry: say so once
            self.dropped_batches += 1
            self.refused_batches += 1
            if self.refused_batches == 1:
                log.warning("sentinel agent at %s refuses this process's telemetry, which is dropped: %s",
                            self.agent_url, exc)
            return False
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.dropped_batches += 1
            if self.dropped_batches in (1, 10, 100) or self.dropped_batches % 1000 == 0:
                log.warning("sentinel agent unreachable at %s, telemetry dropped (%d batches): %s", self.agent_url,
                            self.dropped_batches, exc)
            return False
        self.sent_batches += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2)
        with self._lock:  # ending right after a failed step, never stepping again: that is what it ended on
            if self._step_error is not None and self._failure is None:
                self._failure, self._step_error = self._step_error, None
        self.flush()

    def install_excepthook(self) -> None:
        """Send an uncaught exception's type and message before the process dies."""
        previous = sys.excepthook

        def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            try:
                self.record_failure(exc_type, exc)
                self.flush(timeout_seconds=1.0)
            finally:
                previous(exc_type, exc, tb)

        sys.excepthook = hook


def _phase_name(name: str) -> str:
    clean = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in name.lower())[:32]
    return clean if clean[:1].isalpha() else ("p" + clean)[:32] if clean else "pause"


def peak_memory_bytes() -> tuple[int, str]:
    """Peak device memory from torch where CUDA is in use, else the process's peak RSS."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                return int(torch.cuda.max_memory_allocated()), "cuda"
        except Exception:  # a broken CUDA context must not break telemetry
            pass
    return _peak_rss(), "rss"


def _peak_rss() -> int:
    """This process's own peak RSS: VmHWM, the high-water mark of its current address space.

    Not getrusage's ru_maxrss: Linux carries that across fork and exec, so a rank started by a large
    launcher (a 800 MB pytest, a torchrun agent) would report its parent's size as its own peak.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
