"""Hypothesis strategies built from a pydantic model's own JSON schema: valid documents follow its constraints.

Covers the JSON-schema subset pydantic writes for the wire models: objects (properties, required,
additionalProperties, a single patternProperties), arrays and tuples (prefixItems), strings (pattern, lengths),
numbers and integers (bounds, exclusive bounds), booleans, null, enum/const, anyOf and $ref.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

MAX_ITEMS = 3  # lists and maps stay short: the constraints matter, not the volume
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def from_model(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    schema = model.model_json_schema()
    return _strategy(schema, schema.get("$defs", {}))


def _strategy(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        return st.deferred(lambda: _strategy(defs[schema["$ref"].rsplit("/", 1)[-1]], defs))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([_strategy(s, defs) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, defs)
    if kind == "array":
        if "prefixItems" in schema:
            return st.tuples(*(_strategy(s, defs) for s in schema["prefixItems"])).map(list)
        return st.lists(_strategy(schema.get("items", {}), defs), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return st.integers(min_value=_bound(schema, "minimum", "exclusiveMinimum", 1),
                           max_value=_bound(schema, "maximum", "exclusiveMaximum", -1))
    if kind == "number":
        low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum",
                                                                                        schema.get("exclusiveMaximum"))
        return st.floats(min_value=low, max_value=high, exclude_min="exclusiveMinimum" in schema,
                         exclude_max="exclusiveMaximum" in schema, allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return ANY_JSON  # `Any`: no constraint


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, step: int) -> int | None:
    if inclusive in schema:
        return math.ceil(schema[inclusive]) if step > 0 else math.floor(schema[inclusive])
    if exclusive in schema:
        return math.floor(schema[exclusive]) + 1 if step > 0 else math.ceil(schema[exclusive]) - 1
    return None


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = schema.get("minLength", 0), min(schema.get("maxLength", 24), 24)
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= schema.get(
            "maxLength", 10**9))
    return st.text(min_size=low, max_size=max(low, high))


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties")
    if properties is None:
        values = schema.get("additionalProperties", {})
        names = dict(schema.get("propertyNames", {"type": "string"}))
        patterns = schema.get("patternProperties", {})
        if len(patterns) == 1:  # dict[ConstrainedKey, V]: keys match the pattern, values follow its schema
            (pattern, values), = patterns.items()
            names["pattern"] = pattern
        keys = st.sampled_from(names["enum"]) if "enum" in names else _string(names)  # dict[Literal, V]
        return st.dictionaries(keys, _strategy(values if isinstance(values, dict) else {}, defs),
                               max_size=min(schema.get("maxProperties", MAX_ITEMS), MAX_ITEMS))
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {name: _strategy(sub, defs) for name, sub in properties.items() if name in required},
        optional={name: _strategy(sub, defs) for name, sub in properties.items() if name not in required})
