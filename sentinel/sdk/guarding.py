"""The overlapped snapshot's safety: which tensors may be copied after save() returns, and a check that they were
not changed before they were.

With guard=True (the default) every torch optimizer seen stepping is guarded through a global step pre-hook
(`watch_optimizers`): its parameters and state are copied on the stage thread while the next forward and
backward run, and its next step() waits for that copy. Anything else that changes them in place in between
moves their version counters, and `check_versions` then fails that save rather than write a torn checkpoint.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from sentinel.sdk import chunks

if TYPE_CHECKING:
    from sentinel.sdk import saving
    from sentinel.sdk.checkpoint import CheckpointManager

log = logging.getLogger("sentinel.sdk.checkpoint")


def watch_optimizers(m: CheckpointManager) -> None:
    """With guard=True and torch imported, every optimizer that steps is guarded from its first step on."""
    if not m.auto_guard or m._global_hook is not None or sys.modules.get("torch") is None:
        return
    hooks = importlib.import_module("torch.optim.optimizer")  # torch is imported already: this costs nothing
    register = getattr(hooks, "register_optimizer_step_pre_hook", None)
    if register is None:  # a torch too old for global step hooks: guard() still works
        return
    manager = weakref.ref(m)

    def seen(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        live = manager()
        if live is not None:
            live._seen.add(optimizer)
            live.wait_snapshot()

    m._global_hook = register(seen)


def guarded_storage(m: CheckpointManager) -> set[int]:
    """Where the tensors of the guarded optimizers live (their parameters and state)."""
    owned: set[int] = set()
    for optimizer in [*m._guarded, *m._seen]:
        owned.update(p.data_ptr() for group in optimizer.param_groups for p in group["params"] if p.numel())
        for per_param in optimizer.state.values():
            owned.update(v.data_ptr() for v in per_param.values() if chunks.is_tensor(v) and v.numel())
    return owned


def check_versions(m: CheckpointManager, job: saving.Job) -> None:
    """A guarded tensor changed in place before it was copied (not by an optimizer step, which waits): the
    copy may be torn, so this save fails, and from now on the whole snapshot is copied before save returns."""
    changed = [name for name, value in job.later.items() if value._version != job.versions[name]]
    if not changed:
        return
    m.overlap_disabled = (f"step {job.step}: {', '.join(changed[:3])}{' …' if len(changed) > 3 else ''} "
                          "changed in place between save() and the next optimizer step")
    m.errors += 1
    log.error("checkpoint save dropped: job=%d rank=%d step=%d reason=%s; later saves copy everything before "
              "save() returns (pass guard=False to say so up front)", m.job_id, m.rank, job.step,
              m.overlap_disabled)
    from sentinel.sdk.checkpoint import CheckpointError

    raise CheckpointError(f"checkpoint step {job.step} rank {m.rank} not written: {m.overlap_disabled}, "
                          "so its copy may mix two states; earlier checkpoints are untouched")


def storage(value: Any) -> int:
    """Where a tensor's data lives (0 for arrays and empty tensors: never guarded)."""
    return int(value.data_ptr()) if not isinstance(value, np.ndarray) and value.numel() else 0


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in ("0", "false", "no", "off")
