"""Checkpoints from a GPU: what a save costs a training loop on a CUDA device, Sentinel's save() against
torch.distributed.checkpoint's async_save, measured in the same run (issue 20, part 5's device-to-host path).

One process, one CUDA device. The loop: forward, backward and Adam on a stack of Linear layers holding `--gib` of
model + Adam state on the device, `--steps` steps per run, a save every `--every` steps, `--rounds` rounds with
the order rotated each round. Contenders:
  no checkpoint;
  save() (guarded, the default): the guarded tensors' device-to-host copies run on the manager's own stream
      while the next forward and backward are queued (saving.CopyStreams); the next optimizer step waits for them;
      the hashing and writing run on the host behind that (local tier, LocalDirStore, no fsync);
  dcp.async_save: staged to host memory before it returns, written in the background; as its docs advise, a
      save first waits for the previous one's future;
each timed until its last save is written. Printed per contender: seconds added per save (the run's time minus
the same round's run without checkpoints, over the saves), save()'s own stall, and the ratio of Sentinel's
added seconds to dcp.async_save's (lower is better). Without a CUDA device it says so and exits 2: nothing is
measured on a CPU here (benchmarks/checkpoint.py measures the CPU path; `--device cpu` only tries this script
out, small: `--gib 0.05 --width 512 --batch 64 --rounds 1`).

    PYTHONPATH=. python3 benchmarks/checkpoint_gpu.py [--gib 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from sentinel.sdk.checkpoint import CheckpointManager

GIB = 1 << 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0, help="model + Adam state on the device")
    parser.add_argument("--width", type=int, default=4096, help="the Linear layers' width")
    parser.add_argument("--batch", type=int, default=4096, help="rows per step")
    parser.add_argument("--steps", type=int, default=30, help="steps per run")
    parser.add_argument("--every", type=int, default=5, help="a save every this many steps")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (medians of this many)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a try-out of the script)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing measured (benchmarks/checkpoint.py measures the CPU path)")
        return 2
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    warnings.filterwarnings("ignore", message=".*process group.*")
    work = Path(tempfile.mkdtemp(prefix="sentinel-checkpoint-gpu-", dir=args.dir))
    try:
        return run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> int:
    d = args.width
    torch.manual_seed(0)
    layers = max(1, round(args.gib * GIB / (3 * 4 * (d * d + d))))
    model = nn.Sequential(*[nn.Linear(d, d) for _ in range(layers)]).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, d, device=args.device)
    synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    step()
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *(
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())])
    manager = CheckpointManager(job_id=1, rank=0, node="gpu", local_dir=str(work / "sentinel" / "{node}"),
                                persistent_dir=None, catalog=False, keep_last=3)
    stalls: list[float] = []  # save()'s own stall
    stalls_dcp: list[float] = []  # dcp.async_save's
    pending: list[Any] = []  # dcp.async_save's future still writing

    def sentinel(i: int) -> None:
        started = time.perf_counter()
        manager.save(i, state())
        stalls.append(time.perf_counter() - started)

    def dcp_async(i: int) -> None:
        if pending:
            pending.pop().result()  # the previous save first, as DCP's docs advise
        target = work / "dcp" / str(i % 3)
        if target.exists():
            shutil.rmtree(target)
        started = time.perf_counter()
        pending.append(dcp.async_save(state(), checkpoint_id=str(target)))
        stalls_dcp.append(time.perf_counter() - started)

    def loop(save: Callable[[int], None] | None, first: int) -> float:
        synchronize()
        started = time.perf_counter()
        for i in range(first, first + args.steps):
            step()
            if save is not None and i % args.every == 0:
                save(i)
        synchronize()
        if save is sentinel:
            manager.wait()
        elif pending:
            pending.pop().result()
        return time.perf_counter() - started

    counter = [args.every]

    def timed(save: Callable[[int], None] | None) -> Callable[[], float]:
        def once() -> float:
            seconds = loop(save, counter[0])
            counter[0] += args.steps
            return seconds
        return once

    contenders = {"no checkpoint": timed(None), "save() (guarded)": timed(sentinel), "dcp.async_save": timed(dcp_async)}
    for once in contenders.values():  # untimed: pinned buffers, files and the page cache exist from here on
        once()
    stalls.clear()
    stalls_dcp.clear()
    names, times = list(contenders), {name: list[float]() for name in contenders}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            os.sync()
            times[name].append(contenders[name]())
    manager.close()
    saves = args.steps // args.every
    added = {name: [(t - none) / saves for t, none in zip(values, times["no checkpoint"], strict=True)]
             for name, values in times.items() if name != "no checkpoint"}
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (a try-out: no figure)"
    print(f"{device}, torch {torch.__version__}; {size / GIB:.2f} GiB of model + Adam state "
          f"({layers} Linear {d}x{d}), batch {args.batch}; a step without checkpoints "
          f"{statistics.median(times['no checkpoint']) / args.steps * 1e3:.1f} ms; a save every {args.every} of "
          f"{args.steps} steps, {args.rounds} rotated rounds")
    for name, values in added.items():
        print(f"  {name:18} adds {statistics.median(values):.3f} s per save (rounds "
              f"{', '.join(f'{v:.3f}' for v in values)})")
    print(f"  stall of the call: save() {statistics.median(stalls):.3f} s, dcp.async_save "
          f"{statistics.median(stalls_dcp):.3f} s")
    ours, theirs = statistics.median(added["save() (guarded)"]), statistics.median(added["dcp.async_save"])
    print(f"save() / dcp.async_save, seconds added per save: {ours / theirs:.3f}x" if theirs > 0 else
          "dcp.async_save added no measurable time: no ratio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
