"""The training job benchmarks/diagnosis.py runs: a 2-rank DDP job over gloo on CPU, instrumented by the SDK —
step(), the DDP comm hook, data() around a DataLoader with one worker process, phase("host") around the
optimizer, and a synchronous checkpoint (the weights and CKPT_MB of other state, written and fsynced) every
CKPT_EVERY steps under pause("checkpoint").

Causes the benchmark injects that live in the job itself read files in CONTROL_DIR each step (cheap stats):
`loader_cost.<rank>` (extra numpy rounds per batch in the loader's worker: a slower input pipeline) and
`straggle.<rank>` (extra matrix products in the step: a straggler rank). Everything else the benchmark does
from outside (CPU burners, disk writers, a rate limit on the link, a slowed sim accelerator).
PIN_CPU pins the rank (and its loader worker) to one CPU, as one node's cores would be its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset

import sentinel.sdk
from sentinel.sdk.torch import instrument

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if os.environ.get("PIN_CPU"):
    os.sched_setaffinity(0, {int(os.environ["PIN_CPU"])})
control = Path(os.environ["CONTROL_DIR"])
ckpt_dir = Path(os.environ["CKPT_DIR"])
ckpt_every = int(os.environ.get("CKPT_EVERY", "5"))
ckpt_mb = int(os.environ.get("CKPT_MB", "48"))  # optimizer and data-loader state saved beside the weights
width, batch_size = int(os.environ.get("WIDTH", "512")), int(os.environ.get("BATCH", "96"))
torch.set_num_threads(1)


def knob(name: str) -> int:
    try:
        return int((control / f"{name}.{rank}").read_text() or 0)
    except (OSError, ValueError):
        return 0


class Batches(IterableDataset[torch.Tensor]):
    """Each batch costs the worker a little numpy work (decoding, augmentation), more when told."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        rng = np.random.default_rng(rank)
        scratch = rng.standard_normal((256, 256))
        while True:
            for _ in range(1 + knob("loader_cost")):
                scratch = np.tanh(scratch @ scratch.T / 256.0)
            yield torch.from_numpy(rng.standard_normal((batch_size, width)).astype(np.float32))


store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0,
                      timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(*[nn.Linear(width, width) for _ in range(6)]))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
tel = sentinel.sdk.init()
instrument(model, tel)
extra = torch.randn(width, width)
payload = torch.randn(ckpt_mb * 2**20 // 4)
loader = DataLoader(Batches(), batch_size=None, num_workers=1, prefetch_factor=2)
step = 0
for batch in tel.data(loader):
    with tel.step(tokens=batch_size):
        loss = model(batch).square().mean()
        loss.backward()
        for _ in range(knob("straggle")):
            extra = torch.tanh(extra @ extra / width)
        with tel.phase("host"):
            optimizer.step()
            optimizer.zero_grad()
    step += 1  # noqa: SIM113 - the loop is over batches; steps are counted apart
    if step % ckpt_every == 0:
        with tel.pause("checkpoint"):
            path = ckpt_dir / f"rank{rank}.pt"
            with open(path.with_suffix(".tmp"), "wb") as fh:
                torch.save(model.state_dict(), fh)
                fh.write(memoryview(payload.numpy()))  # raw bytes, as content-addressed chunks are written
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(path.with_suffix(".tmp"), path)
