"""Log-spaced latency buckets that the SDK, the agent, the engine adapters and the server all share.

A latency is counted in bucket k, whose upper bound is 0.1 ms × 2^(k/8): eight buckets per doubling, so a
quantile read from the buckets is within 9% of the true one (Prometheus' default buckets are far coarser).
Buckets add, which is what lets the agent sum an interval, the server sum a window and a job sum its
replicas. A histogram on the wire is sparse: {bucket: count}, for the buckets that were hit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

BASE_SECONDS = 1e-4
PER_DOUBLING = 8
MAX_BUCKET = 255  # 0.1 ms × 2^(255/8) ≈ 3.6 days: anything longer counts here


def bucket(seconds: float) -> int:
    """The bucket whose upper bound is the smallest one ≥ `seconds` (0 for anything ≤ 0.1 ms)."""
    if not seconds > BASE_SECONDS:  # NaN and negatives too
        return 0
    k = math.ceil(PER_DOUBLING * math.log2(seconds / BASE_SECONDS) - 1e-9)
    return min(max(k, 0), MAX_BUCKET)


def upper(k: int) -> float:
    """The upper bound of bucket k, in seconds."""
    return BASE_SECONDS * 2.0 ** (k / PER_DOUBLING)


def add(into: dict[int, int], other: Mapping[int, int]) -> dict[int, int]:
    for k, n in other.items():
        into[k] = into.get(k, 0) + n
    return into


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in histograms:
        add(out, h)
    return out


def count(histogram: Mapping[int, int]) -> int:
    return sum(histogram.values())


def quantile(histogram: Mapping[int, int], q: float) -> float | None:
    """The q-quantile, as the geometric middle of the bucket it falls in (None: nothing counted)."""
    total = count(histogram)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for k in sorted(histogram):
        seen += histogram[k]
        if seen >= rank and histogram[k] > 0:
            return upper(k) if k == 0 else math.sqrt(upper(k - 1) * upper(k))
    return upper(max(histogram))


def share_at_most(histogram: Mapping[int, int], limit: float) -> float | None:
    """The share of the counted values that are ≤ `limit` (a bucket counts when its upper bound is)."""
    total = count(histogram)
    if total <= 0:
        return None
    return sum(n for k, n in histogram.items() if upper(k) <= limit * (1 + 1e-9)) / total


def rebucket(bounds: Iterable[tuple[float, int]]) -> dict[int, int]:
    """A Prometheus histogram's per-bucket counts, [(le, count in (previous le, le])], onto these buckets.

    A count is placed at the bucket holding its `le` (its upper bound): a quantile read back is never lower
    than the engine's own buckets allow. The +Inf bucket goes to the top bucket."""
    out: dict[int, int] = {}
    for le, n in bounds:
        if n <= 0:
            continue
        k = MAX_BUCKET if math.isinf(le) else bucket(le)
        out[k] = out.get(k, 0) + n
    return out
