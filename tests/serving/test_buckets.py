"""The shared latency buckets: a quantile read back is within one bucket (9%) of the true one, sums are exact,
an engine's Prometheus buckets map onto them without reading lower than the engine allows."""

from __future__ import annotations

import math
import random

import pytest

from sentinel.sdk import buckets


def test_every_value_lies_in_its_bucket():
    for x in (1e-5, 1e-4, 2e-4, 0.0123, 0.5, 1.0, 7.3, 3600.0):
        k = buckets.bucket(x)
        assert buckets.upper(k) >= x * (1 - 1e-9)
        assert k == 0 or buckets.upper(k - 1) < x
    assert buckets.bucket(float("nan")) == 0 and buckets.bucket(-1.0) == 0
    assert buckets.bucket(1e12) == buckets.MAX_BUCKET


def test_quantiles_are_within_nine_percent_of_the_exact_ones():
    rng = random.Random(7)
    values = [rng.lognormvariate(math.log(0.2), 0.6) for _ in range(20_000)]
    h: dict[int, int] = {}
    for v in values:
        h[buckets.bucket(v)] = h.get(buckets.bucket(v), 0) + 1
    values.sort()
    for q in (0.5, 0.95, 0.99):
        exact = values[int(q * len(values)) - 1]
        assert buckets.quantile(h, q) == pytest.approx(exact, rel=0.09), q
    assert buckets.quantile({}, 0.5) is None


def test_merging_adds_counts_and_share_at_most_counts_whole_buckets():
    a, b = {buckets.bucket(0.1): 3}, {buckets.bucket(0.1): 1, buckets.bucket(2.0): 4}
    merged = buckets.merge([a, b])
    assert buckets.count(merged) == 8 and merged[buckets.bucket(0.1)] == 4
    assert buckets.share_at_most(merged, 0.5) == 0.5
    assert buckets.share_at_most(merged, 0.05) == 0.0
    assert buckets.share_at_most({}, 1.0) is None


def test_an_engine_histogram_is_placed_at_its_upper_bounds():
    h = buckets.rebucket([(0.1, 5), (0.25, 0), (1.0, 2), (float("inf"), 1)])
    assert h == {buckets.bucket(0.1): 5, buckets.bucket(1.0): 2, buckets.MAX_BUCKET: 1}
    assert buckets.quantile(h, 0.5) <= 0.1 and buckets.quantile(h, 0.5) > 0.09


def test_the_wire_schema_names_exactly_the_bucket_indexes() -> None:
    import re

    from sentinel.telemetry.serving import BUCKET_KEY

    assert [i for i in range(1000) if re.fullmatch(BUCKET_KEY, str(i))] == list(range(buckets.MAX_BUCKET + 1))
    assert not re.fullmatch(BUCKET_KEY, "007")
