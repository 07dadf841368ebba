"""PyTorch integration: time every DDP bucket's all-reduce through a comm hook.

On CPU (gloo) a bucket's time runs from the hook call to its future's completion. On CUDA the
hook records CUDA events around the collective on the current stream and reads their elapsed time
once the future completes. (No `from __future__ import annotations` here: DDP checks the hook's
annotations at runtime.) "Exposed" communication is what the step waited for after compute
finished: from the moment the last bucket became ready (backward is done) until the last
outstanding all-reduce completed. Importing this module imports torch; `sentinel.sdk` does not.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sentinel.sdk.telemetry import Telemetry


class _BucketClock:
    """Bookkeeping shared by the hook's callbacks (they run on the backend's thread).

    Buckets overlap each other, so communication time is the union of their in-flight intervals
    (from the first outstanding bucket's start to the moment none is outstanding), not their sum.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outstanding = 0
        self.busy_since = 0.0
        self.last_ready = 0.0


def instrument(ddp_model: Any, telemetry: Telemetry | None = None, process_group: Any = None) -> Telemetry:
    """Register a timing all-reduce hook on a DistributedDataParallel model; returns the recorder.

    The hook does what DDP's default does (sum, then divide by world size), so training is unchanged.
    """
    if telemetry is None:
        from sentinel.sdk import init

        telemetry = init()
    tel = telemetry
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    clock = _BucketClock()

    def hook(_state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        tensor = bucket.buffer()
        nbytes = tensor.numel() * tensor.element_size()
        started = time.perf_counter()
        with clock.lock:
            if clock.outstanding == 0:
                clock.busy_since = started
            clock.outstanding += 1
            clock.last_ready = started
        cuda_events = None
        if tensor.is_cuda:
            cuda_events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            cuda_events[0].record()
        work = dist.all_reduce(tensor, group=group, async_op=True)
        if cuda_events is not None:
            cuda_events[1].record()
        future = work.get_future()

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            finished = time.perf_counter()
            with clock.lock:
                clock.outstanding -= 1
                idle = clock.outstanding == 0
                union = finished - clock.busy_since if idle else 0.0
                exposed = finished - clock.last_ready if idle else 0.0
            if cuda_events is not None:  # device time of this bucket; the union is not defined on the host
                cuda_events[1].synchronize()
                union = cuda_events[0].elapsed_time(cuda_events[1]) / 1000.0
            tel.record_collective("all_reduce", union, nbytes, exposed_seconds=None)
            if exposed > 0:
                tel.add_exposed(exposed)
            return fut.value()[0].div_(world)

        return future.then(done)

    ddp_model.register_comm_hook(state=None, hook=hook)
    return tel


def peak_memory_bytes(device: Any = None) -> int:
    """torch's own peak for CUDA devices; for CPU training the SDK reports the process's peak RSS."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(device))
    from sentinel.sdk.telemetry import peak_memory_bytes as process_peak

    return process_peak()[0]


def agree_min(group: Any = None) -> Callable[[int], int]:
    """For CheckpointManager.restore(agree=…): every rank learns the smallest step any rank proposed,
    so all ranks load the same step (a rank that failed to load proposes -1)."""

    def agree(step: int) -> int:
        value = torch.tensor([step], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
        return int(value.item())

    return agree
