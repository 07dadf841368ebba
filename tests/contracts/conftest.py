"""Shared contract suites: one per role (STYLE.md), run against every real implementation of that role.

Each suite parametrises its tests over the role's registry with `implementations(...)`, so a new
implementation gets the whole suite by registering, and pytest's ids say how many there are
(`test_x[sim-2of3]`: the second of three registered implementations).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def implementations(names: Iterable[str], marks: dict[str, list[pytest.MarkDecorator]] | None = None
                    ) -> list[pytest.ParameterSet]:
    """One pytest param per implementation name, with ids `<name>-<i>of<n>`; `marks` adds marks by name
    (e.g. skip nvml without a GPU, postgres for the PostgreSQL one)."""
    ordered = sorted(names)
    total = len(ordered)
    return [pytest.param(name, id=f"{name}-{i}of{total}", marks=(marks or {}).get(name, []))
            for i, name in enumerate(ordered, start=1)]
