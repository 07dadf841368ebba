"""The demo's training job: DDP over gloo on CPU, instrumented by the SDK. `python -m sentinel.demo.job`.

Used by `sentinel demo`, the remediation and checkpoint tests and benchmarks/recovery.py. Runs under
`sentinel launch` and under `torchrun` alike: the store is prefixed per attempt
(TORCHELASTIC_RESTART_COUNT), so a restarted attempt never meets the old one's keys (ENVIRONMENT.md).
Every step appends "rank attempt step wall_time" to OUT_DIR/steps.log, so a benchmark can time the
first step after a restart without trusting Sentinel's own numbers. STEPS=0 steps until killed.

Each step's batch is drawn from a generator seeded by (step, rank), so a run resumed from a checkpoint
sees the same data as one that never stopped. CKPT_EVERY=N checkpoints every N steps (local tier;
persistent tier every CKPT_PERSISTENT_EVERY) and resumes from the server's recovery plan;
CKPT_WRITE_BPS throttles the background write; FINAL_OUT=1 writes the final weights to
OUT_DIR/final-rank<r>.pt. OUT_DIR/checkpoints.log gets "rank attempt event step" lines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import sentinel.sdk
from sentinel.sdk.checkpoint import CheckpointManager
from sentinel.sdk.flops import model_flops_per_token
from sentinel.sdk.torch import agree_min, instrument

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
steps = int(os.environ.get("STEPS", "0"))
step_sleep = float(os.environ.get("STEP_SLEEP", "0.02"))
ckpt_every = int(os.environ.get("CKPT_EVERY", "0"))
out_dir = os.environ["OUT_DIR"]
torch.set_num_threads(1)
base = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]), world,
                     is_master=rank == 0, timeout=timedelta(seconds=60))
store = dist.PrefixStore(f"attempt{attempt}", base)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                        timeout=timedelta(seconds=float(os.environ.get("COLLECTIVE_TIMEOUT", "60"))))
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)]))
tel = sentinel.sdk.init()
instrument(model, tel)
tel.set_model(flops_per_token=model_flops_per_token(params=sum(p.numel() for p in model.parameters())))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
events = open(os.path.join(out_dir, "checkpoints.log"), "a", buffering=1)  # noqa: SIM115
step = 0
ckpt = None
if ckpt_every:
    bps = float(os.environ.get("CKPT_WRITE_BPS", "0")) or None
    ckpt = CheckpointManager(every=ckpt_every, persistent_every=int(os.environ.get("CKPT_PERSISTENT_EVERY", "0"))
                             or 10 * ckpt_every, write_bytes_per_second=bps)
    restored = ckpt.restore(agree=agree_min())
    if restored is not None:
        model.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optim"])
        step = restored.step
        events.write(f"{rank} {attempt} restored {step} {restored.location['tier']}\n")
log = open(os.path.join(out_dir, "steps.log"), "a", buffering=1)  # noqa: SIM115


def when_written(step: int) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        if future.exception() is None:
            events.write(f"{rank} {attempt} written {step}\n")

    return done


while steps == 0 or step < steps:
    batch = torch.Generator().manual_seed(step * 1000 + rank)
    with tel.step(tokens=16):
        loss = model(torch.randn(16, 128, generator=batch)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    step += 1
    log.write(f"{rank} {attempt} {step} {time.time():.6f}\n")
    if ckpt is not None:
        future = ckpt.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})
        if future is not None:
            events.write(f"{rank} {attempt} saving {step} {os.getpid()}\n")
            future.add_done_callback(when_written(step))
    time.sleep(step_sleep)
if ckpt is not None:
    ckpt.close()
if os.environ.get("FINAL_OUT"):
    torch.save(model.state_dict(), os.path.join(out_dir, f"final-rank{rank}.pt"))
tel.flush()
dist.destroy_process_group()
