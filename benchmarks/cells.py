"""The two-cell drill's numbers (issue 20 part 3, docs/cells.md): fault → page latency per cell through one
Alertmanager cluster, pages per fault, and fault → visible in one federated query.

Setup (tests/cells/drill.py): two cells, each a Sentinel server (`SENTINEL_CELL`) on its own PostgreSQL database
with one sim agent and a cell Prometheus (`external_labels: {cell}`, 1 s scrapes); a global Prometheus scraping
both cell Prometheus' `/federate` (1 s); two `prometheus-alertmanager` peers in one gossip cluster (peer timeout
1 s, group_wait 100 ms), and every server sends each alert to both peers. Both agents report a node of the same
name. Each round injects XID 79 on the next accelerator in both cells at once (as `sentinel inject`) and waits
for one page per cell at the Alertmanager cluster's webhook receiver, then 2 × the peer timeout + 1.5 s more
to catch a duplicate.

Baseline, measured in the same run: each server's own signed webhook receiver (listed first, so the dispatcher
sends it before the Alertmanager peers): the path without Alertmanager. The ratio is page ÷ direct, per fault.

    PYTHONPATH=. .venv/bin/python benchmarks/cells.py --rounds 5 [--no-record]
    PYTHONPATH=. .venv/bin/python benchmarks/cells.py --rounds 2 --no-gossip   # control: 2 pages per fault
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from support import add_record_arguments, command_line, figure, load, record_figures, report_recorded, say

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def databases(admin_url: str, names: list[str]) -> dict[str, str]:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    out = {}
    with engine.connect() as conn:
        for name in names:
            db = f"sentinel_bench_cells_{name}_{uuid.uuid4().hex[:8]}"
            conn.execute(text(f'CREATE DATABASE "{db}"'))
            out[name] = make_url(admin_url).set(database=db).render_as_string(hide_password=False)
    engine.dispose()
    return out


def drop(admin_url: str, urls: dict[str, str]) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for url in urls.values():
            conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    engine.dispose()


def run(rounds: int, admin_url: str, gossip: bool = True) -> dict[str, dict[str, list[float]]]:
    from tests.cells.drill import PEER_TIMEOUT_SECONDS, Drill, page_cell
    from tests.live import wait_for

    urls = databases(admin_url, ["a", "b"])
    samples: dict[str, dict[str, list[float]]] = {c: {"page": [], "direct": [], "ratio": [], "federated": []}
                                                  for c in urls}
    pages_seen = 0
    with tempfile.TemporaryDirectory(prefix="bench-cells-") as work:
        drill = Drill(Path(work))
        try:
            drill.start("prometheus", "prometheus-alertmanager", urls, accelerators=rounds, gossip=gossip)
            wait_for(lambda: set(drill.federated("sentinel_nodes")) == set(urls), timeout=60, interval=0.2,
                     what="both cells in the global Prometheus")
            for r in range(rounds):
                faults = {c.name: c.inject_xid79(r) for c in drill.cells}
                per_fault = 1 if gossip else 2  # the control: each lone peer pages
                want = 2 * (r + 1) * per_fault
                wait_for(lambda w=want: len(drill.firing_pages()) >= w, timeout=60, interval=0.02,  # type: ignore[misc]
                         what=f"round {r}: a page per cell")
                seen_federated: dict[str, float] = {}

                def federated(r: int = r, seen: dict[str, float] = seen_federated) -> bool:
                    now = time.time()
                    for cell, value in drill.federated("sum by (cell) (sentinel_incidents_open)").items():
                        if value >= r + 1:
                            seen.setdefault(cell, now)
                    return set(seen) == set(urls)

                wait_for(federated, timeout=60, interval=0.1, what=f"round {r}: both faults in the federated query")
                time.sleep(2 * PEER_TIMEOUT_SECONDS + 1.5)
                pages = drill.firing_pages()
                pages_seen = len(pages)
                for cell, at in faults.items():
                    mine = [p_at for p_at, m in pages[2 * r * per_fault:] if page_cell(m) == cell]
                    direct = [d_at for d_at, _ in drill.direct_pages(cell) if d_at >= at]
                    page_s, direct_s = mine[0] - at, direct[0] - at
                    samples[cell]["page"].append(page_s)
                    samples[cell]["direct"].append(direct_s)
                    samples[cell]["ratio"].append(page_s / direct_s)
                    samples[cell]["federated"].append(seen_federated[cell] - at)
                    say(f"round {r} cell {cell}: fault → page {page_s:.3f} s, → direct webhook {direct_s:.3f} s "
                        f"({page_s / direct_s:.2f}×), → federated query {seen_federated[cell] - at:.2f} s; "
                        f"pages so far {len(pages)} for {2 * (r + 1)} faults")
                if gossip and len(pages) != 2 * (r + 1):
                    raise SystemExit(f"round {r}: {len(pages)} pages for {2 * (r + 1)} faults: a duplicate or a loss")
        finally:
            drill.close()
            drop(admin_url, urls)
    samples["_"] = {"pages": [float(pages_seen)], "faults": [float(2 * rounds)]}
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="faults per cell (one XID 79 per accelerator)")
    parser.add_argument("--postgres", default=PG_ADMIN, help="admin URL; two databases are created and dropped")
    parser.add_argument("--no-gossip", dest="gossip", action="store_false",
                        help="the control: the two Alertmanager peers not clustered (expect 2 pages per fault)")
    add_record_arguments(parser)
    args = parser.parse_args()
    started_load = load()
    samples = run(args.rounds, args.postgres, args.gossip)
    counts = samples.pop("_")
    say(f"\nload average at start {started_load}, at end {load()}; {args.rounds} rounds; {command_line()}")
    say(f"pages: {counts['pages'][0]:.0f} for {counts['faults'][0]:.0f} faults "
        f"({counts['pages'][0] / counts['faults'][0]:.2f} per fault; each server posted every alert to both peers"
        f"{', which gossip' if args.gossip else ', which did NOT gossip (control)'})")
    say("| cell | fault → page (Alertmanager cluster), median [range] | fault → direct webhook | page ÷ direct | "
        "fault → federated query |")
    say("| --- | ---: | ---: | ---: | ---: |")
    figures = {}
    for cell, s in samples.items():
        say(f"| {cell} | {statistics.median(s['page']):.3f} s [{min(s['page']):.3f}–{max(s['page']):.3f}] | "
            f"{statistics.median(s['direct']):.3f} s [{min(s['direct']):.3f}–{max(s['direct']):.3f}] | "
            f"{statistics.median(s['ratio']):.2f}× [{min(s['ratio']):.2f}–{max(s['ratio']):.2f}] | "
            f"{statistics.median(s['federated']):.2f} s [{min(s['federated']):.2f}–{max(s['federated']):.2f}] |")
        figures[f"cells_fault_to_page_cell_{cell}"] = figure(s["page"])
        figures[f"cells_fault_to_federated_cell_{cell}"] = figure(s["federated"])
    if args.record is not None and not args.gossip:
        say("the control (--no-gossip) is not recorded")
        args.record = None
    if args.record is not None:
        conditions = (f"two cells on one machine (PostgreSQL each, sim agent, cell + global Prometheus at 1 s, two "
                      f"Alertmanager peers, peer timeout 1 s, group_wait 100 ms); {args.rounds} XID 79 per cell; "
                      f"pages {counts['pages'][0]:.0f} for {counts['faults'][0]:.0f} faults; load {started_load}")
        record_figures(figures, source="benchmarks/cells.py", conditions=conditions, path=args.record)
    report_recorded(args.record, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
