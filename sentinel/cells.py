"""Read views over several cells (docs/cells.md): `sentinel status --cells a=URL,b=URL`.

A cell is one Sentinel server (a leader and its standbys) with its own database, so a fleet-wide read view asks
every cell, at once, with that cell's token and a short timeout. A cell that does not answer is a row that says
so (as does one that refuses the token); the others are still shown, and the command exits 1 so that a script
notices.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from sentinel.client import ApiError, SentinelClient, resolve_token
from sentinel.console import table

T = TypeVar("T")
_NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=(.+)$")
HEALTH_COLUMNS = ("healthy", "suspect", "quarantined")


@dataclass(frozen=True)
class Cell:
    name: str
    servers: str  # one URL, or a leader and its standbys comma-separated (sentinel/ha/failover.py)


def parse_cells(spec: str) -> list[Cell]:
    """`a=http://a1:9480,http://a2:9480,b=http://b1:9480` → cells a (a1, then its standby a2) and b.

    Each `NAME=URL` starts a cell; a bare URL after it is another server of the same cell. `;` separates
    cells as well. ValueError for a URL before any name, a cell named twice, or nothing at all."""
    servers: dict[str, list[str]] = {}
    current: str | None = None
    for item in (part.strip() for part in re.split(r"[,;]", spec)):
        if not item:
            continue
        named = _NAMED.match(item)
        if named:
            current, url = named[1], named[2].strip()
            if current in servers:
                raise ValueError(f"cell {current!r} is named twice in {spec!r}")
            servers[current] = [url]
        elif current is None:
            raise ValueError(f"{item!r} comes before any NAME=URL in {spec!r}")
        else:
            servers[current].append(item)
    if not servers:
        raise ValueError("no cells given: expected NAME=URL[,NAME=URL…]")
    return [Cell(name, ",".join(urls)) for name, urls in servers.items()]


def cell_token(cell: Cell, token: str | None = None) -> str | None:
    """Each cell has its own database and so its own tokens: `SENTINEL_TOKEN_<CELL>` (upper case, other
    characters as `_`), else the shared `--token` / `SENTINEL_TOKEN` / local admin token."""
    own = os.environ.get("SENTINEL_TOKEN_" + re.sub(r"[^A-Z0-9]", "_", cell.name.upper()))
    return own or resolve_token(token)


@dataclass(frozen=True)
class CellResult(Generic[T]):
    cell: Cell
    value: T | None = None
    error: str = ""  # empty when the cell answered

    @property
    def ok(self) -> bool:
        return not self.error


def gather(cells: Sequence[Cell], read: Callable[[SentinelClient], T], *, token: str | None = None,
           timeout: float = 5.0) -> list[CellResult[T]]:
    """`read(client)` against every cell concurrently, in the cells' order. A cell that cannot be reached, or
    answers with an error, is a result with `error` set, never an exception."""

    def one(cell: Cell) -> CellResult[T]:
        client = SentinelClient(cell.servers, cell_token(cell, token), timeout=timeout)
        try:
            return CellResult(cell, value=read(client))
        except ApiError as exc:
            return CellResult(cell, error=f"HTTP {exc.status}: {exc.detail}")
        except httpx.HTTPError as exc:
            return CellResult(cell, error=f"unreachable ({type(exc).__name__}: {exc or 'no answer'})")
        finally:
            client.close()

    if not cells:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(cells)), thread_name_prefix="cell") as pool:
        return list(pool.map(one, cells))


def overview(client: SentinelClient) -> dict[str, Any]:
    """What `sentinel status` shows of one cell: its nodes, accelerators by health, jobs and active incidents."""
    return {"nodes": client.get("/nodes"), "accelerators": client.get("/accelerators"),
            "jobs": client.get("/jobs", limit=1000), "incidents": client.get("/incidents", state="active", limit=20)}


def _counts(items: Sequence[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item[key]] = out.get(item[key], 0) + 1
    return out


def cell_rows(results: Sequence[CellResult[dict[str, Any]]]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for r in results:
        if r.value is None:
            rows.append((r.cell.name, r.cell.servers, r.error, "-", "-", "-", "-"))
            continue
        nodes = _counts(r.value["nodes"], "state")
        health = _counts([a for a in r.value["accelerators"] if a["present"]], "health")
        incidents = r.value["incidents"]
        critical = sum(1 for i in incidents["incidents"] if i["severity"] == "critical")
        rows.append((r.cell.name, r.cell.servers, "ok",
                     f"{sum(nodes.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(nodes.items())) + ")",
                     "/".join(str(health.get(h, 0)) for h in HEALTH_COLUMNS), len(r.value["jobs"]),
                     f"{incidents['total']} ({critical} critical)" if incidents["total"] else "0"))
    return rows


def print_status(results: Sequence[CellResult[dict[str, Any]]]) -> None:
    print(table(["CELL", "SERVER", "STATE", "NODES", "ACCELERATORS H/S/Q", "JOBS", "ACTIVE INCIDENTS"],
                cell_rows(results)) + "\n")
    answered = [r for r in results if r.value is not None]
    node_rows = []
    for r in answered:
        assert r.value is not None
        per_node: dict[str, list[str]] = {}
        for a in r.value["accelerators"]:
            per_node.setdefault(a["node"], []).append(a["health"][0].upper() if a["present"] else "-")
        node_rows += [(r.cell.name, n["name"], n["state"], (n["last_seen_at"] or "-")[:19],
                       "".join(per_node.get(n["name"], []))) for n in r.value["nodes"]]
    print(table(["CELL", "NODE", "STATE", "LAST SEEN", "ACCELERATORS (H healthy, S suspect, Q quarantined)"],
                node_rows) + "\n")
    incident_rows = [(r.cell.name, i["id"], i["severity"], i["state"], i["node"] or "-", i["title"])
                     for r in answered if r.value is not None for i in r.value["incidents"]["incidents"]]
    print(table(["CELL", "INCIDENT", "SEVERITY", "STATE", "NODE", "TITLE"], incident_rows))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", default=os.environ.get("SENTINEL_CELLS") or None, metavar="NAME=URL,…",
                        help="read every cell: NAME=URL[,URL of a standby],NAME=URL… (default $SENTINEL_CELLS); "
                             "each cell's token from $SENTINEL_TOKEN_<NAME>, else --token")
    parser.add_argument("--cell-timeout", type=float, default=5.0, help="seconds to wait for each cell")


def cmd_status(args: argparse.Namespace) -> int:
    """`sentinel status --cells …`: one table with a CELL column; 1 when any cell could not be read."""
    try:
        cells = parse_cells(args.cells)
    except ValueError as exc:
        print(f"error: --cells: {exc}", file=sys.stderr)
        return 2
    results = gather(cells, overview, token=args.token, timeout=args.cell_timeout)
    print_status(results)
    missing = [r.cell.name for r in results if not r.ok]
    if missing:
        print(f"\n{len(missing)} of {len(results)} cells could not be read: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0
