"""State dicts ↔ flat tensors ↔ content-addressed chunks.

A state (nested dicts, lists and tuples of torch tensors, numpy arrays and plain values) is flattened
into named tensors plus a JSON skeleton that rebuilds the nesting exactly (integer keys included, as in
an optimizer's state dict). Each tensor's bytes are cut into fixed-size chunks named by their xxh3-128
digest, so an unchanged chunk has the same name as last time and is not written again. Embedding-like
tensors are cut on row boundaries into small chunks: a sparse update then touches few chunks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from sentinel.sdk import hugepages

DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_ROW_CHUNK_BYTES = 2048
ROW_CHUNKED = ("embed",)  # tensors whose names contain these are chunked by rows


def digest(data: memoryview | bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


PACKED_ABOVE = 64  # a tensor of more chunks lists their digests in the manifest as one string
DIGEST_CHARS = 32


@dataclass
class TensorSpec:
    """One tensor of a shard: where its bytes live (chunk digests) and how to rebuild it.

    A manifest keeps the digests of a tensor of many chunks back to back in one string (`chunks_hex`): a
    table of embedding rows has 100,000s of them, and as a JSON list they cost a restore more to parse than
    the reads it starts before it parses them. They are split into `chunks` when first asked for."""

    name: str
    dtype: str  # "torch.bfloat16" or a numpy dtype string ("float32")
    shape: list[int]
    nbytes: int
    chunk_bytes: int
    digest: str | None = None  # of all its bytes (format 1, tensors cut into small chunks)
    segment_bytes: int = 0  # tensors cut into small chunks: digests of ~16 MiB segments, checked in parallel
    segments: list[str] = field(default_factory=list)
    packed: str | None = field(default=None, repr=False)  # the digests as a manifest stores many, not split yet
    _chunks: list[str] = field(default_factory=list, repr=False)

    @property
    def chunks(self) -> list[str]:
        packed = self.packed
        if packed is not None:
            self._chunks = [packed[i:i + DIGEST_CHARS] for i in range(0, len(packed), DIGEST_CHARS)]
            self.packed = None
        return self._chunks

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": self.shape, "nbytes": self.nbytes,
                               "chunk_bytes": self.chunk_bytes}
        if len(self.chunks) > PACKED_ABOVE:
            out["chunks_hex"] = "".join(self.chunks)
        else:
            out["chunks"] = self.chunks
        if self.segments:
            out |= {"segment_bytes": self.segment_bytes, "segments": self.segments}
        return out | {"digest": self.digest} if self.digest is not None else out

    def check_units(self) -> tuple[int, list[str]] | None:
        """(bytes, digests) of the pieces a restore verifies one by one: the segments, or the chunks of a tensor
        without a digest over all its bytes; None: that one digest."""
        if self.segments:
            return self.segment_bytes, self.segments
        return (self.chunk_bytes, self.chunks) if self.digest is None else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        spec = cls(name=str(data["name"]), dtype=str(data["dtype"]), shape=[int(x) for x in data["shape"]],
                   nbytes=int(data["nbytes"]), chunk_bytes=int(data["chunk_bytes"]),
                   digest=str(data["digest"]) if data.get("digest") is not None else None)
        if data.get("segments") is not None:
            spec.segment_bytes, spec.segments = int(data["segment_bytes"]), _digests(data["segments"])
            if spec.segment_bytes <= 0:
                raise ValueError(f"segment_bytes {spec.segment_bytes}")
        if "chunks_hex" in data:
            spec.packed = _packed(data["chunks_hex"])
        else:
            spec._chunks = _digests(data["chunks"])
        return spec


def manifest_digests(tensor: dict[str, Any]) -> list[str]:
    """The chunk digests of one tensor of a parsed manifest, in either form."""
    return TensorSpec(name="", dtype="", shape=[], nbytes=0, chunk_bytes=0,
                      packed=_packed(tensor["chunks_hex"])).chunks if "chunks_hex" in tensor else _digests(
                          tensor["chunks"])


def _packed(value: Any) -> str:
    if not isinstance(value, str) or len(value) % DIGEST_CHARS:
        raise TypeError(f"chunks_hex is not a string of {DIGEST_CHARS}-character digests")
    return value


def _digests(value: Any) -> list[str]:
    """A manifest's list of chunk digests, as parsed (a digest that is not a string matches no chunk)."""
    if not isinstance(value, list):
        raise TypeError(f"chunks is {type(value).__name__}, not a list")
    return value


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(value: Any) -> bool:
    torch = _torch()
    return isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor))


def flatten(state: Any) -> tuple[Any, dict[str, Any]]:
    """(skeleton, {name: tensor}); the skeleton is JSON with {"__tensor__": name} where tensors were."""
    tensors: dict[str, Any] = {}

    def walk(value: Any, path: str) -> Any:
        if is_tensor(value):
            tensors[path] = value
            return {"__tensor__": path}
        if isinstance(value, dict):
            return {"__dict__": [[k, walk(v, f"{path}.{k}" if path else str(k))] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"__tuple__": [walk(v, f"{path}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"cannot checkpoint {path or 'the state'}: {type(value).__name__} is not a tensor, "
                        "an array, a container or a plain value")

    return walk(state, ""), tensors


def unflatten(skeleton: Any, tensors: dict[str, Any]) -> Any:
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__dict__" in skeleton:
            return {k: unflatten(v, tensors) for k, v in skeleton["__dict__"]}
        if "__tuple__" in skeleton:
            return tuple(unflatten(v, tensors) for v in skeleton["__tuple__"])
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    return skeleton


def dtype_name(value: Any) -> str:
    return value.dtype.str if isinstance(value, np.ndarray) else str(value.dtype)


def chunk_bytes_for(name: str, shape: tuple[int, ...] | list[int], itemsize: int, *,
                    chunk_bytes: int = DEFAULT_CHUNK_BYTES, row_chunk_bytes: int = DEFAULT_ROW_CHUNK_BYTES,
                    row_chunked: tuple[str, ...] = ROW_CHUNKED) -> int:
    """Fixed-size chunks, or whole rows (≥ row_chunk_bytes) for embedding-like tables."""
    if len(shape) >= 2 and any(p in name for p in row_chunked):
        row = itemsize
        for dim in shape[1:]:
            row *= int(dim)
        if row > 0:
            return max(1, row_chunk_bytes // row) * row
    return chunk_bytes


def cut(data: memoryview, size: int) -> Iterator[memoryview]:
    for offset in range(0, len(data), size):
        yield data[offset:offset + size]


def empty_like_spec(spec: TensorSpec) -> tuple[Any, memoryview]:
    """A fresh tensor (torch if the spec was torch, else numpy) and a writable byte view of it."""
    if spec.dtype.startswith("torch."):
        torch = _torch()
        if torch is None:
            import torch
        dtype = getattr(torch, spec.dtype.removeprefix("torch."))
        tensor = torch.empty(spec.shape, dtype=dtype)
        hugepages.advise_tensor(tensor)  # untouched yet (huge pages only on request: sentinel.sdk.hugepages)
        return tensor, memoryview(tensor.view(-1).view(torch.uint8).numpy()) if spec.nbytes else memoryview(b"")
    array = np.empty(spec.shape, dtype=np.dtype(spec.dtype))
    hugepages.advise_tensor(array)
    return array, array.reshape(-1).view(np.uint8).data
