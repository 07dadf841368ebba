"""A serving replica that exits 0 on its own, with nothing in flight (an idle vLLM whose engine core died exits
0: vLLM #48966), has stopped serving: the server counts it a failure and orders it replaced, and the launcher
of a serving job does not take its ranks' exit 0 for the job's end. Real server, agent, `sentinel launch --kind
serving` and replica processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.live import Cluster, wait_for

pytestmark = pytest.mark.slow

REPLICA = """\
import os, sys, time
from pathlib import Path
rank, attempt = os.environ["RANK"], os.environ.get("SENTINEL_ATTEMPT", "0")
Path(os.environ["OUT_DIR"], f"replica{rank}-attempt{attempt}").write_text(str(os.getpid()))
if rank == "1" and attempt == "0":
    time.sleep(3)  # the agent watches it by now
    sys.exit(0)  # its engine died, and it says nothing of it
while True:
    time.sleep(0.2)
"""


def test_a_replica_that_exits_0_idle_is_replaced_and_the_launcher_keeps_serving(tmp_path: Path) -> None:
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    cluster = Cluster(tmp_path, nodes={"node-a": 2})
    out = tmp_path / "job"
    try:
        launch = cluster.launch("chat", job=[str(script)], kind="serving")
        replacement = wait_for(lambda: next((p for p in out.glob("replica1-attempt*") if p.name != "replica1-attempt0"),
                                            None), timeout=90, what="rank 1 replaced")
        assert launch.poll() is None, "the launcher of a serving job is still running"
        job = cluster.job("chat")
        first = next(t for t in job["tasks"] if t["rank"] == 1 and t["attempt"] == 0)
        assert (first["state"], first["exit_code"], first["failure_reason"]) == ("failed", 0, "exit:0+serving")
        orders = cluster.api.get(f"/jobs/{job['id']}/orders", params={"state": "all"}).json()
        assert [o["kind"] for o in orders] == ["replace_replica"]
        assert [s["rank"] for s in orders[0]["placement"] if s.get("replace")] == [1], "rank 0 is left alone"
        assert replacement.name == "replica1-attempt1"
        assert [p.name for p in out.glob("replica0-*")] == ["replica0-attempt0"], "rank 0 was never restarted"
        # (state=all: once the replacement serves, recovery may have resolved it already)
        [incident] = cluster.api.get("/incidents", params={"detector": "task_exit", "state": "all"}).json()["incidents"]
        assert "exited with code 0 though nothing stopped it" in incident["title"]
    finally:
        cluster.close()
