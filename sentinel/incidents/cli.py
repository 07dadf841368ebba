"""`sentinel incidents …` and `sentinel silences …`: the on-call engineer's view from a terminal."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sentinel.client import SentinelClient, resolve_token
from sentinel.console import table

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _client(args: argparse.Namespace) -> SentinelClient:
    return SentinelClient(args.server, resolve_token(args.token))


def _age(stamp: str | None) -> str:
    if not stamp:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(stamp)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def _subject(i: dict[str, Any]) -> str:
    parts = []
    if i["job_id"] is not None:
        parts.append(f"job {i['job_id']}" + (f"/r{i['rank']}" if i["rank"] is not None else ""))
    if i["node"]:
        parts.append(i["node"])
    if i["accelerator_uuid"]:
        parts.append(i["accelerator_uuid"][:20])
    return " ".join(parts) or "fleet"


def cmd_list(args: argparse.Namespace) -> int:
    out = _client(args).get("/incidents", state=args.state, severity=args.severity, node=args.node, job=args.job,
                            limit=args.limit)
    rows = [(i["id"], i["severity"], i["state"], i["detector"], _subject(i), _age(i["opened_at"]),
             "-" if i["detection_latency_seconds"] is None else f"{i['detection_latency_seconds']:.2f}s",
             i["title"][:70]) for i in out["incidents"]]
    print(table(["ID", "SEVERITY", "STATE", "DETECTOR", "SUBJECT", "AGE", "DETECTED IN", "TITLE"], rows))
    print(f"\n{len(rows)} of {out['total']} {args.state} incident(s); `sentinel incidents show ID` for the evidence")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    detail = _client(args).get(f"/incidents/{args.id}")
    print(detail["text"])
    if detail["notifications"]:
        print("\nNotifications:")
        print(table(["RECEIVER", "EVENT", "STATE", "ATTEMPTS", "LAST ERROR"],
                    [(n["receiver"], n["event"], n["state"], n["attempts"], n["last_error"][:60])
                     for n in detail["notifications"]]))
    return 0


def _change(what: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        out = _client(args).post(f"/incidents/{args.id}/{what}", {"note": args.note})
        print(f"incident #{out['id']} is {out['state']}: {out['title']}")
        return 0

    return run


def parse_matcher(text: str) -> dict[str, Any]:
    """`name=value`, `name!=value`, `name=~regex`, `name!~regex` (Alertmanager's matcher syntax)."""
    for op, regex, equal in (("!~", True, False), ("=~", True, True), ("!=", False, False), ("=", False, True)):
        name, sep, value = text.partition(op)
        if sep and name:
            return {"name": name.strip(), "value": value.strip(), "is_regex": regex, "is_equal": equal}
    raise argparse.ArgumentTypeError(f"matcher {text!r} is not name=value, name!=value, name=~re or name!~re")


def parse_duration(text: str) -> float:
    found = DURATION.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"duration {text!r} is not like 30m, 2h or 1d")
    return float(found.group(1)) * UNIT_SECONDS[found.group(2)]


def cmd_silences(args: argparse.Namespace) -> int:
    items = _client(args).get("/silences", all=str(args.all).lower())

    def show(m: dict[str, Any]) -> str:
        op = {(False, True): "=", (False, False): "!=", (True, True): "=~", (True, False): "!~"}
        return f"{m['name']}{op[(bool(m.get('is_regex')), bool(m.get('is_equal', True)))]}{m['value']}"

    print(table(["ID", "MATCHERS", "ENDS", "BY", "COMMENT"],
                [(s["id"], " ".join(show(m) for m in s["matchers"]), s["ends_at"][:19], s["created_by"],
                  s["comment"][:50]) for s in items]))
    return 0


def cmd_silence(args: argparse.Namespace) -> int:
    out = _client(args).post("/silences", {"matchers": args.match, "duration_seconds": args.duration,
                                           "comment": args.comment})
    print(f"silence #{out['id']} until {out['ends_at'][:19]}Z")
    return 0


def _remote_again(p: argparse.ArgumentParser) -> None:
    """--server/--token also after the action word, without overwriting values given before it."""
    p.add_argument("--server", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--token", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_parsers(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("incidents", help="incidents: list, show, ack, resolve")
    remote(p)
    p.add_argument("--state", default="active", choices=["active", "open", "acknowledged", "resolved", "all"])
    p.add_argument("--severity", default=None, choices=["info", "warning", "critical"])
    p.add_argument("--node", default=None)
    p.add_argument("--job", type=int, default=None)
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(fn=cmd_list)
    actions = p.add_subparsers(dest="incident_command", required=False)
    q = actions.add_parser("show", help="everything about one incident")
    _remote_again(q)
    q.add_argument("id", type=int)
    q.set_defaults(fn=cmd_show)
    for name, what, doc in (("ack", "ack", "acknowledge: someone is on it"), ("resolve", "resolve", "close it")):
        q = actions.add_parser(name, help=doc)
        _remote_again(q)
        q.add_argument("id", type=int)
        q.add_argument("--note", default="")
        q.set_defaults(fn=_change(what))

    p = sub.add_parser("silences", help="active silences (--all: expired too)")
    remote(p)
    p.add_argument("--all", action="store_true")
    p.set_defaults(fn=cmd_silences)
    p = sub.add_parser("silence", help="mute notifications matching labels for a while")
    remote(p)
    p.add_argument("--match", type=parse_matcher, action="append", required=True,
                   help="label matcher, e.g. node=gpu-07 or detector=~straggler|mfu_drop; repeat for AND")
    p.add_argument("--for", dest="duration", type=parse_duration, default=3600.0, help="e.g. 30m, 2h (default 1h)")
    p.add_argument("--comment", default="")
    p.set_defaults(fn=cmd_silence)
