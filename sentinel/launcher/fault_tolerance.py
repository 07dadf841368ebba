"""An instruction to a serving engine that waits after an engine core failed, applied by the job's launcher.

The server decided it (the engine_fault detector: `retry` or `scale_down`) and sent it as an `adjust` order,
`params` `{"fault_tolerance": "retry", "replicas": ["r1"]}`; the engine listens on this node's loopback. Each
named replica of this launcher gets `POST /fault_tolerance/apply {"instruction": ..., "params": {}}` (vLLM 0.32
serves it without a prefix, later ones under `/v1`: a 404 tries the other). vLLM answers 202 at once and
recovers in the background (every DP rank must have its instruction before the collective re-init completes);
400 where the instruction is not one it takes (0.32 takes `retry` only). The order's result says what each
engine answered.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from typing import Any

from sentinel.remediation.executors.base import Outcome

PATHS = ("/fault_tolerance/apply", "/v1/fault_tolerance/apply")
INSTRUCTIONS = ("retry", "scale_down")
TIMEOUT_SECONDS = 5.0


def apply(port: int, instruction: str, *, host: str = "127.0.0.1", timeout_seconds: float = TIMEOUT_SECONDS
          ) -> tuple[bool, str]:
    """POST the instruction to one engine: (accepted, what it answered)."""
    body = json.dumps({"instruction": instruction, "params": {}})
    answer = "no answer"
    for path in PATHS:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_seconds)
        try:
            conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            response = conn.getresponse()
            text = response.read(2000).decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        answer = f"HTTP {response.status} {_said(text)}".rstrip()
        if response.status != 404:
            return 200 <= response.status < 300, answer
    return False, f"{answer}: the engine does not expose /fault_tolerance/apply"


def _said(text: str) -> str:
    """The engine's words: vLLM's `message` / `detail` / `error.message`, else the body, short."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text.strip()[:200]
    if isinstance(doc, dict):
        err = doc.get("error")
        for value in (doc.get("message"), doc.get("detail"), err.get("message") if isinstance(err, dict) else err):
            if value:
                return str(value)[:200]
    return text.strip()[:200]


def apply_order(order: Mapping[str, Any], names: Mapping[int, str], ports: Mapping[int, int]) -> Outcome:
    """The order applied to the replicas it names that run here (`names`/`ports`: rank → replica, port)."""
    params = order.get("params") or {}
    instruction, wanted = params.get("fault_tolerance"), [str(r) for r in params.get("replicas") or []]
    if instruction not in INSTRUCTIONS:
        return Outcome(False, f"order {order.get('id')}: unknown fault-tolerance instruction {instruction!r}")
    here = {name: ports[rank] for rank, name in names.items() if rank in ports}
    said, ok = [], True
    for name in wanted:
        if name not in here:
            said.append(f"{name}: not a replica of this launcher")
            ok = False
            continue
        accepted, answer = apply(here[name], instruction)
        ok = ok and accepted
        said.append(f"{name} {'accepted' if accepted else 'refused'} {instruction} ({answer})")
    return Outcome(ok and bool(wanted), f"order {order.get('id')}: " + ("; ".join(said) or "no replica named"))
