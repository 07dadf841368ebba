"""A store's chunk index in memory: digest → (pack, offset, length), for 100,000s of chunks.

A table of embedding rows cut into 2 KiB chunks has 100,000s of them per GiB; one Python object per chunk
made loading the index and planning a restore cost more than reading the bytes. Here the dict maps a digest
to a row number (an int: no tuple per chunk for the cyclic garbage collector to walk), and the packs, offsets
and lengths live in numpy arrays, so a restore looks a tensor's chunks up in one vectorised pass.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class ChunkRef(NamedTuple):
    pack: str
    offset: int
    length: int


class ChunkIndex:
    """Where each chunk is. A digest indexed twice (two saves wrote it) keeps the place it was first given."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._rows: dict[str, int] = {}
        self._pack_names: list[str] = []
        self._pack_numbers: dict[str, int] = {}
        self._pack = np.empty(0, dtype=np.int32)
        self._offset = np.empty(0, dtype=np.int64)
        self._length = np.empty(0, dtype=np.int64)

    def __contains__(self, digest_hex: object) -> bool:
        return digest_hex in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, pack: str, digests: list[str], offsets: np.ndarray, lengths: np.ndarray) -> None:
        """One pack's chunks, in pack order (within it too, a duplicate keeps its first place)."""
        number = self._pack_numbers.get(pack)
        if number is None:
            number = self._pack_numbers[pack] = len(self._pack_names)
            self._pack_names.append(pack)
        start = len(self._offset)
        self._pack = np.concatenate([self._pack, np.full(len(digests), number, dtype=np.int32)])
        self._offset = np.concatenate([self._offset, np.asarray(offsets, dtype=np.int64)])
        self._length = np.concatenate([self._length, np.asarray(lengths, dtype=np.int64)])
        rows = range(start, start + len(digests))
        fresh = dict(zip(reversed(digests), reversed(rows), strict=True))
        if not self._rows:
            self._rows = fresh
        else:
            self._rows.update((d, fresh[d]) for d in fresh.keys() - self._rows.keys())

    def get(self, digest_hex: str) -> ChunkRef | None:
        row = self._rows.get(digest_hex)
        return None if row is None else self._ref(row)

    def _ref(self, row: int) -> ChunkRef:
        return ChunkRef(self._pack_names[int(self._pack[row])], int(self._offset[row]), int(self._length[row]))

    def locate(self, digests: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pack numbers, offsets, lengths) of these chunks, in their order; KeyError names one not indexed."""
        rows = np.fromiter(map(self._rows.__getitem__, digests), dtype=np.int64, count=len(digests))
        return self._pack[rows], self._offset[rows], self._length[rows]

    def pack_name(self, number: int) -> str:
        return self._pack_names[number]

    def refs(self) -> dict[str, ChunkRef]:
        return {d: self._ref(row) for d, row in self._rows.items()}

    def by_pack(self, packs: set[str]) -> dict[str, list[tuple[str, ChunkRef]]]:
        """Each of `packs` (and any other pack with indexed chunks) with the chunks indexed in it."""
        out: dict[str, list[tuple[str, ChunkRef]]] = {pack: [] for pack in packs}
        for d, row in self._rows.items():
            ref = self._ref(row)
            out.setdefault(ref.pack, []).append((d, ref))
        return out

    def forget(self, digests: list[str]) -> None:
        """Drop these digests; the arrays are compacted once most of their rows are unused."""
        for d in digests:
            self._rows.pop(d, None)
        if len(self._offset) > 2 * len(self._rows) + 4096:
            self._compact()

    def _compact(self) -> None:
        digests = list(self._rows)
        rows = np.fromiter(self._rows.values(), dtype=np.int64, count=len(digests))
        self._pack, self._offset, self._length = self._pack[rows], self._offset[rows], self._length[rows]
        self._rows = dict(zip(digests, range(len(digests)), strict=True))
