"""Hypothesis properties for the two parsers that take input from outside: node reports and the fault catalog.

Reports: any JSON either validates or raises pydantic's ValidationError; a valid report survives a JSON round
trip unchanged; NaN, infinities, negative and oversized numbers are refused with an error that names the field;
through the real HTTP endpoint a mutated report gets 200 or a 4xx, never a 5xx, and an accepted one is kept.
Catalog: every XID and event kind classifies to a known action, deterministically, and for any event; any
catalog document loads or raises CatalogError naming the bad entry; the built-in catalog round-trips.
SENTINEL_CATALOG_EXAMPLES sets how many mutated catalogs are tried (default 300).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import create_engine, func, select

from sentinel.app import create_app
from sentinel.config import Settings
from sentinel.detection.catalog import ACTIONS, LAYERS, SEVERITIES, CatalogError, FaultCatalog
from sentinel.telemetry.models import ReportReceipt
from sentinel.telemetry.schemas import (
    EVENT_KINDS,
    HardwareEvent,
    NodeRegistration,
    NodeReport,
    SdkBatch,
    TaskExit,
    TaskTelemetry,
)
from tests.conftest import FakeClock, bearer
from tests.factories import registration, report
from tests.fuzz.schema_strategies import ANY_JSON, from_model

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WIRE_MODELS = [NodeReport, NodeRegistration, SdkBatch]


# -- report parsing ------------------------------------------------------------------------------------------------
@FAST
@given(model=st.sampled_from(WIRE_MODELS), value=ANY_JSON)
def test_any_json_validates_or_raises_validation_error(model: type[Any], value: Any) -> None:
    with contextlib.suppress(ValidationError):
        model.model_validate_json(json.dumps(value))


@FAST
@given(model=st.sampled_from(WIRE_MODELS), raw=st.binary(max_size=256) | st.text(max_size=256).map(str.encode))
def test_any_bytes_validate_or_raise_validation_error(model: type[Any], raw: bytes) -> None:
    with contextlib.suppress(ValidationError):
        model.model_validate_json(raw)


def consistent_probes(doc: dict[str, Any]) -> dict[str, Any]:
    """The two cross-field rules of ProbeResult that a JSON schema cannot say: received ≤ sent, ended ≥ started."""
    for probe in doc.get("probes", []):
        probe["received"] = min(probe["received"], probe["sent"])
        probe["started_at"], probe["ended_at"] = sorted((probe["started_at"], probe["ended_at"]))
    return doc


@FAST
@given(doc=from_model(NodeReport).map(consistent_probes))
def test_a_valid_report_round_trips_unchanged(doc: dict[str, Any]) -> None:
    parsed = NodeReport.model_validate_json(json.dumps(doc))
    again = NodeReport.model_validate_json(parsed.model_dump_json())
    assert again == parsed
    assert again.model_dump_json() == parsed.model_dump_json()


@FAST
@given(doc=from_model(NodeRegistration))
def test_a_valid_registration_round_trips_unchanged(doc: dict[str, Any]) -> None:
    parsed = NodeRegistration.model_validate_json(json.dumps(doc))
    assert NodeRegistration.model_validate_json(parsed.model_dump_json()) == parsed


def _full_report() -> dict[str, Any]:
    """A report with every numeric field filled in, so each one can be broken in turn."""
    doc = report(events=[{"kind": "xid", "accelerator_uuid": "SIM-node-a-0", "xid": 79, "observed_at": 1.8e9,
                          "value": 0.5}])
    doc["host"] |= {"load1": 1.0, "disk_used_bytes": 1, "net_rx_bytes_total": 1, "task_memory": [
        {"pid": 10, "used_bytes": 1}]}
    doc["accelerators"][0] |= {"memory_peak_bytes": 1, "sm_clock_hz": 1e9, "ecc_corrected_total": 1,
                               "xid_errors_total": {"79": 1}}
    doc["tasks"] = [{"job_id": 1, "rank": 0, "pid": 10, "steps": 1, "last_step": 1, "first_step_at": 1.8e9,
                     "step_seconds": [0.5], "tokens": 1, "busy_seconds": 0.5, "collective_seconds": 0.1,
                     "exposed_collective_seconds": 0.1, "memory_peak_bytes": 1,
                     "collectives": {"all_reduce": {"count": 1, "seconds": 0.1, "bytes": 1}},
                     "model": {"flops_per_token": 1e9, "peak_flops_per_accelerator": 1e15}}]
    doc["task_exits"] = [{"job_id": 1, "rank": 0, "pid": 10, "exit_code": 1, "signal": 9, "observed_at": 1.8e9}]
    return doc


def _numeric_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numeric_paths(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _numeric_paths(v, (*path, i))]
    return [path] if isinstance(value, int | float) and not isinstance(value, bool) else []


NUMERIC_PATHS = _numeric_paths(_full_report())
BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, -1e-9, 1e300, 2**64]


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def test_the_full_report_is_valid() -> None:
    NodeReport.model_validate_json(json.dumps(_full_report()))
    assert len(NUMERIC_PATHS) > 40


@pytest.mark.parametrize("path", NUMERIC_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_nan_inf_negative_and_oversized_numbers_are_refused_naming_the_field(path: tuple[Any, ...]) -> None:
    """Every number a node sends is bounded on both sides: none is NaN, infinite, negative (except a
    temperature, which may be below zero but not below absolute zero) or astronomically large."""
    for bad in BAD_NUMBERS:
        if path[-1] == "temperature_celsius" and bad in (-1, -1e-9):
            bad = -300.0
        if path[-1] == "xid" and bad in (-1e-9,):
            bad = -2
        doc = _full_report()
        _set(doc, path, bad)
        body = json.dumps(doc)  # NaN and Infinity as JSON's non-standard literals, as a careless agent sends them
        with pytest.raises(ValidationError) as caught:
            NodeReport.model_validate_json(body)
        named = {str(part) for error in caught.value.errors() for part in error["loc"]}
        assert str(path[-1]) in named, (path, bad, caught.value.errors())


@FAST
@given(model=st.sampled_from([HardwareEvent, TaskExit, TaskTelemetry]), bad=st.sampled_from(["nan", "Infinity"]))
def test_nan_is_refused_in_every_float_field_of_the_event_models(model: type[Any], bad: str) -> None:
    for name, field in model.model_fields.items():
        if field.annotation is None or "float" not in str(field.annotation):
            continue
        base = json.loads(json.dumps(_minimal(model)))
        text = json.dumps(base)[:-1] + f', "{name}": {bad}}}' if base else f'{{"{name}": {bad}}}'
        with pytest.raises(ValidationError):
            model.model_validate_json(text)


def _minimal(model: type[Any]) -> dict[str, Any]:
    return {HardwareEvent: {"kind": "xid"}, TaskExit: {"pid": 1}, TaskTelemetry: {"job_id": 1, "rank": 0, "pid": 1}}[
        model]


# -- reports through the real endpoint -----------------------------------------------------------------------------
@pytest.fixture
def settings_for_fuzz(tmp_path: Path, database_url: str) -> Settings:
    """The shared test settings without the per-token rate limit: the fuzzer posts far faster than an agent."""
    return Settings(data_dir=tmp_path / "data", database_url=database_url, max_body_bytes=64 * 1024,
                    rate_limit_per_second=0)


@pytest.fixture
def fuzz_client(settings_for_fuzz: Settings, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for_fuzz, clock, run_scheduler=False)) as test_client:
        yield test_client


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        out += [p for k, v in value.items() for p in _paths(v, (*path, k))]
    elif isinstance(value, list):
        out += [p for i, v in enumerate(value) for p in _paths(v, (*path, i))]
    return out


@st.composite
def mutated_reports(draw: st.DrawFn, seq: int) -> dict[str, Any]:
    doc = _full_report()
    doc["seq"] = seq
    doc["events"][0]["kind"] = draw(st.sampled_from(EVENT_KINDS))
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(doc)[1:]
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "delete", "number"]))
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        if how == "delete":
            del parent[path[-1]]
        elif how == "number":
            parent[path[-1]] = draw(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2**70, 2**70))
        else:
            parent[path[-1]] = draw(ANY_JSON)
    return doc


def receipt_exists(database_url: str, seq: int) -> bool:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return bool(conn.scalar(select(func.count()).select_from(ReportReceipt).where(ReportReceipt.seq == seq)))
    finally:
        engine.dispose()


def test_mutated_reports_get_200_or_4xx_and_accepted_ones_are_kept(fuzz_client: TestClient,
                                                                   settings_for_fuzz: Settings,
                                                                   database_url: str) -> None:
    client = fuzz_client
    admin = bearer(settings_for_fuzz.admin_token_file.read_text().strip())
    created = client.post("/api/v1/tokens", json={"name": "fuzz-agent", "role": "agent"}, headers=admin)
    assert created.status_code == 201, created.text
    headers = {**bearer(created.json()["token"]), "content-type": "application/json"}
    assert client.post("/api/v1/nodes/register", json=registration("node-a"), headers=headers).status_code == 200
    seqs = itertools.count(1)
    seen: dict[int, int] = {}

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def post(data: st.DataObject) -> None:
        doc = data.draw(mutated_reports(next(seqs)))
        response = client.post("/api/v1/nodes/node-a/reports", content=json.dumps(doc), headers=headers)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code in (200, 400, 404, 409, 413, 422), (response.status_code, response.text, doc)
        if response.status_code == 200 and response.json()["status"] == "accepted":
            assert receipt_exists(database_url, response.json()["seq"]), doc

    post()
    assert seen.get(200, 0) > 0 and sum(v for k, v in seen.items() if k >= 400) > 0, seen


# -- the fault catalog ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalog() -> FaultCatalog:
    return FaultCatalog.load()


def _builtin() -> dict[str, Any]:
    return tomllib.loads(resources.files("sentinel.detection").joinpath("fault_catalog.toml").read_text())


def _known(entry: Any) -> None:
    assert entry.action in ACTIONS and entry.severity in SEVERITIES and entry.layer in LAYERS and entry.title


def test_every_xid_and_event_kind_classifies_to_a_known_action_deterministically(catalog: FaultCatalog) -> None:
    again = FaultCatalog.load()
    for xid in range(0, 256):
        event = HardwareEvent(kind="xid", xid=xid, observed_at=1.0)
        _known(catalog.lookup(event))
        assert catalog.lookup(event) == catalog.lookup(event) == again.lookup(event)
    for kind in EVENT_KINDS:
        event = HardwareEvent(kind=kind, observed_at=1.0)  # type: ignore[arg-type]
        _known(catalog.lookup(event))
        assert catalog.lookup(event) == again.lookup(event)


@FAST
@given(doc=from_model(HardwareEvent))
def test_classification_is_total_for_any_valid_event(catalog: FaultCatalog, doc: dict[str, Any]) -> None:
    event = HardwareEvent.model_validate_json(json.dumps(doc))
    entry = catalog.lookup(event)
    _known(entry)
    assert entry.headline(xid=event.xid, node="n", accelerator="a")
    assert entry.steps(xid=event.xid, node="n", accelerator="a") == entry.steps(xid=event.xid, node="n",
                                                                                accelerator="a")


TOML_VALUES = st.recursive(
    st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)


@st.composite
def mutated_catalogs(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The built-in catalog with one to three values replaced, deleted or added anywhere in it."""
    data = _builtin()
    touched = []
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)[1:]
        path = draw(st.sampled_from(paths))
        parent: Any = data
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "delete", "add"]))
        if how == "delete":
            del parent[path[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(TOML_VALUES)
        else:
            parent[path[-1]] = draw(TOML_VALUES)
        touched.append(path)
    return data, touched


def _locator(path: tuple[Any, ...]) -> str:
    """How a CatalogError names the entry a path is in."""
    if not path:
        return ""
    if path[0] == "xid" and len(path) > 1:
        return f"xid entry {path[1] + 1}"
    if path[0] == "event" and len(path) > 1:
        return f"event.{path[1]}"
    return str(path[0])


@settings(max_examples=int(os.environ.get("SENTINEL_CATALOG_EXAMPLES", "300")), deadline=None)
@given(mutated=mutated_catalogs())
def test_any_catalog_document_loads_or_names_the_bad_entry(mutated: tuple[dict[str, Any], list[Any]]) -> None:
    data, touched = mutated
    try:
        loaded = FaultCatalog.parse(copy.deepcopy(data), "fuzzed catalog")
    except CatalogError as exc:
        message = str(exc)
        assert message.startswith("fuzzed catalog"), message
        if len(touched) == 1:  # one change: the message points at it
            path = touched[0]
            names = {_locator(path), "unknown table"} | ({str(path[1])} if path[0] == "event" and len(path) > 1
                                                          else set())
            assert any(name in message for name in names), (message, touched)
    else:
        for code, entry in loaded.xids.items():
            assert isinstance(code, int) and not isinstance(code, bool) and code >= 0
            _known(entry)
        for entry in loaded.events.values():
            _known(entry)
        _known(loaded.default_xid)


@FAST
@given(data=st.dictionaries(st.text(max_size=10), TOML_VALUES, max_size=5))
def test_any_toml_table_loads_or_raises_catalog_error(data: dict[str, Any]) -> None:
    with contextlib.suppress(CatalogError):
        FaultCatalog.parse(data, "fuzzed catalog")


@FAST
@given(text=st.text(max_size=200))
def test_any_text_file_loads_or_raises_catalog_error(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("catalog") / "catalog.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(CatalogError):
        FaultCatalog.load(path)


def test_a_catalog_that_is_not_utf8_raises_catalog_error(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("catalog") / "catalog.toml"
    path.write_bytes(b"title = \"\xff\xfe\"\n")
    with pytest.raises(CatalogError, match="not UTF-8"):
        FaultCatalog.load(path)


def test_the_builtin_catalog_round_trips(catalog: FaultCatalog) -> None:
    assert FaultCatalog.parse(catalog.to_dict(), "round trip") == catalog
    assert FaultCatalog.parse(_builtin()) == catalog
