"""Schemathesis against a real `sentinel server`: every operation in its OpenAPI schema, valid and invalid input,
with an admin token, and again (valid input only) with a viewer token, so the 403 paths run too.

Checks on every response: no 5xx, the status is documented, the body matches the documented schema and content
type. Path parameters are half the time replaced by ids of seeded rows (a node with accelerators, a job, a
checkpoint, a silence), so the fuzzer reaches past the 404s.

Examples per operation: SENTINEL_FUZZ_EXAMPLES (default 25, in each of the positive and negative modes).
Every test runs against a server on SQLite and one on PostgreSQL.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import Case, GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import create_engine, text  # noqa: E402

from tests.conftest import PG_ADMIN_URL, _postgres_available, fresh_postgres_database  # noqa: E402
from tests.live import LiveServer  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SENTINEL_FUZZ_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Long-polls (`wait=` up to 60 s) are valid and do block: the fuzzer asks for at most a tenth of a second.
MAX_WAIT_SECONDS = 0.1
SACRIFICIAL_TOKENS = 5


@dataclass
class Seeded:
    admin: str
    viewer: str
    path_values: dict[str, list[Any]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    token_names: list[str] = field(default_factory=list)


@dataclass
class Fuzzed:
    server: LiveServer
    schema: Any
    seeded: Seeded


def _seed(server: LiveServer, database_url: str) -> Seeded:
    admin = server.admin_token
    names = [f"fuzz-victim-{i}" for i in range(SACRIFICIAL_TOKENS)]
    with server.api() as api:
        for name in ["fuzz-viewer", *names]:
            created = api.post("/tokens", json={"name": name, "role": "viewer"})
            assert created.status_code == 201, created.text
            if name == "fuzz-viewer":
                viewer = created.json()["token"]
        uuids = [f"GPU-fuzz-{i}" for i in range(4)]
        reg = api.post("/nodes/register", json={
            "name": "fuzz-node", "hostname": "fuzz", "sources": ["sim"], "labels": {"rack": "r1"},
            "accelerators": [{"uuid": u, "index": i, "model": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 << 30,
                              "source": "sim", "simulated": True} for i, u in enumerate(uuids)]})
        assert reg.status_code == 200, reg.text
        job = api.post("/jobs", json={"name": "fuzz-job", "world_size": 2})
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        task = api.post(f"/jobs/{job_id}/tasks", json={"rank": 0, "node": "fuzz-node", "accelerators": uuids[:1]})
        assert task.status_code == 201, task.text
        ckpt = api.post(f"/jobs/{job_id}/checkpoints", json={"step": 10})
        assert ckpt.status_code == 201, ckpt.text
        silence = api.post("/silences", json={"matchers": [{"name": "node", "value": "fuzz-node"}],
                                              "duration_seconds": 3600, "comment": "fuzz"})
        assert silence.status_code == 201, silence.text
    engine = create_engine(database_url)
    with engine.connect() as conn:
        ids = [i for (i,) in conn.execute(text("SELECT id FROM api_tokens WHERE name LIKE 'fuzz-victim-%'"))]
    engine.dispose()
    return Seeded(admin=admin, viewer=viewer, token_ids=ids, token_names=names, path_values={
        "node": ["fuzz-node"], "uuid": uuids, "job_id": [job_id], "step": [10], "rank": [0, 1],
        "silence_id": [silence.json()["id"]], "incident_id": [1], "order_id": ["0"]})


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server on SQLite, then one on a fresh PostgreSQL database (NUL bytes, 32-bit ids: they differ)."""
    if request.param == "postgresql":
        problem = _postgres_available()
        if problem is not None:
            pytest.skip(f"PostgreSQL not reachable: {problem}")
        yield from fresh_postgres_database(PG_ADMIN_URL)
    else:
        yield f"sqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'sentinel.db'}"


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, database: str) -> Iterator[Fuzzed]:
    data = tmp_path_factory.mktemp("fuzz")
    server = LiveServer(data, database, {"SENTINEL_RATE_LIMIT_PER_SECOND": "0"}).start()
    try:
        seeded = _seed(server, database)
        raw = httpx.get(server.url + "/openapi.json", timeout=30).json()
        # Unknown query parameters are ignored, as by most HTTP APIs; not counted as invalid input.
        config = schemathesis.Config.from_dict({"generation": {"allow-extra-parameters": False}})
        schema = schemathesis.openapi.from_dict(raw, config=config)
        yield Fuzzed(server, schema, seeded)
    finally:
        server.stop()
    log = (data / "server.log").read_text(errors="replace")
    assert "unhandled error" not in log, log[-5000:]


def _with_real_rows(case: Case, seeded: Seeded, draw: st.DataObject, negative: bool) -> Case:
    """Half the time a path parameter names a seeded row (positive cases only: a negative case keeps the invalid
    value it was made for). A token path never names a token other than the sacrificial ones, in either mode:
    revoking the fuzzer's own admin token mid-run would turn the rest of the run into 401s."""
    path = case.operation.path
    for name, value in list(case.path_parameters.items()):
        if path.startswith("/api/v1/tokens/"):
            if isinstance(value, int) and not isinstance(value, bool):
                case.path_parameters[name] = draw.draw(st.sampled_from(seeded.token_ids))
            elif not negative:
                case.path_parameters[name] = draw.draw(st.sampled_from(seeded.token_names))
        elif negative:
            continue
        elif name in seeded.path_values and draw.draw(st.booleans()):
            case.path_parameters[name] = draw.draw(st.sampled_from(seeded.path_values[name]))
    if not negative and isinstance(case.query, dict) and isinstance(case.query.get("wait"), int | float):
        case.query["wait"] = min(case.query["wait"], MAX_WAIT_SECONDS)
    return case


def _run_operation(fuzzed: Fuzzed, operation: Any, token: str, mode: GenerationMode) -> None:
    base_url = fuzzed.server.url
    headers = {"Authorization": f"Bearer {token}"}
    checks = [*CHECKS, negative_data_rejection] if mode is GenerationMode.NEGATIVE else list(CHECKS)

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Case, data: st.DataObject) -> None:
        case = _with_real_rows(case, fuzzed.seeded, data, negative=mode is GenerationMode.NEGATIVE)
        response = _send(client, case, base_url, headers)
        case.validate_response(response, checks=checks, headers=headers)

    with httpx.Client(timeout=30) as client:
        run()


def _send(client: httpx.Client, case: Case, base_url: str, headers: dict[str, str]) -> httpx.Response:
    """Send with httpx: `case.call` uses `requests`, which the `urllib3-future` that grafana-client brings in
    (through niquests) breaks when both are installed."""
    kwargs = case.as_transport_kwargs(base_url=base_url, headers=headers)
    body: dict[str, Any] = {}
    if "json" in kwargs:
        body["json"] = kwargs["json"]
    elif isinstance(kwargs.get("data"), bytes | str):
        body["content"] = kwargs["data"]
    elif kwargs.get("data") is not None:
        body["data"] = kwargs["data"]
    if kwargs.get("files"):
        body["files"] = kwargs["files"]
    return client.request(kwargs["method"], kwargs["url"], headers=kwargs.get("headers"), params=kwargs.get("params"),
                          **body)


def _operations(fuzzed: Fuzzed, methods: set[str] | None = None) -> list[Any]:
    found = []
    for result in fuzzed.schema.get_all_operations():
        operation = result.ok()
        if methods is None or operation.method.upper() in methods:
            found.append(operation)
    return found


def _fuzz(fuzzed: Fuzzed, token: str, methods: set[str] | None, modes: list[GenerationMode]) -> None:
    failures: list[str] = []
    operations = _operations(fuzzed, methods)
    assert operations, "the schema lists no operations"
    for operation in operations:
        for mode in modes:
            try:
                _run_operation(fuzzed, operation, token, mode)
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise
                # nothing in the operation can be made invalid (no parameters, no body constraints to break)
            except (Exception, BaseExceptionGroup) as exc:  # collect them all: one report for the whole API
                detail = str(exc) if type(exc).__name__ == "FailureGroup" else traceback.format_exc()[-3000:]
                failures.append(f"=== {operation.method.upper()} {operation.path} ({mode.value})\n{detail}")
    assert not failures, f"{len(failures)} failing operation(s):\n\n" + "\n\n".join(failures)


def test_every_operation_as_admin(fuzzed: Fuzzed) -> None:
    _fuzz(fuzzed, fuzzed.seeded.admin, None, [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    still = httpx.get(fuzzed.server.url + "/api/v1/breaker", timeout=10,
                      headers={"Authorization": f"Bearer {fuzzed.seeded.admin}"})
    assert still.status_code == 200, "the fuzzer's own admin token stopped working mid-run"


def test_every_operation_as_viewer(fuzzed: Fuzzed) -> None:
    """Reads answer as for the admin; every write, and the agent- and admin-only reads, answer a documented 403."""
    _fuzz(fuzzed, fuzzed.seeded.viewer, None, [GenerationMode.POSITIVE])


def test_schema_documents_the_edge_errors(fuzzed: Fuzzed) -> None:
    """Every authenticated operation documents 401/403, every body 400/413/422, all as `ErrorOut`."""
    raw = fuzzed.schema.raw_schema
    for path, operations in raw["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            if path.startswith("/api/v1/"):
                assert {"401", "403"} <= responses.keys(), (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "422"} <= responses.keys(), (method, path)
            for status, response in responses.items():
                if status.startswith("4"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/ErrorOut", (method, path, status)


def test_oversized_body_is_413_not_5xx(fuzzed: Fuzzed, tmp_path: Path) -> None:
    body = b'{"name": "' + b"x" * (2 << 20) + b'"}'
    response = httpx.post(fuzzed.server.url + "/api/v1/jobs", content=body, timeout=30,
                          headers={"Authorization": f"Bearer {fuzzed.seeded.admin}",
                                   "Content-Type": "application/json"})
    assert response.status_code == 413
