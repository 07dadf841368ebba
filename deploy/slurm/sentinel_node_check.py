#!/usr/bin/env python3
"""Slurm prolog / epilog: may this node take (or keep taking) jobs, as far as Sentinel knows?

    Prolog=/etc/slurm/prolog.d/sentinel-prolog.sh    (runs `sentinel_node_check.py prolog`)
    Epilog=/etc/slurm/epilog.d/sentinel-epilog.sh    (runs `sentinel_node_check.py epilog`)

It asks the Sentinel server for this node (`GET /api/v1/nodes/{node}` with a viewer token) and exits 1 when
the node is cordoned, or when an accelerator is quarantined (in the prolog: one of the job's, from
SLURM_JOB_GPUS, or any when the job names none). Slurm then drains the node and requeues the job, so a
broken accelerator is not handed a new job in the seconds before Sentinel's own executor drains the node.
Everything else exits 0: a healthy node, a node Sentinel does not know (not every node runs an agent), and
a Sentinel that cannot be reached (monitoring that is down must not stop the cluster; set
SENTINEL_FAIL_CLOSED=1 to refuse instead). Each run writes one line to stderr, which slurmd logs.

Standard library only: it runs under the node's system Python, outside Sentinel's virtual environment.
Settings (environment, or the file SENTINEL_SLURM_ENV, default /etc/sentinel/slurm.env, KEY=VALUE lines):
SENTINEL_SERVER (one URL or several, comma-separated: a standby answers reads), SENTINEL_TOKEN_FILE,
SENTINEL_NODE (default SLURMD_NODENAME), SENTINEL_TIMEOUT_SECONDS (default 3), SENTINEL_FAIL_CLOSED.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_ENV_FILE = "/etc/sentinel/slurm.env"


def settings() -> dict[str, str]:
    found = dict(os.environ)
    path = found.get("SENTINEL_SLURM_ENV", DEFAULT_ENV_FILE)
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    found.setdefault(key.strip(), value.strip().strip("'\""))
    return found


def fetch_node(servers: list[str], node: str, token: str, timeout: float) -> dict[str, Any] | None:
    """The node as the first server that answers sees it; None when it is unknown. Raises OSError when no
    server answers."""
    last: Exception | None = None
    for server in servers:
        url = f"{server.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                answer: dict[str, Any] = json.load(reply)
                return answer
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            last = exc  # 401/403 (a bad token), 5xx: the next server may do better
        except (OSError, ValueError) as exc:
            last = exc
    raise OSError(f"no Sentinel server answered ({last})")


def job_gpus(env: dict[str, str]) -> set[int] | None:
    """The accelerator indices Slurm gave the job (SLURM_JOB_GPUS '0,2' or '0-3'), None when it names none."""
    raw = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or ""
    indices: set[int] = set()
    for part in filter(None, raw.split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        indices.update(range(int(low), int(high or low) + 1))
    return indices or None


def verdict(node: dict[str, Any], phase: str, gpus: set[int] | None) -> str | None:
    """Why the node must not run the job, or None."""
    if node.get("admin_state") == "cordoned":
        return f"cordoned in Sentinel: {node.get('state_reason') or 'no reason given'}"
    for acc in node.get("accelerators", []):
        if acc.get("health") != "quarantined":
            continue
        if phase == "epilog" or gpus is None or acc.get("index") in gpus:
            return (f"accelerator {acc.get('index')} ({acc.get('uuid')}) quarantined by Sentinel: "
                    f"{acc.get('health_reason') or 'no reason given'}")
    return None


def main(argv: list[str]) -> int:
    phase = argv[1] if len(argv) > 1 else "prolog"
    if phase not in ("prolog", "epilog"):
        print(f"usage: {argv[0]} prolog|epilog", file=sys.stderr)
        return 2
    env = settings()
    node_name = env.get("SENTINEL_NODE") or env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    job = env.get("SLURM_JOB_ID", "?")
    fail_closed = env.get("SENTINEL_FAIL_CLOSED", "") in ("1", "true", "yes")
    servers = [s.strip() for s in env.get("SENTINEL_SERVER", "http://127.0.0.1:9480").split(",") if s.strip()]
    try:
        with open(env.get("SENTINEL_TOKEN_FILE", "/etc/sentinel/slurm-token")) as fh:
            token = fh.read().strip()
        node = fetch_node(servers, node_name, token, float(env.get("SENTINEL_TIMEOUT_SECONDS", "3")))
    except (OSError, ValueError) as exc:
        print(f"sentinel {phase}: job={job} node={node_name}: cannot ask Sentinel ({exc}); "
              f"{'refusing (SENTINEL_FAIL_CLOSED)' if fail_closed else 'letting the job run'}", file=sys.stderr)
        return 1 if fail_closed else 0
    if node is None:
        print(f"sentinel {phase}: job={job} node={node_name}: not known to Sentinel; ok", file=sys.stderr)
        return 0
    why = verdict(node, phase, job_gpus(env))
    if why is None:
        print(f"sentinel {phase}: job={job} node={node_name}: ok", file=sys.stderr)
        return 0
    print(f"sentinel {phase}: job={job} node={node_name}: refusing: {why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
