"""Fresh host memory for big tensors in transparent huge pages, on request (`SENTINEL_CHECKPOINT_HUGEPAGES=1`).

A restore reads a checkpoint into memory never touched before, and a save's first copy goes into fresh host
buffers: much of what either costs is page faults (each 4 KiB page zeroed and mapped on first touch). With
transparent huge pages in "madvise" mode (a common default), memory advised with MADV_HUGEPAGE before it is
touched faults in a huge page (2 MiB on x86-64) at a time.

Off by default, because what it gives depends on where the huge pages come from. On the 2-core Firecracker VMs
of 7 December, in a process that had just freed huge pages, reading 268 MB from cached pages into fresh memory
took 0.022 s instead of 0.106 s; but in a fresh process (a restart, the case a restore is for) touching 1 GiB
took 0.45-1.2 s with huge pages against 0.18-0.22 s without (the guest's never-used memory is faulted in by the
host), and a verified 1 GiB restore 0.63-1.4 s against 0.35 s. On hosts without that cost (bare metal), measure
before turning it on.

Best effort: not Linux, no libc, or THP "never", and the memory is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from typing import Any

log = logging.getLogger("sentinel.sdk.checkpoint")
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
MIN_BYTES = 8 << 20  # smaller buffers are not worth a system call (and may share their pages)
SIZE_FILE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"


@functools.cache
def _madvise() -> tuple[Any, int] | None:
    """libc's madvise and the huge page size, or None where advice is off or impossible."""
    if sys.platform != "linux" or os.environ.get("SENTINEL_CHECKPOINT_HUGEPAGES", "").strip().lower() not in (
            "1", "true", "yes", "on"):
        return None
    try:
        with open(SIZE_FILE) as f:
            size = int(f.read().strip())
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except (OSError, ValueError):  # no THP in this kernel, or no libc to call
        return None
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise, size


def advise(address: int, nbytes: int) -> bool:
    """Ask for huge pages across the huge-page-aligned part of [address, address + nbytes), which should not
    have been touched yet (pages already there stay as they are). True when the kernel took the advice."""
    if nbytes < MIN_BYTES:
        return False
    found = _madvise()
    if found is None:
        return False
    madvise, size = found
    start, end = -(-address // size) * size, (address + nbytes) // size * size
    if end - start < size:
        return False
    if madvise(start, end - start, MADV_HUGEPAGE) != 0:
        log.debug("madvise(MADV_HUGEPAGE) refused: errno %d", ctypes.get_errno())
        return False
    return True


def advise_tensor(value: Any) -> bool:
    """`advise` for a fresh torch tensor or numpy array in ordinary host memory (not pinned). Off (the default),
    it looks at nothing: on a GPU host `is_pinned()` may start the CUDA runtime."""
    if _madvise() is None:
        return False
    if hasattr(value, "data_ptr"):
        if value.device.type != "cpu" or value.is_pinned():
            return False
        return advise(value.data_ptr(), value.numel() * value.element_size())
    return advise(int(value.__array_interface__["data"][0]), int(value.nbytes))
