"""The demo's training job: DDP over gloo on CPU, instrumented by the SDK. `python -m sentinel.demo_job`.

Used by `sentinel demo`, the remediation tests and benchmarks/recovery.py. Runs under `sentinel launch`
and under `torchrun` alike: the store is prefixed per attempt
(TORCHELASTIC_RESTART_COUNT), so a restarted attempt never meets the old one's keys (ENVIRONMENT.md).
Every step appends "rank attempt step wall_time" to OUT_DIR/steps.log, so a benchmark can time the
first step after a restart without trusting Sentinel's own numbers. STEPS=0 steps until killed.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import sentinel.sdk
from sentinel.sdk.flops import model_flops_per_token
from sentinel.sdk.torch import instrument

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
steps = int(os.environ.get("STEPS", "0"))
step_sleep = float(os.environ.get("STEP_SLEEP", "0.02"))
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
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
log = open(os.path.join(os.environ["OUT_DIR"], "steps.log"), "a", buffering=1)  # noqa: SIM115
step = 0
while steps == 0 or step < steps:
    with tel.step(tokens=16):
        loss = model(torch.randn(16, 128)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    step += 1
    log.write(f"{rank} {attempt} {step} {time.time():.6f}\n")
    time.sleep(step_sleep)
tel.flush()
dist.destroy_process_group()
