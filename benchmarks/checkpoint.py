"""Checkpoint benchmark: the SDK's CheckpointManager against torch.save, torch.distributed.checkpoint and dd.

    PYTHONPATH=. python benchmarks/checkpoint.py [--gib 1] [--scenario-gib 0.25] [--repeats 3] [--dir DIR]
        [--loop-gib 0.5] [--loop-steps 30] [--loop-rounds 7] [--no-record | --record PATH]

One process, CPU torch tensors, every baseline measured in the same run: each contender runs once per round,
the order rotated every round; medians are reported (the machine is noisy). The state is a model plus
Adam-like optimizer state (2048×2048 float32 layers; nested dicts, integer keys), about `--gib` GiB.
Sentinel writes to its local tier (LocalDirStore: no fsync), `catalog=False`.

1. Stall, the time until `save()` returns. Steady state: warm buffers, and the loop waits for each
   background write before the next save (a training step longer than the write); the floor, `copy_` of
   every tensor into warm buffers, is timed between those saves. Also: first saves (a fresh manager;
   malloc_trim between rounds gives freed memory back, so its buffers are page-faulted in again) and saves
   issued while the previous full write is in flight: one queued (coalesce, the default), one that replaces
   the queued one before it begins, and one with when_busy="skip"; none waits for the write, and the printed
   outcomes and saves_coalesced say what became of each. Baselines: `torch.save(state,
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
   model + Adam state, `--loop-steps` steps, a save every 3, `--loop-rounds` rounds), in steady state: each
   Sentinel mode's manager first saves untimed until 5 saves were written (buffers allocated, retired packs
   recycled as spares) and is then kept across the rounds, as a long job keeps it; a timed run goes on until
   its last save is written. Per round, loop time with saves minus the same round's loop without, per save
   (paired: the machine's speed drifts over minutes), for torch.save, save(guard=False) and save() with its
   default guard, which copies the parameters and Adam's state on a stage thread (in steady state: writes them
   straight into a spare pack) while the next forward and backward run and makes optimizer.step() wait for
   that; the median over rounds is reported. This includes the CPU the background writer takes from the loop:
   run with all of torch's threads computing, and with one fewer (the writer then has a core, as the
   checkpointer has the host CPUs on a GPU node). Also the floor (`write_floor`): the CPU seconds of hashing
   the loop's state and writing it into cached pages, which a guarded save beside a loop computing on every
   core costs it at least.
   Target: save() (guarded) ≤ 0.2× torch.save.
4. Restore: `restore()` by a fresh manager (as after a restart: its store's index not loaded yet) of the full
   state, every chunk's digest verified, against `torch.load` of torch.save's file (weights_only=True); and
   of every scenario's second save (each scenario run `--repeats` times, medians); and the full state's
   and the embedding scenarios' both again, each in a process of its own (a restart's: memory fresh to the
   process; the readers before run in one that just freed as much), after one untimed child of each (the
   first child after the state was freed meets memory the host took back), in alternating order. Target:
   ≤ 1.0× torch.load.

Before each timed contender its old output is deleted and `sync` runs, untimed, so none inherits another's
dirty pages. The page cache is never dropped: writes without fsync end in it; restores and loads read it.
On a VM, touching memory that was not freed just before can cost host page faults: fresh buffers (first
saves) and writes that grow the page cache (the warm full save keeps its previous pack, as keep_last does)
are slower there than rewrites into just-freed pages.

Recorded (unless `--no-record`) into benchmarks/measured.json (or `--record PATH`), merged with the other
benchmarks' figures, per GiB of the state measured: `sentinel_checkpoint_stall_seconds_per_gib` and
`torch_save_seconds_per_gib` (5., all threads computing: seconds added per save), `sentinel_restore_seconds_per_gib`
and `torch_load_seconds_per_gib` (4., in fresh processes) — each with its range over rounds, the command and the
conditions.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
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


def manager(root: Path, *, guard: bool = False, when_busy: str | None = None) -> CheckpointManager:
    return CheckpointManager(job_id=1, rank=0, node="bench", local_dir=str(root / "{node}"), persistent_dir=None,
                             catalog=False, keep_last=3, writer_niceness=WRITER_NICENESS[0], guard=guard,
                             when_busy=when_busy)


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


def steady_state(state: Any, work: Path, repeats: int) -> tuple[list[float], list[float], dict[str, Any], float,
                                                                  CheckpointManager]:
    """Steady stalls and, interleaved, the copy_ floor; saves issued while a full write is in flight; warm
    full-save throughput; the manager (for restore)."""
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
    busy: dict[str, Any] = {"writing_when_issued": not full.done()}
    busy["queued_stall"], queued = save(m, 101, state)  # queued into the second buffer set
    busy["replacing_stall"], newest = save(m, 102, state)  # replaces 101, which has not begun
    busy["outcomes"] = [f"{f.result().step} {f.result().outcome}" for f in (full, queued, newest)]
    busy["coalesced"] = m.saves_coalesced
    warm = full.result().bytes_total / (full_stall + full.result().write_seconds) / 1e9
    skipper = manager(work / "sentinel", when_busy="skip")  # the same store, the other policy
    first = skipper.save(103, state)
    busy["skip_stall"], skipped = save(skipper, 104, state)
    assert first is not None
    busy["outcomes"] += [f"{first.result().step} {first.result().outcome}", f"104 {skipped.result().outcome}"]
    skipper.close()
    return stalls, floor, busy, warm, m


COLD_PAIRS = 2  # timed fresh-process reads of each reader per scenario round (one alone moved by ±30%)


def second_save(work: Path, state: Callable[[], Any], step: Callable[[], object], cold_too: bool = False,
                cold_first: str = "restore") -> tuple[SaveResult, float, float, list[float], list[float]]:
    """The second save's result; then the times of restore() and of torch.load of the same state (each the
    mean of two, in the order restore, load, load, restore, after one untimed read by each); with `cold_too`,
    also each COLD_PAIRS times in a process of its own, `cold_first` first (after an untimed read by each; none
    without)."""
    m = manager(fresh(work))
    save(m, 1, state())[1].result()
    with torch.no_grad():
        step()
    res = save(m, 2, state())[1].result()
    torch.save(state(), work / "t.pt")
    os.sync()

    def restore() -> float:
        reader = manager(work)  # as after a restart: a fresh manager, its store's index not yet loaded
        try:
            return clock(reader.restore)
        finally:
            reader.close()

    def load() -> float:
        return clock(lambda: torch.load(work / "t.pt", weights_only=True))

    # The first read after the saves meets the memory they freed (on a VM, pages the host may have taken back),
    # whichever reader it is: 0.50-0.74 s against 0.13-0.17 s for either (7 December). Timed ABBA alone gave
    # that slot to restore every time, so each reads once untimed first, then ABBA.
    for untimed in (load, restore):
        give_memory_back()
        untimed()
    times: dict[str, list[float]] = {"restore": [], "load": []}
    for name in ("restore", "load", "load", "restore"):
        give_memory_back()
        times[name].append(restore() if name == "restore" else load())
    m.close()
    cold = cold_reads(work, work / "t.pt", COLD_PAIRS, cold_first) if cold_too else {"restore": [], "torch.load": []}
    shutil.rmtree(work, ignore_errors=True)
    return res, statistics.mean(times["restore"]), statistics.mean(times["load"]), cold["restore"], \
        cold["torch.load"]


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


def scenarios(work: Path, size: int, seed: int = 1
              ) -> dict[str, tuple[SaveResult, float, float, list[float], list[float]]]:
    gen = torch.Generator().manual_seed(seed)  # which rows change
    makers: dict[str, Callable[[], Scenario]] = {
        "dense update": lambda: dense(size, gen), "90% frozen": lambda: frozen(size, gen),
        "embed 1% random rows": lambda: embedding(size, gen, False),
        "embed 1% contig. rows": lambda: embedding(size, gen, True)}
    out = {}
    for name, make in makers.items():
        out[name] = second_save(work, *make(), cold_too=name.startswith("embed"),
                                cold_first=("restore", "torch.load")[seed % 2])  # rounds alternate who is first
        give_memory_back()
    return out


WARMUP_SAVES = 5  # keep_last (3) + 2: buffers allocated, the retired packs recycled (spares): steady state
LOOP_MODES = ("torch.save", "save(guard=False)", "save() (guarded)")
LOOP_CPU: dict[str, list[float]] = {}  # mode → this process's CPU seconds per round (all its threads)


def training_loop(work: Path, nbytes: int, steps: int, every: int,
                  repeats: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds each save adds to a real loop (forward, backward, Adam on a Linear stack), per save, in steady
    state: the loop's time with saves every `every` steps, until its last save is written (the writer's
    leftover after the loop counted too), minus its time without, over the saves. This counts what the
    background writer takes from the loop's CPUs. Modes: no checkpoint; torch.save; save(guard=False) (the whole
    snapshot copied before save returns); save() with its default guard (the optimizer's tensors copied, or in
    steady state written straight into the store, while the next forward/backward runs). Each Sentinel mode first
    saves, untimed, until WARMUP_SAVES saves were written (not coalesced), as a long job would have. Also, per mode,
    the same per round: the spread; and the process's CPU seconds per round (LOOP_CPU), steadier than wall time when
    other work shares the machine."""
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

    def run(save: Callable[[int], object] | None, first: int = 1, count: int = steps) -> float:
        started = time.perf_counter()
        for i in range(first, first + count):
            step()
            if save is not None and i % every == 0:
                save(i)
        return time.perf_counter() - started

    def warmed(guard: bool) -> tuple[CheckpointManager, list[int]]:
        """A manager in steady state, and the next step it saves: untimed saves until WARMUP_SAVES were written,
        not coalesced. With fewer than keep_last + 1 written no retired pack is there to be overwritten, and the
        timed loop's first write then fills a new file (7 December: 480 MiB written in 5.9 s against 0.1-0.8 s
        into a spare, 7 saves coalesced meanwhile)."""
        m = manager(fresh(work / f"loop-{'guarded' if guard else 'unguarded'}"), guard=guard)
        first, last = 1, 4 * WARMUP_SAVES * every  # bounded
        while first == 1 or ((first - 1) // every - m.saves_coalesced < WARMUP_SAVES and first <= last):
            count = WARMUP_SAVES * every if first == 1 else every
            run(lambda i: m.save(i, state()), first, count)
            m.wait()
            first += count
        return m, [first]

    def sentinel(guard: bool, m: CheckpointManager, next_step: list[int]) -> float:
        """One timed run of the loop with this manager's saves, its steps after the last run's."""
        first, coalesced = next_step[0], m.saves_coalesced
        cpu = time.process_time()
        seconds = run(lambda i: m.save(i, state()), first)
        seconds += clock(m.wait)  # the write still in flight when the loop ends
        LOOP_CPU.setdefault(f"{torch.get_num_threads()} {'save() (guarded)' if guard else 'save(guard=False)'}",
                            []).append(time.process_time() - cpu)  # the timed part only, as the wall time
        COALESCED.setdefault(f"{torch.get_num_threads()} {guard}", []).append(m.saves_coalesced - coalesced)
        next_step[0] = first + steps
        return seconds

    step()  # Adam's state exists from here on
    torch.save(state(), work / "l.pt")  # its file exists, as it would after the first save of a long job
    unguarded, guarded = warmed(False), warmed(True)  # each kept in steady state across the rounds
    modes: dict[str, Callable[[], float]] = {
        "no checkpoint": lambda: run(None), "torch.save": lambda: run(lambda _: torch.save(state(), work / "l.pt")),
        "save(guard=False)": lambda: sentinel(False, *unguarded), "save() (guarded)": lambda: sentinel(True, *guarded)}
    def cpu_timed(name: str, run_mode: Callable[[], float]) -> Callable[[], float]:
        if name.startswith("save"):
            return run_mode  # sentinel() times its own CPU (the managers' warm-up is not in the rounds)

        def timed() -> float:
            started = time.process_time()
            seconds = run_mode()
            LOOP_CPU.setdefault(f"{torch.get_num_threads()} {name}", []).append(time.process_time() - started)
            return seconds
        return timed

    measured = rounds({name: cpu_timed(name, run_mode) for name, run_mode in modes.items()}, repeats)
    for m, _ in (unguarded, guarded):
        m.close()
    saves = steps // every
    # Paired: each mode against the loop without checkpoints in the same round (tens of seconds apart, not
    # minutes): that loop alone took 4.7-7.9 s for the same work within minutes on these VMs.
    per_round = {name: [(t - none) / saves for t, none in zip(values, measured["no checkpoint"], strict=True)]
                 for name, values in measured.items() if name != "no checkpoint"}
    return {name: statistics.median(values) for name, values in per_round.items()} | {
        "step": statistics.median(measured["no checkpoint"]) / steps,
        "size": float(sum(t.numel() * 4 for t in tensors(state())))}, per_round


def write_floor(work: Path, nbytes: int, repeats: int) -> tuple[float, float]:
    """CPU seconds (of the writing thread) to put a state of `nbytes` into pages a file already has in the page
    cache, as a steady guarded save does with its spare pack: each 1 MiB chunk hashed, then written 4 MiB at a
    time (what the stores' streamed write does); and the same writes without hashing. Medians of `repeats`. With
    every core computing, a thread doing this beside the loop costs it about that much wall time: the floor of
    the in-loop figure."""
    views = [view for t in tensors(make_state(nbytes))
             for view in chunks.cut(memoryview(t.reshape(-1).view(torch.uint8).numpy()), chunks.DEFAULT_CHUNK_BYTES)]
    path = work / "floor.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(hashed: bool) -> float:
        os.lseek(fd, 0, os.SEEK_SET)
        started, batch, queued = time.thread_time(), list[memoryview](), 0
        for view in views:
            if hashed:
                chunks.digest(view)
            batch.append(view)
            queued += len(view)
            if queued >= 4 << 20:
                os.writev(fd, batch)
                batch, queued = [], 0
        os.writev(fd, batch)
        return time.thread_time() - started

    try:
        write(False)  # the file's pages exist from here on
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(repeats):
            for hashed in (True, False):
                os.sync()  # (as before each timed loop run: the pages were written back, as a job's are)
                times[hashed].append(write(hashed))
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times[True]), statistics.median(times[False])


def cpu_added(threads: int, mode: str, saves: int) -> float:
    """The process's CPU seconds a save adds: the median over rounds of each round's difference."""
    return statistics.median((cpu - none) / saves for cpu, none in zip(
        LOOP_CPU[f"{threads} {mode}"], LOOP_CPU[f"{threads} no checkpoint"], strict=True))


def verdict(ratio: float, target: str) -> str:
    if target[:1] not in ("≤", "≥"):
        return "-"
    bound = float(target[1:].strip().rstrip("×"))
    return "met" if (ratio <= bound if target[0] == "≤" else ratio >= bound) else "MISSED"


def secs(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values) + " s"


def record(args: argparse.Namespace, loop: dict[str, float], per_round: dict[str, list[float]],
           loads: dict[str, list[float]], size: int, threads: int, started_load: str) -> None:
    """Per GiB of state, for the fault-schedule simulator: the in-loop cost of a save (guarded, the default) and of
    torch.save in the same loop (all threads computing; the printed difference of medians, the range over
    rounds), and a verified restore() against torch.load of the `--gib` state, each in a fresh process (a
    restart's: what the simulator charges a restart)."""
    loop_gib, gib = loop["size"] / GIB, size / GIB
    common = (f"{machine()}, torch {torch.__version__} on CPU tensors, load average {started_load} at the start and "
              f"{load()} at the end, medians of {args.repeats} rotated rounds, Sentinel's local tier "
              "(LocalDirStore, no fsync), page cache not dropped")
    in_loop = (f"{common}; seconds a save adds to a forward/backward/Adam loop on a Linear 2048×2048 stack of "
               f"{loop_gib:.3f} GiB model + Adam state, a save every 3 of {args.loop_steps} steps, a manager kept "
               f"across the rounds after 5 untimed saves (steady state), until the last save is written, medians "
               f"over {args.loop_rounds} rounds of each round's difference from the loop without saves, all "
               f"{threads} torch threads computing (the writer shares the loop's cores), divided by that state's "
               "GiB.")
    restore = (f"{common}; restore() of the last full save of a {gib:.3f} GiB model + Adam-like state (2048×2048 "
               "float32 layers), every chunk's digest verified, against torch.load(weights_only=True) of torch.save's "
               "file, each in a process of its own (as after a restart; timed from the call), divided by that "
               "state's GiB.")
    figures = {
        "sentinel_checkpoint_stall_seconds_per_gib": figure(
            [v / loop_gib for v in per_round["save() (guarded)"]], "s/GiB", loop["save() (guarded)"] / loop_gib,
            conditions=in_loop),
        "torch_save_seconds_per_gib": figure([v / loop_gib for v in per_round["torch.save"]], "s/GiB",
                                             loop["torch.save"] / loop_gib, conditions=in_loop),
        "sentinel_restore_seconds_per_gib": figure([v / gib for v in loads["restore"]], "s/GiB", conditions=restore),
        "torch_load_seconds_per_gib": figure([v / gib for v in loads["torch.load"]], "s/GiB", conditions=restore)}
    record_figures(figures, source=command_line(), conditions=in_loop, path=args.record)
    report_recorded(args.record, figures)


def cold_reads(root: Path, file: Path, repeats: int, first: str = "restore") -> dict[str, list[float]]:
    """restore() from the store under `root` and torch.load of `file`, each in a process of its own, as after a
    restart: its memory is fresh to it (the readers in this process run just after it freed as much). Timed
    inside the child, from the call to its return (not the interpreter's start or torch's import). The first
    child after the state was freed meets memory the host may have taken back (7 December: 0.27 s against
    0.14-0.19 s for the next ones), so one untimed child of each reader runs first; then the order alternates,
    beginning with `first`."""
    out: dict[str, list[float]] = {"restore": [], "torch.load": []}
    other = {"restore": "torch.load", "torch.load": "restore"}
    untimed = [(first, False), (other[first], False)]
    timed = [(reader, True) for i in range(repeats)
             for reader in ((first, other[first]) if i % 2 == 0 else (other[first], first))]
    for reader, keep in untimed + timed:
        give_memory_back()
        child = subprocess.run([sys.executable, __file__, "--cold-read", reader, str(root), str(file)],
                               capture_output=True, text=True, timeout=600, check=True)
        if keep:
            out[reader].append(float(child.stdout.split()[-1]))
    return out


def cold_read(reader: str, root: Path, file: Path) -> None:
    """The child of cold_reads: one read, its seconds printed last. Its modules are imported before the clock
    starts, as torch's are: restore() imports its own on first use, and where bytecode is not cached
    (PYTHONDONTWRITEBYTECODE, set on these machines) compiling them took 5-6 ms of a 0.03 s restore."""
    if reader == "restore":
        importlib.import_module("sentinel.sdk.restore")
        m = manager(root)
        seconds = clock(m.restore)
        m.close()
    else:
        seconds = clock(lambda: torch.load(file, weights_only=True))
    print(f"{seconds:.6f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="state size for stall, throughput and restore")
    parser.add_argument("--scenario-gib", type=float, default=0.25, help="state size of each incremental scenario")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (medians of this many)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /tmp)")
    parser.add_argument("--loop-gib", type=float, default=0.5, help="model + Adam state of the training-loop run")
    parser.add_argument("--loop-steps", type=int, default=30, help="steps per training-loop run (a save every 3)")
    parser.add_argument("--loop-rounds", type=int, default=7, help="rounds of the training-loop runs")
    parser.add_argument("--writer-niceness", type=int, default=10, help="CheckpointManager(writer_niceness=)")
    parser.add_argument("--cold-read", nargs=3, metavar=("READER", "ROOT", "FILE"), help=argparse.SUPPRESS)
    add_record_arguments(parser)
    args = parser.parse_args()
    if args.cold_read:
        cold_read(args.cold_read[0], Path(args.cold_read[1]), Path(args.cold_read[2]))
        return 0
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
        contenders = write_contenders(state, work, firsts)
        rounds(contenders, 1)  # untimed: the page cache grows to hold every contender's file (on a VM, pages
        firsts.clear()  # the host faults in); without it the first three of round 1 took 2.3-3.0 s, not 0.3-0.9
        writes = rounds(contenders, r)
        for name, values in writes.items():
            say(f"  {name:21} {secs(values)}")
        say(f"  Sentinel first saves: stall {secs([s for s, _ in firsts])}, background write "
            f"{secs([f.write_seconds for _, f in firsts])} ({firsts[0][1].chunks_written} chunks)")
        steady, floor, busy, warm, m = steady_state(state, work, r)
        in_flight = max(busy["queued_stall"], busy["replacing_stall"], busy["skip_stall"])
        say(f"  Sentinel steady-state stalls {secs(steady)}\n  copy_ into warm buffers, interleaved {secs(floor)}\n"
            f"  saves issued while a full write was in flight (still writing: {busy['writing_when_issued']}): "
            f"queued {busy['queued_stall']:.3f} s, replacing the queued one {busy['replacing_stall']:.3f} s, "
            f"when_busy='skip' {busy['skip_stall']:.3f} s; outcomes {', '.join(busy['outcomes'])}; "
            f"saves_coalesced {busy['coalesced']}\n  full save, warm buffers {warm:.3f} GB/s")
        torch.save(state, work / "t.pt")
        expected = digests(state)
        del state
        give_memory_back()

        def restore() -> float:
            reader = manager(work / "sentinel")  # as after a restart: a fresh manager, no index loaded yet
            started = time.perf_counter()
            got = reader.restore()
            seconds = time.perf_counter() - started
            reader.close()
            assert got is not None and got.step == 103 and digests(got.state) == expected, "restored other bytes"
            return seconds

        readers = {"restore": restore,
                   "torch.load": lambda: clock(lambda: torch.load(work / "t.pt", weights_only=True))}
        rounds(readers, 1)  # untimed: the first read after the state was freed meets pages the host took back
        loads = rounds(readers, r)  # (either reader; rotated rounds of 3 gave restore that slot twice)
        say(f"  restore {secs(loads['restore'])}; torch.load {secs(loads['torch.load'])}")
        colds = cold_reads(work / "sentinel", work / "t.pt", r)
        say(f"  in a fresh process (a restart): restore {secs(colds['restore'])}; "
            f"torch.load {secs(colds['torch.load'])}")
        m.close()
        shutil.rmtree(work / "sentinel")
        scen_size = int(args.scenario_gib * GIB)
        scenario_rounds = [scenarios(work / "scenario", scen_size, seed=1 + i) for i in range(r)]
        written = scenario_rounds[-1]
        for name, (res, *_) in written.items():
            restores = [one[name][1] for one in scenario_rounds]
            loaded_in = [one[name][2] for one in scenario_rounds]
            say(f"  {name}: second save wrote {res.bytes_written} of {res.bytes_total} bytes, {res.chunks_written} "
                f"chunks; stall {res.stall_seconds:.3f} s, write {res.write_seconds:.3f} s; restore "
                f"{secs(restores)}, torch.load {secs(loaded_in)}, ratio per round "
                + ", ".join(f"{a / b:.2f}" for a, b in zip(restores, loaded_in, strict=True)))
            if name.startswith("embed"):
                say(f"    in a fresh process: restore {secs([t for one in scenario_rounds for t in one[name][3]])}, "
                    f"torch.load {secs([t for one in scenario_rounds for t in one[name][4]])}")

        loops: dict[int, dict[str, float]] = {}
        loop_rounds: dict[int, dict[str, list[float]]] = {}
        threads = torch.get_num_threads()
        for n in sorted({threads, max(1, threads - 1)}, reverse=True):
            torch.set_num_threads(n)  # fewer compute threads: the writer gets a core, as on a GPU node's host
            loops[n], loop_rounds[n] = training_loop(work, int(args.loop_gib * GIB), args.loop_steps, 3,
                                                     args.loop_rounds)
            loop = loops[n]
            say(f"  training loop, {n} compute thread(s) ({loop['size'] / GIB:.3f} GiB of model + Adam state, "
                f"{loop['step']:.3f} s a step without checkpoints): seconds added per save: " + ", ".join(
                    f"{name} {loop[name]:.3f}" for name in LOOP_MODES)
                + "; per round: " + "; ".join(f"{name} {secs(loop_rounds[n][name])}" for name in LOOP_MODES)
                + f"; saves coalesced (not written) per round of {args.loop_steps // 3}: save(guard=False) "
                f"{COALESCED.get(f'{n} False')}, save() (guarded) {COALESCED.get(f'{n} True')}; "
                "process CPU seconds added per save (medians): " + ", ".join(
                    f"{name} {cpu_added(n, name, args.loop_steps // 3):.3f}" for name in LOOP_MODES))
        torch.set_num_threads(threads)
        floor_hashed, floor_plain = write_floor(work, int(args.loop_gib * GIB), 5)
        say(f"  the floor: putting the loop's state into cached pages took {floor_hashed:.3f} CPU-seconds hashed "
            f"and written (as a steady guarded save does), {floor_plain:.3f} s written alone (medians of 5)")

        med = {name: statistics.median(values) for name, values in {**writes, **loads}.items()}
        med["copy_ into warm buffers"], med["full save (itself)"] = statistics.median(floor), 1.0
        gb, stall, first = size / 1e9, statistics.median(steady), statistics.median(s for s, _ in firsts)
        tput = statistics.median(f.bytes_total / (f.stall_seconds + f.write_seconds) for _, f in firsts) / 1e9
        rows: list[tuple[str, float, str, float, str]] = []  # metric, Sentinel, baseline, its value, target
        for name, target in (("torch.save", "≤ 0.1×"), ("dcp.save", "≤ 0.1×"), ("dcp.save no fsync", "≤ 0.1×"),
                             ("dcp.async_save stall", ""), ("copy_ into warm buffers", "")):
            rows.append(("save() stall, steady state (s)", stall, name, med[name], target))
        for n, loop in loops.items():
            for name, target in (("save() (guarded)", "≤ 0.2×"), ("save(guard=False)", "")):
                rows.append((f"loop, {n} thr: stall/save, {name}", loop[name], "torch.save in the loop",
                             loop["torch.save"], target))
            saves = args.loop_steps // 3
            rows.append((f"loop, {n} thr: CPU/save, save() (guarded)", cpu_added(n, "save() (guarded)", saves),
                         "torch.save in the loop", cpu_added(n, "torch.save", saves), ""))
        rows.append(("loop: floor, hash + write CPU (s)", floor_hashed, "torch.save in the loop",
                     loops[threads]["torch.save"], ""))
        rows += [("save() stall, first save (s)", first, "torch.save", med["torch.save"], ""),
                 ("save() stall, write in flight (s)", in_flight, "copy_ into warm buffers",
                  med["copy_ into warm buffers"], "")]
        for name, target in (("dcp.save", "≥ 1.0×"), ("dcp.save no fsync", "≥ 1.0×"), ("torch.save", ""), ("dd", ""),
                             ("dd fdatasync", "")):
            rows.append(("first full save throughput (GB/s)", tput, name, gb / med[name], target))
        rows.append(("warm full save throughput (GB/s)", warm, "dcp.save no fsync", gb / med["dcp.save no fsync"], ""))
        for (name, (res, *_)), target in zip(written.items(), ("≈ 1.0×", "≤ 0.15×", "≤ 0.05×", ""), strict=True):
            rows.append((f"written/total: {name}", res.bytes_written / res.bytes_total, "full save (itself)", 1.0,
                         target))
        rows.append(("restore, verified (s)", med["restore"], "torch.load", med["torch.load"], "≤ 1.0×"))
        rows.append(("restore, fresh process (s)", statistics.median(colds["restore"]), "torch.load, fresh process",
                     statistics.median(colds["torch.load"]), "≤ 1.0×"))
        for name in ("embed 1% random rows", "embed 1% contig. rows"):
            rows.append((f"restore, {name[6:]} (s)", statistics.median(one[name][1] for one in scenario_rounds),
                         "torch.load", statistics.median(one[name][2] for one in scenario_rounds), "≤ 1.0×"))
            rows.append((f"restore, {name[6:]}, fresh (s)",
                         statistics.median(t for one in scenario_rounds for t in one[name][3]),
                         "torch.load, fresh process",
                         statistics.median(t for one in scenario_rounds for t in one[name][4]),
                         "≤ 1.0×"))
        say("")
        say(f"{'metric':40} {'Sentinel':>9}  {'baseline':23} {'value':>8} {'ratio':>8}  {'target':7} met?")
        for metric, mine, name, theirs, target in rows:
            ratio = mine / theirs
            say(f"{metric:40} {mine:9.3f}  {name:23} {theirs:8.3f} {ratio:7.3f}×  {target:7} {verdict(ratio, target)}")
        say(f"(state {size / GIB:.3f} GiB; scenarios {scen_size / GIB:.3f} GiB each; medians of {r} rotated rounds; "
            "GB = 1e9 bytes; Sentinel's local tier does not fsync; page cache not dropped)")
        if args.record is not None:
            record(args, loops[threads], loop_rounds[threads], colds, size, threads, started_load)
        else:
            report_recorded(None, {})
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
