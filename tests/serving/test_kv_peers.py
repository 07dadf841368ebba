"""KV transfers by the peer they came from: the SDK sums them per peer, the wire bounds and validates them (a bad
name or too many peers is a 422 from the real report endpoint), the agent's and the server's sums add them, and
the server's window keeps them per replica."""

from __future__ import annotations

import pytest

from sentinel.sdk.serving import MAX_KV_PEERS, Requests
from sentinel.telemetry.serving import KvPeer, ServingStats, add_stats
from tests.factories import report
from tests.serving.driver import ServingDriver


class Tick:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_sdk_sums_transfers_per_peer() -> None:
    requests = Requests("d1", "decode", clock=Tick())
    for peer, seconds, ok in (("p1", 0.03, True), ("p1", 0.05, False), ("p0", 0.001, True), (None, 0.002, True)):
        with requests.request() as req:
            req.kv_transfer(seconds, 1 << 20, ok=ok, peer=peer)
            req.token()
    out = requests.take()
    assert out["kv_transfer_peers"] == {
        "p1": {"seconds": pytest.approx(0.08), "count": 2, "failures": 1, "bytes": 2 << 20},
        "p0": {"seconds": pytest.approx(0.001), "count": 1, "failures": 0, "bytes": 1 << 20}}
    assert out["sums"]["kv_transfer"] == pytest.approx(0.083) and out["kv_transfer_failures"] == 1, \
        "the transfer without a peer counts in the totals"
    ServingStats.model_validate(out)
    assert "kv_transfer_peers" not in requests.take(), "no peer said: the field is not sent"


def test_the_sdk_never_sends_what_the_wire_refuses() -> None:
    requests = Requests("d1", "decode", clock=Tick())
    with requests.request() as req:
        for peer in ("bad name", "", "-p", "x" * 65, 7):
            req.kv_transfer(0.01, peer=peer)  # type: ignore[arg-type]
        req.token()
    for n in range(MAX_KV_PEERS + 5):
        with requests.request() as req:
            req.kv_transfer(0.01, peer=f"p{n}")
            req.token()
    out = requests.take()
    assert len(out["kv_transfer_peers"]) == MAX_KV_PEERS and "bad name" not in out["kv_transfer_peers"]
    assert sum(out["histograms"]["kv_transfer"].values()) == 5 + MAX_KV_PEERS + 5, "every transfer is counted"
    ServingStats.model_validate(out)


def test_sums_of_intervals_add_per_peer_and_stay_bounded() -> None:
    into = ServingStats(kv_transfer_peers={"p1": KvPeer(seconds=1.0, count=2, failures=1, bytes=10)})
    add_stats(into, ServingStats(kv_transfer_peers={"p1": KvPeer(seconds=0.5, count=1, bytes=5),
                                                    "p2": KvPeer(seconds=0.1, count=1)}))
    assert into.kv_transfer_peers["p1"] == KvPeer(seconds=1.5, count=3, failures=1, bytes=15)
    assert into.kv_transfer_peers["p2"] == KvPeer(seconds=0.1, count=1)
    full = ServingStats(kv_transfer_peers={f"p{n}": KvPeer(count=1) for n in range(MAX_KV_PEERS)})
    add_stats(full, ServingStats(kv_transfer_peers={"new": KvPeer(count=1), "p0": KvPeer(count=1)}))
    assert len(full.kv_transfer_peers) == MAX_KV_PEERS and full.kv_transfer_peers["p0"].count == 2


@pytest.fixture
def job(client, make_token, clock) -> ServingDriver:  # type: ignore[no-untyped-def]
    return ServingDriver(client, make_token, clock)


def test_the_decode_replicas_window_keeps_its_peers(job, client) -> None:  # type: ignore[no-untyped-def]
    job.requests(1, 10, ttft=0.3, tpot=0.03, kv=0.03)  # the driver's decode replica takes its KV from p0
    job.round()
    view = client.app.state.runtime.live.serving
    window = view.window(job.job, "d1", job.clock.time())
    assert window.kv_transfer_peers.keys() == {"p0"}
    assert window.kv_transfer_peers["p0"].model_dump() == {"seconds": pytest.approx(0.3), "count": 10, "failures": 0,
                                                           "bytes": 10 * (4 << 20)}
    assert view.window(job.job, "p0", job.clock.time()).kv_transfer_peers == {}


@pytest.mark.parametrize("peers, field", [
    ({"bad name": {"seconds": 0.1, "count": 1}}, "kv_transfer_peers"),
    ({"": {"count": 1}}, "kv_transfer_peers"),
    ({"x" * 65: {"count": 1}}, "kv_transfer_peers"),
    ({"p1": {"count": -1}}, "count"),
    ({"p1": {"seconds": "NaN"}}, "seconds"),
    ({"p1": {"count": 1, "rtt": 0.1}}, "rtt"),
    ({f"p{n}": {"count": 1} for n in range(MAX_KV_PEERS + 1)}, "kv_transfer_peers"),
])
def test_bad_peers_get_a_422_from_the_report_endpoint(job, client, peers, field) -> None:  # type: ignore[no-untyped-def]
    job.clock.advance(2.0)
    job.seq["node-b"] += 1
    body = report("node-b", job.seq["node-b"], accelerators=1, interval=2.0) | {"tasks": [{
        "job_id": job.job, "rank": 1, "pid": 5001, "serving": {"replica": "d1", "kv_transfer_peers": peers}}]}
    answer = client.post("/api/v1/nodes/node-b/reports", json=body, headers=job.agent)
    assert answer.status_code == 422 and field in answer.text, answer.text
