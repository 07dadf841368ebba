"""A real 2-rank DDP job (gloo, CPU) instrumented by the SDK, for tests/sdk/test_torch_job.py.

It also measures the same collectives independently with torch's profiler and writes that, with
its own step times, to OUT_DIR/rank<r>.json; then it idles until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile

import sentinel.sdk
from sentinel.sdk.flops import model_flops_per_token
from sentinel.sdk.torch import instrument

rank, world, steps = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["STEPS"])
torch.set_num_threads(1)
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, is_master=rank == 0)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)]))
params = sum(p.numel() for p in model.parameters())
tel = sentinel.sdk.init()
instrument(model, tel)
tel.set_model(flops_per_token=model_flops_per_token(params=params))  # one "token" = one sample here
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = 32

step_seconds = 0.0
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
        started = time.perf_counter()
        with tel.step(tokens=batch):
            loss = model(torch.randn(batch, 256)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        step_seconds += time.perf_counter() - started
    rss_after_steps = psutil.Process().memory_info().rss  # a floor for the peak the SDK reported
# The union of the profiler's gloo all-reduce intervals: buckets overlap, so their sum would double count.
intervals = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.name == "gloo:all_reduce")
gloo, reach = 0.0, float("-inf")
for start, end in intervals:
    if end > reach:
        gloo += (end - max(start, reach)) / 1e6
        reach = end
tel.flush()
out = os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json")
with open(out + ".tmp", "w") as fh:
    json.dump({"gloo_allreduce_seconds": gloo, "step_seconds": step_seconds, "steps": steps,
               "rss_after_steps": rss_after_steps}, fh)
os.replace(out + ".tmp", out)
print(f"rank {rank} done: {steps} steps", file=sys.stderr, flush=True)
time.sleep(120)
