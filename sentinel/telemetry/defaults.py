"""Defaults for the wire models' list and dict fields.

A mutable default (`= []`, `= {}`) is deep-copied by pydantic for every instance that leaves the field out,
in Python: a report of 8 accelerators paid ~25 such copies, a fifth of its validation (docs/scaling.md). A
factory makes the empty value in C, and the schema still says what the default is.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field


def empty_list() -> Any:
    return Field(default_factory=list, json_schema_extra={"default": []})


def empty_dict() -> Any:
    return Field(default_factory=dict, json_schema_extra={"default": {}})
