"""The MCP server for AI infrastructure agents (DESIGN §7: `sentinel mcp`, `sentinel mcp --http HOST:PORT`).

Every tool is a call to Sentinel's REST API with the caller's own token, so an agent can do exactly what that
token's role may do over REST: the same role checks, audit entries, circuit breaker and input validation
(sentinel/auth, sentinel/audit, sentinel/remediation/breaker.py). On stdio the token is the server process's
(`SENTINEL_TOKEN`); on Streamable HTTP it is each request's `Authorization: Bearer …` header, and a request
without one is refused. Refusals and bad arguments come back as tool errors (`is_error`), never a crash.
Tool argument and result schemas are generated from the pydantic models the REST API itself uses.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Annotated, Any, Literal

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from sentinel.alerting.schemas import Matcher, SilenceCreate, SilenceOut
from sentinel.auth.tls import client_ssl_context
from sentinel.checkpoints.schemas import RecoveryPlan
from sentinel.diagnosis.schemas import DiagnosisOut, ExperimentOut, ExperimentRequest, RankRow, TimelinePoint
from sentinel.incidents.schemas import IncidentList, IncidentOut
from sentinel.mcp.schemas import FleetHealth, IncidentEvidence, fleet_health_of
from sentinel.nodes.schemas import CordonRequest, NodeDetail

log = logging.getLogger("sentinel.mcp")

JobId = Annotated[int, Field(ge=1, le=2**31 - 1, description="the job's id")]
IncidentId = Annotated[int, Field(ge=1, le=2**63 - 1, description="the incident's id")]
NodeName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
TokenOf = Callable[[Context | None], str | None]
READ_ONLY = ToolAnnotations(read_only_hint=True)
IncidentState = Literal["active", "open", "acknowledged", "resolved", "all"]


class Api:
    """Sentinel's REST API as the tools call it: errors become tool errors that say what REST said."""

    def __init__(self, base_url: str, token_of: TokenOf, verify: bool | ssl.SSLContext | None = None,
                 timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.token_of = token_of
        self.verify = verify if verify is not None else client_ssl_context()
        self.timeout = timeout

    async def call(self, ctx: Context | None, method: str, path: str, *, body: Any = None,
                   params: dict[str, Any] | None = None) -> Any:
        token = self.token_of(ctx)
        if not token:
            raise ToolError("no Sentinel token: give one (Authorization: Bearer <token> over HTTP, SENTINEL_TOKEN on "
                            "stdio)")
        try:
            async with httpx.AsyncClient(base_url=self.base_url, verify=self.verify, timeout=self.timeout) as client:
                response = await client.request(method, f"/api/v1{path}", json=body, params=params,
                                                headers={"authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            raise ToolError(f"Sentinel at {self.base_url} is unreachable: {exc}") from exc
        if response.status_code >= 400:
            raise ToolError(f"Sentinel refused {method} {path}: {response.status_code} {_detail(response)}")
        return response.json()


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:500]
    return str(detail)[:1000]


def build(api: Api) -> MCPServer:
    server = MCPServer(name="sentinel", title="Sentinel",
                       instructions="Sentinel watches accelerator clusters. Start from fleet_health or "
                                    "list_incidents; for a slow job, job_diagnosis names the layer and proposes an "
                                    "experiment: run it with run_experiment (it waits for the result) to confirm.")

    @server.tool(annotations=READ_ONLY,
                 description="Nodes by state, accelerators by health, open incidents by severity, the breaker.")
    async def fleet_health(ctx: Context) -> FleetHealth:
        nodes, accelerators, incidents, breaker = await asyncio.gather(
            api.call(ctx, "GET", "/nodes"), api.call(ctx, "GET", "/accelerators"),
            api.call(ctx, "GET", "/incidents", params={"state": "active", "limit": 500}),
            api.call(ctx, "GET", "/breaker"))
        return fleet_health_of(nodes, accelerators, incidents, breaker)

    @server.tool(annotations=READ_ONLY,
                 description="Incidents, newest first: state active|open|acknowledged|resolved|all; optional job.")
    async def list_incidents(ctx: Context, state: IncidentState = "active",
                             job_id: JobId | None = None,
                             limit: Annotated[int, Field(ge=1, le=200)] = 20) -> IncidentList:
        params: dict[str, Any] = {"state": state, "limit": limit}
        if job_id is not None:
            params["job"] = job_id
        return IncidentList.model_validate(await api.call(ctx, "GET", "/incidents", params=params))

    @server.tool(annotations=READ_ONLY,
                 description="One incident with its evidence: what was seen, compared with what, what was done.")
    async def get_incident(ctx: Context, incident_id: IncidentId) -> IncidentEvidence:
        return IncidentEvidence.model_validate(await api.call(ctx, "GET", f"/incidents/{incident_id}"))

    @server.tool(annotations=READ_ONLY,
                 description="Which layer a job's slowdown comes from: component, evidence, what was ruled out, "
                             "and the experiment proposed to confirm it.")
    async def job_diagnosis(ctx: Context, job_id: JobId) -> DiagnosisOut:
        return DiagnosisOut.model_validate(await api.call(ctx, "GET", f"/jobs/{job_id}/diagnosis"))

    @server.tool(annotations=READ_ONLY,
                 description="A job's execution timeline: wall time per step and its components, per bucket.")
    async def job_timeline(ctx: Context, job_id: JobId, seconds: Annotated[float, Field(gt=0, le=3600)] = 300.0,
                           bucket: Annotated[float, Field(ge=1, le=600)] = 10.0) -> list[TimelinePoint]:
        raw = await api.call(ctx, "GET", f"/jobs/{job_id}/timeline", params={"seconds": seconds, "bucket": bucket})
        return [TimelinePoint.model_validate(p) for p in raw]

    @server.tool(annotations=READ_ONLY,
                 description="A job's ranks side by side: each step component now and at baseline, CPU wait.")
    async def compare_ranks(ctx: Context, job_id: JobId,
                            seconds: Annotated[float, Field(gt=0, le=600)] = 10.0) -> list[RankRow]:
        raw = await api.call(ctx, "GET", f"/jobs/{job_id}/ranks", params={"seconds": seconds})
        return [RankRow.model_validate(r) for r in raw]

    @server.tool(annotations=READ_ONLY,
                 description="Where a job would resume from: the newest checkpoint every rank committed.")
    async def recovery_plan(ctx: Context, job_id: JobId) -> RecoveryPlan:
        return RecoveryPlan.model_validate(await api.call(ctx, "GET", f"/jobs/{job_id}/recovery-plan"))

    _action_tools(server, api)
    return server


def _action_tools(server: MCPServer, api: Api) -> None:
    @server.tool(description="Run an experiment for a job (the diagnosis's proposal when no kind is given) and wait "
                             "up to wait_seconds for its result and verdict. Needs an operator token.")
    async def run_experiment(ctx: Context, job_id: JobId, request: ExperimentRequest | None = None,
                             wait_seconds: Annotated[float, Field(ge=0, le=120)] = 60.0) -> ExperimentOut:
        body = (request or ExperimentRequest()).model_dump(exclude_none=True)
        out = ExperimentOut.model_validate(await api.call(ctx, "POST", f"/jobs/{job_id}/experiments", body=body))
        deadline = asyncio.get_running_loop().time() + wait_seconds
        while out.state == "pending" and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)
            out = ExperimentOut.model_validate(await api.call(ctx, "GET", f"/jobs/{job_id}/experiments/{out.id}"))
        return out

    @server.tool(description="An experiment's current state and result.", annotations=READ_ONLY)
    async def get_experiment(ctx: Context, job_id: JobId,
                             experiment_id: Annotated[str, Field(pattern=r"^exp-[0-9]+$")]) -> ExperimentOut:
        return ExperimentOut.model_validate(await api.call(ctx, "GET", f"/jobs/{job_id}/experiments/{experiment_id}"))

    @server.tool(description="Silence notifications matching label matchers for a while. Needs an operator token.")
    async def silence(ctx: Context, matchers: Annotated[list[Matcher], Field(min_length=1, max_length=16)],
                      duration_seconds: Annotated[float, Field(gt=0, le=30 * 86400)],
                      comment: Annotated[str, Field(max_length=1024)] = "") -> SilenceOut:
        body = SilenceCreate(matchers=matchers, duration_seconds=duration_seconds, comment=comment)
        return SilenceOut.model_validate(await api.call(ctx, "POST", "/silences", body=body.model_dump(mode="json")))

    @server.tool(description="Cordon a node: no new work is placed on it. Needs an operator token.")
    async def cordon_node(ctx: Context, node: NodeName,
                          reason: Annotated[str, Field(max_length=512)] = "") -> NodeDetail:
        body = CordonRequest(reason=reason).model_dump()
        return NodeDetail.model_validate(await api.call(ctx, "POST", f"/nodes/{node}/cordon", body=body))

    @server.tool(description="Acknowledge an incident: someone is on it. Needs an operator token.")
    async def acknowledge_incident(ctx: Context, incident_id: IncidentId) -> IncidentOut:
        return IncidentOut.model_validate(await api.call(ctx, "POST", f"/incidents/{incident_id}/ack"))


def header_token(ctx: Context | None) -> str | None:
    """The request's bearer token (Streamable HTTP)."""
    headers = ctx.headers if ctx is not None else None
    value = (headers or {}).get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def fixed_token(token: str | None) -> TokenOf:
    """The server process's own token (stdio: one client, the process that started it)."""
    return lambda ctx: token
