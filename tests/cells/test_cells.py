"""Cells (docs/cells.md): the `cell` label on what every notifier sends, `--cells` parsing, and the two-cell drill
on real engines (tests/cells/drill.py): one page per cell's fault through a two-peer Alertmanager cluster, both
faults in one federated query, and `sentinel status --cells` with a cell that cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sentinel.alerting import notifiers
from sentinel.alerting.notifiers import alertmanager
from sentinel.cells import Cell, parse_cells
from sentinel.config import Settings
from tests.alerting.alerting_helpers import incident, receiver
from tests.conftest import fresh_postgres_database
from tests.dashboards.test_dashboard_queries import load, require, variable_query, variables
from tests.live import free_port, sentinel_cmd, wait_for

NOW = datetime(2026, 12, 4, tzinfo=UTC)


# -- fast ---------------------------------------------------------------------------------------------------

def test_cells_spec_names_each_cell_and_its_standbys() -> None:
    assert parse_cells("a=http://a1:9480,http://a2:9480,b=https://b1:9480") == [
        Cell("a", "http://a1:9480,http://a2:9480"), Cell("b", "https://b1:9480")]
    assert parse_cells(" eu-1=http://x ; us.2=http://y ") == [Cell("eu-1", "http://x"), Cell("us.2", "http://y")]
    for bad in ("http://a1:9480", "a=http://x,a=http://y", " , "):
        with pytest.raises(ValueError):
            parse_cells(bad)


def test_cell_setting_is_validated() -> None:
    assert Settings(cell="eu-west-1").cell == "eu-west-1"
    assert Settings().cell == ""
    with pytest.raises(ValueError):
        Settings(cell="no spaces")


@pytest.mark.parametrize("kind", ["alertmanager", "webhook", "pagerduty", "slack"])
def test_every_notifier_carries_the_cell(kind: str) -> None:
    """Same incident (same node name, same fingerprint) in two cells: what reaches a receiver differs by cell, and
    without a cell nothing changes (a server that is not in a cell sends what it always sent)."""
    extra = {"secret": "routing-key"} if kind == "pagerduty" else {}
    target = receiver(kind, "http://127.0.0.1:9/x", **extra)
    item = incident(opened_at=NOW)
    bodies = {cell: json.loads(notifiers.render(target, item, "trigger", NOW, cell=cell).body)
              for cell in ("", "a", "b")}
    assert bodies["a"] != bodies["b"]
    if kind == "alertmanager":
        [plain], [in_a] = bodies[""], bodies["a"]
        assert in_a["labels"] == {**plain["labels"], "cell": "a"} and "cell" not in plain["labels"]
    elif kind == "webhook":
        assert bodies["a"]["cell"] == "a" and bodies["a"]["incident"]["labels"]["cell"] == "a"
        assert "cell" not in bodies[""] and "cell" not in bodies[""]["incident"]["labels"]
    elif kind == "pagerduty":
        assert bodies[""]["dedup_key"] == item.fingerprint
        assert bodies["a"]["dedup_key"] == f"a/{item.fingerprint}" != bodies["b"]["dedup_key"]
        assert bodies["a"]["payload"]["custom_details"]["labels"]["cell"] == "a"
    else:
        context = {cell: body["blocks"][-1]["elements"][0]["text"] for cell, body in bodies.items()}
        assert context["a"].startswith("cell a · ") and not context[""].startswith("cell")


def test_alertmanager_refresh_keeps_the_cell() -> None:
    """The periodic re-post must carry the same labels as the first post, or Alertmanager sees a second alert."""
    target = receiver("alertmanager", "http://127.0.0.1:9")
    first = json.loads(notifiers.render(target, incident(opened_at=NOW), "trigger", NOW, cell="a").body)
    again = json.loads(alertmanager.alerts_request(target, [incident(opened_at=NOW)], NOW, external_url=None,
                                                   resend_seconds=60, cell="a").body)
    assert first[0]["labels"] == again[0]["labels"]


def test_dashboards_take_a_cell_variable() -> None:
    for name in ("fleet-overview.json", "training-jobs.json", "incidents-recovery.json", "serving.json"):
        found = variables(load(name))
        cell = found["cell"]
        assert variable_query(cell) == "label_values(up, cell)", name
        assert cell["includeAll"] and cell["allValue"] == ".*", name  # .* also matches a Prometheus with no cells


# -- the drill ----------------------------------------------------------------------------------------------

@pytest.fixture
def two_databases(postgres_admin: str) -> Iterator[dict[str, str]]:
    with ExitStack() as stack:
        yield {name: stack.enter_context(_database(postgres_admin)) for name in ("a", "b")}


def _database(admin: str):  # type: ignore[no-untyped-def]
    from contextlib import contextmanager

    return contextmanager(fresh_postgres_database)(admin)


@pytest.mark.slow
def test_two_cells_one_page_each_and_one_federated_view(tmp_path: Path, two_databases: dict[str, str]) -> None:
    from tests.cells.drill import NODE, PEER_TIMEOUT_SECONDS, Drill, page_cell

    prometheus_bin, alertmanager_bin = require("prometheus"), require("prometheus-alertmanager")
    drill = Drill(tmp_path)
    try:
        drill.start(prometheus_bin, alertmanager_bin, two_databases)
        wait_for(lambda: set(drill.federated("sentinel_nodes")) == {"a", "b"}, timeout=30, interval=0.5,
                 what="both cells' series in the global Prometheus")

        for cell in drill.cells:
            cell.inject_xid79()
        pages = wait_for(lambda: len(drill.firing_pages()) >= 2 and drill.firing_pages(), timeout=30,
                         what="a page per cell")
        # The second peer sends only if the first one's notification has not reached it by its peer timeout:
        # wait past that, and past a group interval, before counting.
        time.sleep(2 * PEER_TIMEOUT_SECONDS + 1.5)
        pages = drill.firing_pages()
        assert sorted(page_cell(m) for _, m in pages) == ["a", "b"], [m for _, m in pages]
        alerts = [m["alerts"] for _, m in pages]
        assert all(len(a) == 1 for a in alerts)
        labels = {a[0]["labels"]["cell"]: a[0]["labels"] for a in alerts}
        assert labels["a"]["node"] == labels["b"]["node"] == NODE
        # Same node, same fingerprint: without the cell label these would be one alert and one page.
        assert labels["a"]["fingerprint"] == labels["b"]["fingerprint"]
        for peer in drill.alertmanagers:  # each server posted to both peers; dedup is the cluster's doing
            assert sorted(a["labels"]["cell"] for a in peer.alerts()) == ["a", "b"], peer.name

        for cell in drill.cells:
            [(direct_at, _)] = drill.direct_pages(cell.name)
            [(page_at, _)] = [(at, m) for at, m in pages if page_cell(m) == cell.name]
            print(f"cell {cell.name}: fault → page via the Alertmanager cluster {page_at - cell.faults[0]:.3f} s, "
                  f"→ direct webhook {direct_at - cell.faults[0]:.3f} s")

        open_by_cell = wait_for(lambda: (v := drill.federated("sum by (cell) (sentinel_incidents_open)"))
                                and all(v.get(c, 0) >= 1 for c in "ab") and v, timeout=20, interval=0.5,
                                what="both cells' open incidents in one federated query")
        print(f"federated sum by (cell) (sentinel_incidents_open): {open_by_cell}")
        assert drill.world is not None
        assert set(drill.world.label_values(variable_query(variables(load("fleet-overview.json"))["cell"]))) == {
            "a", "b"}

        # `sentinel status --cells`: both cells in one table; a cell that is not there shown as unreachable, and one
        # whose token is refused (cell a's server under another name, with cell b's token) as the server's answer.
        spec = ",".join(f"{c.name}={c.server.url}" for c in drill.cells)
        spec += f",gone=http://127.0.0.1:{free_port()};wrong-token={drill.cells[0].server.url}"
        env = {**os.environ, **{f"SENTINEL_TOKEN_{c.name.upper()}": c.server.admin_token for c in drill.cells},
               "SENTINEL_TOKEN_WRONG_TOKEN": drill.cells[1].server.admin_token}
        env.pop("SENTINEL_TOKEN", None)
        out = subprocess.run(sentinel_cmd("status", "--cells", spec, "--cell-timeout", "3"), env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        cells_table, nodes_table, incidents_table = (t.splitlines()[2:] for t in out.stdout.strip().split("\n\n"))
        rows = {line.split()[0]: line for line in cells_table}
        assert set(rows) == {"a", "b", "gone", "wrong-token"}, out.stdout
        assert " ok " in rows["a"] and " ok " in rows["b"] and "unreachable" in rows["gone"], out.stdout
        assert "HTTP 401" in rows["wrong-token"], out.stdout
        assert sorted(line.split()[:2] for line in nodes_table) == [["a", NODE], ["b", NODE]], out.stdout
        assert sorted(line.split()[0] for line in incidents_table) == ["a", "b"], out.stdout
        assert "2 of 4 cells could not be read: gone, wrong-token" in out.stderr
    except BaseException:
        print(drill.logs())
        raise
    finally:
        drill.close()
