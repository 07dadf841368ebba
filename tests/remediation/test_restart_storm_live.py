"""A restart storm with real processes: `sentinel launch` runs a job whose ranks fail a moment after they
start, every attempt. Sentinel restarts it until the storm rule holds, then opens one critical incident
and issues no further order, however often the job would fail again."""

from __future__ import annotations

import sys
import time

import pytest

from tests.live import Cluster, wait_for

pytestmark = pytest.mark.slow

FAILING_JOB = ["-c", "import sys, time; time.sleep(1.0); sys.exit(3)"]  # exits 3 about 1 s after each start


def test_a_job_that_keeps_failing_gets_one_critical_incident_and_no_more_restarts(tmp_path):
    cluster = Cluster(tmp_path, env={"SENTINEL_RESTART_STORM_RESTARTS": "3"}, nodes={"node-a": 2})
    try:
        cluster.launch("crashy", job=FAILING_JOB)
        api = cluster.api
        storm = wait_for(lambda: api.get("/incidents", params={"detector": "remediation"}).json()["incidents"],
                         timeout=90, what="the restart-storm incident")
        [incident] = storm
        assert incident["severity"] == "critical" and "restart storm" in incident["title"], incident
        job = cluster.job("crashy")
        orders = api.get(f"/jobs/{job['id']}/orders", params={"state": "all"}).json()
        assert len(orders) == 3, [o["attempt"] for o in orders]
        time.sleep(5)  # the last attempt's ranks have failed too by now: nothing restarts them
        assert len(api.get(f"/jobs/{job['id']}/orders", params={"state": "all"}).json()) == 3
        assert len(api.get("/incidents", params={"detector": "remediation"}).json()["incidents"]) == 1
        detail = api.get(f"/incidents/{incident['id']}").json()
        assert "restarted 3 times in the last 30 min" in detail["seen"]
    except BaseException:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.close()
