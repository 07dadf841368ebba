"""Checkpoint benchmark: the SDK's CheckpointManager against torch.save, torch.distributed.checkpoint and dd.

    PYTHONPATH=. python benchmarks/checkpoint.py [--gib 1] [--scenario-gib 0.25] [--repeats 3] [--dir DIR]
        [--no-record | --record PATH]

One process, CPU torch tensors, every baseline measured in the same run: each contender runs once per round,
the order rotated every round; medians are reported (the machine is noisy). The state is a model plus
Adam-like optimizer state (2048×2048 float32 layers; nested dicts, integer keys), about `--gib` GiB.
Sentinel writes to its local tier (LocalDirStore: no fsync), `catalog=False`.

1. Stall, the time until `save()` returns. Steady state: warm buffers, and the loop waits for each
   background write before the next save (a training step longer than the write); the floor, `copy_` of
   every tensor into warm buffers, is timed between those saves. Also: first saves (a fresh manager;
   malloc_trim between rounds gives freed memory back, so its buffers are page-faulted in again) and a
   save issued while the previous full write is in flight (it waits for it). Baselines: `torch.save(state,
   file)`; `dcp.save(state)` without a process group, FileSystemWriter's default (fsync) and
   sync_files=False; the stall of `dcp.async_save` (fresh staging every call: cached staging pins memory,
   which needs an accelerator). Target: steady stall ≤ 0.1× torch.save and dcp.save.
2. Throughput of a full first save into a fresh store, bytes_total / (stall + write_seconds), against dcp.save
   (target ≥ 1.0×), torch.save and `dd if=/dev/zero bs=1M`, with and without conv=fdatasync.
3. Bytes written by a second save ÷ the state's bytes, each on a fresh store of `--scenario-gib`: (a) dense
   update (≈ 1.0× expected); (b) 10 Linear layers, 9 frozen, model state dict only (target ≤ 0.15×); (c) an
   `embedding.weight` table (dim 128, float32, nearly all of the state), 1% of its rows changed at random and
   a small dense head changed everywhere (target ≤ 0.05×); the same with 1% contiguous rows.
5. The stall a real training loop sees (forward, backward, Adam on a Linear stack of `--loop-gib` GiB of
   model + Adam state, a save every 3 steps): loop time with saves minus without, per save, for torch.save,
   save() and save() after guard(optimizer), which copies the parameters and Adam's state on the writer
   thread while the next forward and backward run and makes optimizer.step() wait for that copy. This
   includes the CPU the background writer takes from the loop: run with all of torch's threads computing,
   and with one fewer (the writer then has a core, as the checkpointer has the host CPUs on a GPU node).
   Target: guard() ≤ 0.1× torch.save.
4. Restore: `restore()` of the full state, every chunk's digest verified, against `torch.load` of
   torch.save's file (weights_only=True); and, once each, of every scenario's second save.

Before each timed contender its old output is deleted and `sync` runs, untimed, so none inherits another's
dirty pages. The page cache is never dropped: writes without fsync end in it; restores and loads read it.
On a VM, touching memory that was not freed just before can cost host page faults: fresh buffers (first
saves) and writes that grow the page cache (the warm full save keeps its previous pack, as keep_last does)
are slower there than rewrites into just-freed pages.

Recorded (unless `--no-record`) into benchmarks/measured.json (or `--record PATH`), merged with the other
benchmarks' figures, per GiB of the state measured: `sentinel_checkpoint_stall_seconds_per_gib` and
`torch_save_seconds_per_gib` (5., all threads computing: seconds added per save), `sentinel_restore_seconds_per_gib`
and `torch_load_seconds_per_gib` (4.) — each with its range over rounds, the command and the conditions.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from support import add_record_arguments, command_line, figure, load, machine, record_figures, report_recorded, say
from torch import nn

from sentinel.sdk import chunks
from sentinel.sdk.checkpoint import CheckpointManager, SaveResult

GIB = 1 << 30
Scenario = tuple[Callable[[], Any], Callable[[], object]]  # the state to save; one training step


def make_state(nbytes: int, d: int = 2048) -> dict[str, Any]:
    layers = max(1, round(nbytes / (3 * 4 * (d * d + d))))
    gen = torch.Generator().manual_seed(0)
    model: dict[str, torch.Tensor] = {}
    optim: dict[int, dict[str, torch.Tensor]] = {}
    for i in range(layers):
        for j, (kind, shape) in enumerate((("weight", (d, d)), ("bias", (d,)))):
            model[f"layers.{i}.{kind}"] = torch.randn(shape, generator=gen)
            optim[2 * i + j] = {"step": torch.tensor(100.0), "exp_avg": torch.randn(shape, generator=gen) * 1e-3,
                                "exp_avg_sq": torch.rand(shape, generator=gen) * 1e-6}
    groups = [{"lr": 1e-4, "betas": [0.9, 0.999], "params": list(optim)}]
    return {"model": model, "optim": {"state": optim, "param_groups": groups}, "step": 100}


def tensors(state: Any) -> list[torch.Tensor]:
    return list(chunks.flatten(state)[1].values())


def digests(state: Any) -> dict[str, str]:
    return {k: chunks.digest(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            for k, t in chunks.flatten(state)[1].items()}


WRITER_NICENESS = [10]  # --writer-niceness
COALESCED: dict[str, list[int]] = {}  # training-loop mode → saves coalesced per round (not written)


def manager(root: Path) -> CheckpointManager:
    return CheckpointManager(job_id=1, rank=0, node="bench", local_dir=str(root / "{node}"), persistent_dir=None,
                             catalog=False, keep_last=3, writer_niceness=WRITER_NICENESS[0])


def save(m: CheckpointManager, step: int, state: Any) -> tuple[float, Future[SaveResult]]:
    """(stall, future): the stall is the wall time until save() returns."""
    started = time.perf_counter()
    fut = m.save(step, state)
    assert fut is not None  # every=1: the local tier is due at every step
    return time.perf_counter() - started, fut


def fresh(path: Path) -> Path:
    if path.is_dir():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    return path


def give_memory_back() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc: give freed heap pages back to the OS
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def clock(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rounds(contenders: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each contender once per round, the order rotated every round; sync (untimed) before each."""
    names, out = list(contenders), {name: list[float]() for name in contenders}
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            os.sync()
            out[name].append(contenders[name]())
            give_memory_back()
    return out


def write_contenders(state: Any, work: Path, firsts: list[tuple[float, SaveResult]]) -> dict[str, Callable[[], float]]:
    count = sum(t.numel() * t.element_size() for t in tensors(state)) >> 20

    def sentinel_first() -> float:
        m = manager(fresh(work / "sentinel"))
        stall, fut = save(m, 1, state)
        firsts.append((stall, fut.result()))
        m.close()
        return stall + firsts[-1][1].write_seconds

    def dcp_save(sync: bool) -> float:
        writer = dcp.FileSystemWriter(fresh(work / "dcp"), sync_files=sync)
        return clock(lambda: dcp.save(state, storage_writer=writer))

    def dcp_async() -> float:
        target = fresh(work / "dcp")
        started = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=target)
        stall = time.perf_counter() - started
        assert isinstance(fut, Future)
        fut.result()
        return stall

    def dd(*conv: str) -> float:
        argv = ["dd", "if=/dev/zero", f"of={fresh(work / 'dd')}", "bs=1M", f"count={count}", *conv]
        return clock(lambda: subprocess.run(argv, check=True, capture_output=True))

    def torch_save() -> float:
        target = fresh(work / "t.pt")
        return clock(lambda: torch.save(state, target))

    return {"sentinel first save": sentinel_first, "torch.save": torch_save, "dcp.save": lambda: dcp_save(True),
            "dcp.save no fsync": lambda: dcp_save(False), "dcp.async_save stall": dcp_async, "dd": dd,
            "dd fdatasync": lambda: dd("conv=fdatasync")}


def steady_state(state: Any, work: Path, repeats: int) -> tuple[list[float], list[float], float, float,
                                                                  CheckpointManager]:
    """Steady stalls and, interleaved, the copy_ floor; the stall with a full write in flight; warm full-save
    throughput; the manager (for restore)."""
    m = manager(fresh(work / "sentinel"))
    save(m, 1, state)[1].result()
    buffers = [torch.empty_like(t).copy_(t) for t in tensors(state)]
    stalls, floor = [], []
    for step in range(2, 3 + 2 * repeats):
        tensors(state)[0].add_(1e-3)  # a little training between saves: one tensor changes
        stall, fut = save(m, step, state)
        stalls.append(stall)
        fut.result()
        floor.append(clock(lambda: [b.copy_(t) for b, t in zip(buffers, tensors(state), strict=True)]))
    buffers.clear()
    for t in tensors(state):  # a dense update, its full write in flight when the next save comes
        t.add_(1e-3)
    os.sync()
    full_stall, full = save(m, 100, state)
    in_flight, fut = save(m, 101, state)
    assert full.result().outcome == fut.result().outcome == "written"  # 101 queued, then written after 100
    warm = full.result().bytes_total / (full_stall + full.result().write_seconds) / 1e9
    return stalls, floor, in_flight, warm, m


def second_save(work: Path, state: Callable[[], Any], step: Callable[[], object]) -> tuple[SaveResult, float, float]:
    """The second save's result; then the times of restore() and of torch.load of the same state."""
    m = manager(fresh(work))
    save(m, 1, state())[1].result()
    with torch.no_grad():
        step()
    res = save(m, 2, state())[1].result()
    torch.save(state(), work / "t.pt")
    os.sync()
    give_memory_back()
    restored = clock(m.restore)
    give_memory_back()
    loaded = clock(lambda: torch.load(work / "t.pt", weights_only=True))
    m.close()
    shutil.rmtree(work, ignore_errors=True)
    return res, restored, loaded


def dense(size: int, gen: torch.Generator) -> Scenario:
    state = make_state(size)
    return (lambda: state), lambda: [t.add_(torch.randn(t.shape, generator=gen) * 1e-4) for t in tensors(state)]


def frozen(size: int, gen: torch.Generator) -> Scenario:
    d = max(64, int((size / 40) ** 0.5) // 64 * 64)  # 10 layers of d×d + d float32 ≈ size
    stack = nn.Sequential(*(nn.Linear(d, d) for _ in range(10)))
    trained = list(stack[-1].parameters())  # the other 9 layers are frozen
    return stack.state_dict, lambda: [p.add_(torch.randn(p.shape, generator=gen) * 1e-4) for p in trained]


def embedding(size: int, gen: torch.Generator, contiguous: bool) -> Scenario:
    rows = max(1024, size // (128 * 4))
    table, head = nn.Embedding(rows, 128), nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128))
    model = nn.ModuleDict({"embedding": table, "head": head})  # "embedding.weight" is chunked on rows
    changed = max(1, rows // 100)
    start = int(torch.randint(0, rows - changed + 1, (1,), generator=gen))
    index = torch.arange(start, start + changed) if contiguous else torch.randperm(rows, generator=gen)[:changed]

    def step() -> None:
        table.weight[index] += torch.randn(changed, 128, generator=gen) * 1e-2
        for p in head.parameters():  # the small dense head changes everywhere
            p.add_(torch.randn(p.shape, generator=gen) * 1e-4)

    return model.state_dict, step


def scenarios(work: Path, size: int) -> dict[str, tuple[SaveResult, float, float]]:
    gen = torch.Generator().manual_seed(1)
    makers: dict[str, Callable[[], Scenario]] = {
        "dense update": lambda: dense(size, gen), "90% frozen": lambda: frozen(size, gen),
        "embed 1% random rows": lambda: embedding(size, gen, False),
        "embed 1% contig. rows": lambda: embedding(size, gen, True)}
    out = {}
    for name, make in makers.items():
        out[name] = second_save(work, *make())
        give_memory_back()
    return out


def training_loop(work: Path, nbytes: int, steps: int, every: int,
                  repeats: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds each save adds to a real loop (forward, backward, Adam on a Linear stack), per save: the
    loop's time with saves every `every` steps minus its time without, over the saves. This counts what
    the background writer takes from the loop's CPUs too. Modes: no checkpoint; torch.save; save()
    (blocking snapshot); save() after guard(optimizer) (snapshot overlapped with the next forward/backward).
    Also, per mode, the same per round (that round's loop with saves minus its loop without): the spread."""
    d = 2048
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(d, d) for _ in range(max(1, round(nbytes / (3 * 4 * (d * d + d)))))])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(32, d)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def run(save: Callable[[int], object] | None) -> float:
        started = time.perf_counter()
        for i in range(1, steps + 1):
            step()
            if save is not None and i % every == 0:
                save(i)
        return time.perf_counter() - started

    def sentinel(guarded: bool) -> float:
        m = manager(fresh(work / "loop"))
        if guarded:
            m.guard(opt)  # hooks stay on opt; with no save in flight they return at once
        seconds = run(lambda i: m.save(i, state()))
        m.close()
        COALESCED.setdefault(f"{torch.get_num_threads()} {guarded}", []).append(m.saves_coalesced)
        return seconds

    step()  # Adam's state exists from here on
    modes: dict[str, Callable[[], float]] = {
        "no checkpoint": lambda: run(None), "torch.save": lambda: run(lambda _: torch.save(state(), work / "l.pt")),
        "save()": lambda: sentinel(False), "save() + guard()": lambda: sentinel(True)}
    measured = rounds(modes, repeats)
    times = {name: statistics.median(values) for name, values in measured.items()}
    saves = steps // every
    per_round = {name: [(t - none) / saves for t, none in zip(values, measured["no checkpoint"], strict=True)]
                 for name, values in measured.items() if name != "no checkpoint"}
    return {name: (t - times["no checkpoint"]) / saves for name, t in times.items() if name != "no checkpoint"} | {
        "step": times["no checkpoint"] / steps, "size": float(sum(t.numel() * 4 for t in tensors(state())))}, per_round


def verdict(ratio: float, target: str) -> str:
    if target[:1] not in ("≤", "≥"):
        return "-"
    bound = float(target[1:].strip().rstrip("×"))
    return "met" if (ratio <= bound if target[0] == "≤" else ratio >= bound) else "MISSED"


def secs(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values) + " s"


def record(args: argparse.Namespace, loop: dict[str, float], per_round: dict[str, list[float]],
           loads: dict[str, list[float]], size: int, threads: int, started_load: str) -> None:
    """Per GiB of state, for the fault-schedule simulator: the in-loop cost of a save with guard() and of
    torch.save in the same loop (all threads computing; the printed difference of medians, the range over
    rounds), and a verified restore() against torch.load of the `--gib` state."""
    loop_gib, gib = loop["size"] / GIB, size / GIB
    common = (f"{machine()}, torch {torch.__version__} on CPU tensors, load average {started_load} at the start and "
              f"{load()} at the end (another engineer's tests sharing the machine), medians of {args.repeats} "
              "rotated rounds, Sentinel's local tier (LocalDirStore, no fsync), page cache not dropped")
    in_loop = (f"{common}; seconds a save adds to a forward/backward/Adam loop on a Linear 2048×2048 stack of "
               f"{loop_gib:.3f} GiB model + Adam state, a save every 3 of {args.loop_steps} steps, all {threads} "
               "torch threads computing (the writer shares the loop's cores), divided by that state's GiB.")
    restore = (f"{common}; restore() of the last full save of a {gib:.3f} GiB model + Adam-like state (2048×2048 "
               "float32 layers), every chunk's digest verified, against torch.load(weights_only=True) of "
               "torch.save's file, divided by that state's GiB.")
    figures = {
        "sentinel_checkpoint_stall_seconds_per_gib": figure(
            [v / loop_gib for v in per_round["save() + guard()"]], "s/GiB", loop["save() + guard()"] / loop_gib,
            conditions=in_loop),
        "torch_save_seconds_per_gib": figure([v / loop_gib for v in per_round["torch.save"]], "s/GiB",
                                             loop["torch.save"] / loop_gib, conditions=in_loop),
        "sentinel_restore_seconds_per_gib": figure([v / gib for v in loads["restore"]], "s/GiB", conditions=restore),
        "torch_load_seconds_per_gib": figure([v / gib for v in loads["torch.load"]], "s/GiB", conditions=restore)}
    record_figures(figures, source=command_line(), conditions=in_loop, path=args.record)
    report_recorded(args.record, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="state size for stall, throughput and restore")
    parser.add_argument("--scenario-gib", type=float, default=0.25, help="state size of each incremental scenario")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (medians of this many)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /tmp)")
    parser.add_argument("--loop-gib", type=float, default=0.5, help="model + Adam state of the training-loop run")
    parser.add_argument("--loop-steps", type=int, default=12, help="steps per training-loop run (a save every 3)")
    parser.add_argument("--writer-niceness", type=int, default=10, help="CheckpointManager(writer_niceness=)")
    add_record_arguments(parser)
    args = parser.parse_args()
    WRITER_NICENESS[0] = args.writer_niceness
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sentinel-checkpoint-bench-", dir=args.dir))
    r = args.repeats
    started_load = load()
    try:
        state = make_state(int(args.gib * GIB))
        size = sum(t.numel() * t.element_size() for t in tensors(state))
        say(f"state: {len(tensors(state))} tensors, {size / GIB:.3f} GiB; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load {started_load}; writing under {work}")
        firsts: list[tuple[float, SaveResult]] = []
        writes = rounds(write_contenders(state, work, firsts), r)
        for name, values in writes.items():
            say(f"  {name:21} {secs(values)}")
        say(f"  Sentinel first saves: stall {secs([s for s, _ in firsts])}, background write "
            f"{secs([f.write_seconds for _, f in firsts])} ({firsts[0][1].chunks_written} chunks)")
        steady, floor, in_flight, warm, m = steady_state(state, work, r)
        say(f"  Sentinel steady-state stalls {secs(steady)}\n  copy_ into warm buffers, interleaved {secs(floor)}\n"
            f"  Sentinel stall with a full write in flight {in_flight:.3f} s; full save, warm buffers {warm:.3f} GB/s")
        torch.save(state, work / "t.pt")
        expected = digests(state)
        del state
        give_memory_back()

        def restore() -> float:
            started = time.perf_counter()
            got = m.restore()
            seconds = time.perf_counter() - started
            assert got is not None and got.step == 101 and digests(got.state) == expected, "restored other bytes"
            return seconds

        loads = rounds({"restore": restore,
                        "torch.load": lambda: clock(lambda: torch.load(work / "t.pt", weights_only=True))}, r)
        say(f"  restore {secs(loads['restore'])}; torch.load {secs(loads['torch.load'])}")
        m.close()
        shutil.rmtree(work / "sentinel")
        scen_size = int(args.scenario_gib * GIB)
        written = scenarios(work / "scenario", scen_size)
        for name, (res, restored, loaded) in written.items():
            say(f"  {name}: second save wrote {res.bytes_written} of {res.bytes_total} bytes, {res.chunks_written} "
                f"chunks; stall {res.stall_seconds:.3f} s, write {res.write_seconds:.3f} s; restore {restored:.3f} s, "
                f"torch.load {loaded:.3f} s")

        loops: dict[int, dict[str, float]] = {}
        loop_rounds: dict[int, dict[str, list[float]]] = {}
        threads = torch.get_num_threads()
        for n in sorted({threads, max(1, threads - 1)}, reverse=True):
            torch.set_num_threads(n)  # fewer compute threads: the writer gets a core, as on a GPU node's host
            loops[n], loop_rounds[n] = training_loop(work, int(args.loop_gib * GIB), args.loop_steps, 3, r)
            loop = loops[n]
            say(f"  training loop, {n} compute thread(s) ({loop['size'] / GIB:.3f} GiB of model + Adam state, "
                f"{loop['step']:.3f} s a step without checkpoints): seconds added per save: " + ", ".join(
                    f"{name} {loop[name]:.3f}" for name in ("torch.save", "save()", "save() + guard()"))
                + "; per round: " + "; ".join(f"{name} {secs(loop_rounds[n][name])}"
                                              for name in ("torch.save", "save()", "save() + guard()"))
                + f"; saves coalesced (not written) per round of {args.loop_steps // 3}: save() "
                f"{COALESCED.get(f'{n} False')}, save() + guard() {COALESCED.get(f'{n} True')}")
        torch.set_num_threads(threads)

        med = {name: statistics.median(values) for name, values in {**writes, **loads}.items()}
        med["copy_ into warm buffers"], med["full save (itself)"] = statistics.median(floor), 1.0
        gb, stall, first = size / 1e9, statistics.median(steady), statistics.median(s for s, _ in firsts)
        tput = statistics.median(f.bytes_total / (f.stall_seconds + f.write_seconds) for _, f in firsts) / 1e9
        rows: list[tuple[str, float, str, float, str]] = []  # metric, Sentinel, baseline, its value, target
        for name, target in (("torch.save", "≤ 0.1×"), ("dcp.save", "≤ 0.1×"), ("dcp.save no fsync", "≤ 0.1×"),
                             ("dcp.async_save stall", ""), ("copy_ into warm buffers", "")):
            rows.append(("save() stall, steady state (s)", stall, name, med[name], target))
        for n, loop in loops.items():
            for name, target in (("save() + guard()", "≤ 0.1×"), ("save()", "")):
                rows.append((f"loop, {n} thr: stall/save, {name}", loop[name], "torch.save in the loop",
                             loop["torch.save"], target))
        rows += [("save() stall, first save (s)", first, "torch.save", med["torch.save"], ""),
                 ("save() stall, write in flight (s)", in_flight, "torch.save", med["torch.save"], "")]
        for name, target in (("dcp.save", "≥ 1.0×"), ("dcp.save no fsync", "≥ 1.0×"), ("torch.save", ""), ("dd", ""),
                             ("dd fdatasync", "")):
            rows.append(("first full save throughput (GB/s)", tput, name, gb / med[name], target))
        rows.append(("warm full save throughput (GB/s)", warm, "dcp.save no fsync", gb / med["dcp.save no fsync"], ""))
        for (name, (res, _, _)), target in zip(written.items(), ("≈ 1.0×", "≤ 0.15×", "≤ 0.05×", ""), strict=True):
            rows.append((f"written/total: {name}", res.bytes_written / res.bytes_total, "full save (itself)", 1.0,
                         target))
        rows.append(("restore, verified (s)", med["restore"], "torch.load", med["torch.load"], ""))
        _, restored, loaded = written["embed 1% random rows"]
        rows.append(("restore, embedding scenario (s)", restored, "torch.load", loaded, ""))
        say("")
        say(f"{'metric':40} {'Sentinel':>9}  {'baseline':23} {'value':>8} {'ratio':>8}  {'target':7} met?")
        for metric, mine, name, theirs, target in rows:
            ratio = mine / theirs
            say(f"{metric:40} {mine:9.3f}  {name:23} {theirs:8.3f} {ratio:7.3f}×  {target:7} {verdict(ratio, target)}")
        say(f"(state {size / GIB:.3f} GiB; scenarios {scen_size / GIB:.3f} GiB each; medians of {r} rotated rounds; "
            "GB = 1e9 bytes; Sentinel's local tier does not fsync; page cache not dropped)")
        if args.record is not None:
            record(args, loops[threads], loop_rounds[threads], loads, size, threads, started_load)
        else:
            report_recorded(None, {})
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
