"""`sentinel network [matrix|nics]`: where the probe mesh puts a fault, the worst pairs, and the RDMA ports."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sentinel.client import SentinelClient, resolve_token
from sentinel.console import table


def _client(args: argparse.Namespace) -> SentinelClient:
    return SentinelClient(args.server, resolve_token(args.token))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def localisation_lines(found: dict[str, Any]) -> list[str]:
    """One line per fault the mesh localises, most certain first; 'nothing localised' when clean."""
    if found["fleet_wide"]:
        return [f"fleet-wide: {found['bad_pairs']} of {found['pairs']} pairs bad: a shared cause (management "
                "network, loaded probing hosts); nothing smaller is named"]
    lines = [f"domain {d['label']}={d['value']}: {len(d['bad_nodes'])} of {d['nodes']} nodes bad "
             f"({', '.join(d['bad_nodes'][:8])})" for d in found["domains"]]
    lines += [f"node {n['node']}: {'unreachable' if n['unreachable'] else 'slow or lossy'} on {n['bad_peers']} of "
              f"{n['measured_peers']} probed peers" for n in found["nodes"]]
    lines += [f"link {link['a']}↔{link['b']}: median RTT {_ms(link['rtt_seconds'])} ms, loss "
              f"{link['loss_ratio']:.0%}{'' if link['confident'] else ' (suspect: ends not yet measured enough)'}"
              for link in found["links"]]
    return lines or ["nothing localised"]


def cmd_matrix(args: argparse.Namespace) -> int:
    m = _client(args).get("/network/matrix", node=args.node, limit=args.limit)
    found = m["localisation"]
    print(f"probe mesh: {len(m['participants'])} agents, {m['peers_per_node']} peers each per "
          f"{m['round_seconds']:g}s round; {found['pairs']} pairs probed in {m['window_seconds']:g}s, "
          f"{found['bad_pairs']} bad; fleet median RTT {_ms(found['baseline_rtt_seconds'])} ms")
    for line in localisation_lines(found):
        print(f"  {line}")
    for node, why in sorted(m["excluded"].items()):
        print(f"  excluded from placement: {node} ({why})")
    print()
    print(table(["SOURCE", "TARGET", "SENT", "LOST", "RTT P50 MS", "RTT P99 MS", "BAD"],
                [(p["source"], p["target"], p["sent"], p["sent"] - p["received"], _ms(p["rtt_p50_seconds"]),
                  _ms(p["rtt_p99_seconds"]), "yes" if p["bad"] else "") for p in m["pairs"][:args.limit]]))
    return 0


def cmd_nics(args: argparse.Namespace) -> int:
    rows = _client(args).get("/network/nics", node=args.node)
    print(table(["NODE", "PORT", "STATE", "PHYS", "LAYER", "GB/S", "FLAPS", "ERRORS (GROWN IN TOTAL)"],
                [(n["node"], f"{n['device']}/{n['port']}", n["state"] or "?", n["phys_state"] or "?",
                  n["link_layer"] or "?", f"{(n['rate_bytes_per_second'] or 0) * 8 / 1e9:g}", n["link_flaps_total"],
                  " ".join(f"{k}={v}" for k, v in sorted(n["counters"].items())
                           if v and ("err" in k or k in ("symbol_error", "link_downed", "port_xmit_discards")))
                  or "-") for n in rows]))
    print(f"\n{len(rows)} port(s); `GET /api/v1/network/nics` has every counter and rate")
    return 0


def add_parsers(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("network", help="the network tier: probe-mesh matrix and localisation, RDMA ports")
    remote(p)
    p.add_argument("--node", default=None, help="only pairs / ports of this node")
    p.add_argument("--limit", type=int, default=30, help="pairs shown, worst first")
    p.set_defaults(fn=cmd_matrix)
    actions = p.add_subparsers(dest="network_command")
    q = actions.add_parser("matrix", help="the localisation and the worst pairs (the default)")
    q.set_defaults(fn=cmd_matrix)
    q = actions.add_parser("nics", help="every RDMA port the agents report")
    q.set_defaults(fn=cmd_nics)
