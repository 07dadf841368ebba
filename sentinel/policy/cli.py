"""`sentinel policy decisions|shadow`: what the placement and checkpoint-interval policies chose, and how the
shadow compares, before an operator switches policies."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sentinel.client import SentinelClient, resolve_token
from sentinel.console import table


def _client(args: argparse.Namespace) -> SentinelClient:
    return SentinelClient(args.server, resolve_token(args.token))


def choice_text(choice: dict[str, Any] | None) -> str:
    """A choice in a cell: 'r0→n7 r1→n7', '1.2h', 'no capacity', 'failed: …', or '-'."""
    if choice is None:
        return "-"
    if "ranks" in choice:
        return " ".join(f"r{rank}→{slot['node']}" for rank, slot in sorted(choice["ranks"].items(),
                                                                       key=lambda kv: int(kv[0]))) or "-"
    if "interval_seconds" in choice:
        seconds = choice["interval_seconds"]
        return "-" if seconds is None else f"{seconds:.0f}s" if seconds < 3600 else f"{seconds / 3600:.1f}h"
    if "no_capacity" in choice:
        return "no capacity"
    return f"failed: {str(choice.get('error', '?'))[:40]}"


def cmd_decisions(args: argparse.Namespace) -> int:
    rows = _client(args).get("/policy/decisions", kind=args.kind, job=args.job, limit=args.limit)
    print(table(["ID", "AT", "KIND", "JOB", "INCIDENT", "ACTIVE", "CHOICE", "SHADOW", "SHADOW CHOICE", "AGREE"],
                [(d["id"], d["at"][:19], d["kind"], d["job_id"], d["incident_id"] or "-", d["active_policy"],
                  choice_text(d["active_choice"]), d["shadow_policy"] or "-", choice_text(d["shadow_choice"]),
                  "-" if d["agree"] is None else "yes" if d["agree"] else "no") for d in rows]))
    print(f"\n{len(rows)} decision(s), newest first; the explanations: GET /api/v1/policy/decisions")
    return 0


def cmd_shadow(args: argparse.Namespace) -> int:
    rows = _client(args).get("/policy/shadow")
    print(table(["KIND", "ACTIVE", "SHADOW", "DECISIONS", "AGREED", "RATIO", "FAULTED AFTER (ACTIVE / SHADOW)",
                 "LAST"],
                [(s["kind"], s["active_policy"], s["shadow_policy"] or "-", s["decisions"], s["agreements"],
                  "-" if s["agreement_ratio"] is None else f"{100 * s['agreement_ratio']:.1f}%",
                  outcome_text(s.get("outcome")), (s["last_at"] or "-")[:19]) for s in rows]))
    shown = next((s["outcome"] for s in rows if s.get("outcome")), None)
    if shown:
        print(f"\nFAULTED AFTER: over the {shown['disagreements']} placement(s) where they disagreed, how many of the "
              f"nodes each side chose faulted within {shown['window_days']:g} days after the decision")
    return 0


def outcome_text(outcome: dict[str, Any] | None) -> str:
    """'1 of 2 nodes / 0 of 2', or '-' (no shadow, or not a placement)."""
    if not outcome:
        return "-"
    return (f"{outcome['active_faulted']} of {outcome['active_nodes']} nodes / "
            f"{outcome['shadow_faulted']} of {outcome['shadow_nodes']}")


def _remote_again(p: argparse.ArgumentParser) -> None:
    """--server/--token also after the action word, without overwriting values given before it."""
    p.add_argument("--server", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--token", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_parsers(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("policy", help="placement and checkpoint-interval policies: decisions, shadow comparison")
    remote(p)
    actions = p.add_subparsers(dest="policy_command", required=True)
    q = actions.add_parser("decisions", help="recorded decisions, newest first")
    _remote_again(q)
    q.add_argument("--kind", default=None, choices=["placement", "checkpoint_interval"])
    q.add_argument("--job", type=int, default=None)
    q.add_argument("--limit", type=int, default=50)
    q.set_defaults(fn=cmd_decisions)
    q = actions.add_parser("shadow", help="how often the shadow policy agreed with the active one")
    _remote_again(q)
    q.set_defaults(fn=cmd_shadow)
