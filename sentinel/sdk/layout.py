"""Where a shard's bytes lie in one store: a hint written next to its manifest, so a restore reads without
loading the store's chunk index.

A manifest names chunks by digest and is the same for every tier; where those chunks are (pack, offset)
differs per store. Finding them through the index means loading every pack's index first: for a table of
embedding rows cut into 2 KiB chunks that is 100,000s of digests per GiB, and it cost a restore more than
reading the bytes. A layout (`rank-<rank>.layout` beside `rank-<rank>.json`) lists, per tensor, runs of
(pack, offset, position in the tensor, length) with consecutive chunks of one pack merged.

It is only a hint. It names the manifest it was made for (by digest), the bytes it leads to are verified
against the manifest's digests like any others, and a restore that finds it missing, stale or wrong reads
through the index instead. Garbage collection, which moves live chunks when it rewrites a pack, rewrites the
layouts that named it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sentinel.sdk import chunks

if TYPE_CHECKING:
    from sentinel.sdk.chunkindex import ChunkIndex
    from sentinel.sdk.stores import CheckpointStore

log = logging.getLogger("sentinel.sdk.checkpoint")
MAGIC = b"SNTLAY1\n"
RUN = np.dtype([("pack", "<i4"), ("offset", "<i8"), ("position", "<i8"), ("length", "<i8")])
MAX_HEADER = 64 << 20


@dataclass
class Extents:
    """One tensor's runs; `packs` holds numbers into `names`."""

    names: list[str]
    packs: np.ndarray
    offsets: np.ndarray
    positions: np.ndarray
    lengths: np.ndarray


def path(manifest: Path) -> Path:
    return manifest.with_suffix(".layout")


def build(index: ChunkIndex, manifest_digest: str, specs: list[chunks.TensorSpec]) -> bytes:
    """The layout of these tensors as `index` places their chunks (KeyError: a chunk it does not hold)."""
    names: dict[int, int] = {}  # the index's pack number → this layout's
    per_tensor: list[np.ndarray] = []
    for spec in specs:
        packs, offsets, lengths = index.locate(spec.chunks)
        if not len(lengths):
            per_tensor.append(np.empty(0, dtype=RUN))
            continue
        positions = np.cumsum(lengths) - lengths
        joined = (packs[1:] == packs[:-1]) & (offsets[1:] == offsets[:-1] + lengths[:-1])
        starts = np.flatnonzero(np.concatenate([[True], ~joined]))
        runs = np.empty(len(starts), dtype=RUN)
        for number in sorted(set(packs[starts].tolist())):  # (not np.unique: it imports numpy.ma, 10 ms)
            names.setdefault(number, len(names))
        runs["pack"] = [names[n] for n in packs[starts].tolist()]
        runs["offset"], runs["position"] = offsets[starts], positions[starts]
        runs["length"] = np.add.reduceat(lengths, starts)
        per_tensor.append(runs)
    header = json.dumps({"manifest": manifest_digest, "packs": [index.pack_name(n) for n in names],
                         "tensors": [[spec.name, spec.dtype, spec.shape, spec.nbytes, len(runs), unit_of(spec)]
                                     for spec, runs in zip(specs, per_tensor, strict=True)]}).encode()
    records = np.concatenate(per_tensor) if per_tensor else np.empty(0, dtype=RUN)
    return MAGIC + struct.pack("<I", len(header)) + header + records.tobytes()


def unit_of(spec: chunks.TensorSpec) -> int:
    """The bytes a restore verifies one digest at a time (0: one digest over all of them)."""
    units = spec.check_units()
    return units[0] if units is not None else 0


def write(store: CheckpointStore, manifest: Path, data: bytes) -> None:
    manifest.parent.mkdir(parents=True, exist_ok=True)
    store._write_atomic(path(manifest), data)


def write_for(store: CheckpointStore, manifest: Path, manifest_digest: str,
              specs: list[chunks.TensorSpec]) -> None:
    """Best effort: a save whose layout cannot be made or written is still a save (restore uses the index)."""
    try:
        write(store, manifest, build(store._index, manifest_digest, specs))
    except (KeyError, OSError) as exc:
        log.warning("checkpoint layout not written: manifest=%s error=%r; a restore of it reads through the "
                    "chunk index", manifest, exc)
        with contextlib.suppress(OSError):
            path(manifest).unlink()


def _header(data: bytes) -> tuple[dict[str, Any], int]:
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ValueError("not a layout")
    (size,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    if size > MAX_HEADER or start + size > len(data):
        raise ValueError("header out of bounds")
    return json.loads(data[start:start + size]), start + size


def read(manifest: Path) -> Layout | None:
    """The layout beside this manifest, or None when there is none or it is damaged. It may still be stale:
    `Layout.fits` says whether it was made for the manifest read."""
    try:
        data = path(manifest).read_bytes()
        header, end = _header(data)
        names = [str(n) for n in header["packs"]]
        tensors = [(str(name), str(dtype), [int(d) for d in shape], int(nbytes), int(count), int(unit))
                   for name, dtype, shape, nbytes, count, unit in header["tensors"]]
        if (len(data) - end) != sum(t[4] for t in tensors) * RUN.itemsize:
            raise ValueError("records and header disagree")
        records = np.frombuffer(data, dtype=RUN, offset=end)
        if len(records) and (records["pack"].min() < 0 or records["pack"].max() >= len(names)):
            raise ValueError("a run names no pack")
        out, at = [], 0
        for name, dtype, shape, nbytes, count, unit in tensors:
            runs = records[at:at + count]
            at += count
            if int(runs["length"].sum()) != nbytes or (len(runs) and (
                    runs["position"].min() < 0 or runs["offset"].min() < 0 or runs["length"].min() <= 0
                    or int((runs["position"] + runs["length"]).max()) > nbytes)):
                raise ValueError(f"the runs of {name} do not cover it")
            if unit < 0:
                raise ValueError(f"unit {unit}")
            spec = chunks.TensorSpec(name=name, dtype=dtype, shape=shape, nbytes=nbytes, chunk_bytes=unit)
            out.append((spec, Extents(names, runs["pack"], runs["offset"], runs["position"], runs["length"])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.info("checkpoint layout unusable: manifest=%s error=%r; reading through the chunk index",
                     manifest, exc)
        return None
    return Layout(str(header.get("manifest")), out)


@dataclass
class Layout:
    manifest_digest: str
    # specs with name, dtype, shape, nbytes and (as chunk_bytes) the bytes each digest checks; no digests
    tensors: list[tuple[chunks.TensorSpec, Extents]]

    def fits(self, manifest_digest: str, specs: list[chunks.TensorSpec]) -> bool:
        return manifest_digest == self.manifest_digest and len(specs) == len(self.tensors) and all(
            (s.name, s.dtype, s.shape, s.nbytes, unit_of(s)) == (t.name, t.dtype, t.shape, t.nbytes, t.chunk_bytes)
            for s, (t, _) in zip(specs, self.tensors, strict=True))


def packs_named(manifest: Path) -> list[str] | None:
    """The packs a layout names (None: no layout, or a damaged one)."""
    try:
        header, _ = _header(path(manifest).read_bytes())
        return [str(n) for n in header["packs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def repair(store: CheckpointStore) -> int:
    """After collection deleted or rewrote packs: rewrite each layout that names one that is gone (from its
    manifest and the index, which knows where the moved chunks are now), delete those whose manifest is gone.
    Runs under the store's exclusive lock. Returns the layouts rewritten."""
    rewritten = 0
    for layout_path in store.manifests.glob("job-*/step-*/rank-*.layout"):
        manifest = layout_path.with_suffix(".json")
        if not manifest.exists():  # its writer died between the two
            layout_path.unlink(missing_ok=True)
            continue
        named = packs_named(manifest)
        if named is not None and all(p in store._loaded for p in named):
            continue
        try:
            raw = manifest.read_bytes()
            specs = [chunks.TensorSpec.from_json(t) for t in json.loads(raw)["tensors"]]
        except (OSError, ValueError, KeyError, TypeError):
            layout_path.unlink(missing_ok=True)
            continue
        write_for(store, manifest, chunks.digest(raw), specs)
        rewritten += 1
    return rewritten
