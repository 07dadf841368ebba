"""With SENTINEL_CHECKPOINT_HUGEPAGES=1, fresh restore targets and staging buffers ask for transparent huge pages
(sentinel.sdk.hugepages); by default they do not."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from sentinel.sdk import chunks, hugepages, saving

MIB = 1 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    try:
        return re.search(r"\[(\w+)\]", THP.read_text()).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return None


needs_thp = pytest.mark.skipif(thp_mode() not in ("madvise", "always"), reason="no transparent huge pages here")


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    hugepages._madvise.cache_clear()
    monkeypatch.setenv("SENTINEL_CHECKPOINT_HUGEPAGES", "1")
    yield
    hugepages._madvise.cache_clear()


def huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@needs_thp
def test_a_restore_target_is_faulted_in_huge_pages(asked: None) -> None:
    spec = chunks.TensorSpec(name="embedding.weight", dtype="torch.float32", shape=[64 * MIB // 512, 128],
                             nbytes=64 * MIB, chunk_bytes=2048)
    tensor, view = chunks.empty_like_spec(spec)
    np.asarray(view)[:] = 1  # the restore's reads touch it
    assert huge_kib(tensor.data_ptr() + 32 * MIB) >= 16 * 1024  # (the kernel may lack free huge pages for a few)


@needs_thp
def test_a_fresh_staging_buffer_is_faulted_in_huge_pages(asked: None) -> None:
    staging: dict[str, object] = {}
    buffer = saving.stage(staging, "w", torch.ones(16 * MIB))  # 64 MiB of float32
    assert huge_kib(buffer.data_ptr() + 32 * MIB) >= 16 * 1024


@needs_thp  # (without THP nothing is advised, small or not: the test would say nothing)
def test_small_buffers_are_left_alone(asked: None) -> None:
    assert not hugepages.advise_tensor(torch.empty(hugepages.MIN_BYTES // 4 - 1))


@pytest.mark.parametrize("value", [None, "0", "off"])
def test_without_the_setting_nothing_is_advised(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    hugepages._madvise.cache_clear()
    if value is None:
        monkeypatch.delenv("SENTINEL_CHECKPOINT_HUGEPAGES", raising=False)
    else:
        monkeypatch.setenv("SENTINEL_CHECKPOINT_HUGEPAGES", value)
    try:
        assert not hugepages.advise_tensor(np.empty(4 * hugepages.MIN_BYTES, dtype=np.uint8))
    finally:
        hugepages._madvise.cache_clear()


def test_without_the_setting_a_tensor_is_not_even_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    hugepages._madvise.cache_clear()
    monkeypatch.delenv("SENTINEL_CHECKPOINT_HUGEPAGES", raising=False)

    class Untouchable:  # is_pinned() may start the CUDA runtime on a GPU host: off, nothing is asked of a tensor
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"advise_tensor read .{name} with huge pages off")

    try:
        assert not hugepages.advise_tensor(Untouchable())
    finally:
        hugepages._madvise.cache_clear()
