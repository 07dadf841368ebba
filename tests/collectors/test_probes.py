"""The probe mesh's ends on loopback: a real UDP responder and prober."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from collectors.probes import MAGIC, MAX_TARGETS, PACKET, Prober, ProbeResponder, percentile
from sentinel.telemetry.schemas import ProbeTarget


@pytest.fixture
def responder() -> Iterator[ProbeResponder]:
    r = ProbeResponder("127.0.0.1", 0, node="peer")
    r.start()
    yield r
    r.close()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_probe_comes_back_with_its_rtt(responder: ProbeResponder) -> None:
    prober = Prober("me", timeout_seconds=0.5)
    prober.set_targets([ProbeTarget(node="peer", address=responder.address)])
    rtts = [prober.probe_round()["peer"] for _ in range(5)]
    assert all(r is not None and 0 < r < 0.5 for r in rtts)
    (result,) = prober.drain()
    assert (result.target, result.sent, result.received, result.loss_ratio) == ("peer", 5, 5, 0.0)
    assert result.rtt_p50_seconds is not None and result.rtt_p50_seconds <= (result.rtt_max_seconds or 0)
    assert responder.answered_total == 5 and prober.sent_total == 5 and prober.lost_total == 0
    assert prober.drain() == []  # nothing sent since
    prober.close()


def test_a_peer_that_stops_answering_is_a_loss_in_a_window_of_its_own(responder: ProbeResponder) -> None:
    lost: list[str] = []
    prober = Prober("me", timeout_seconds=0.2, on_loss=lost.append)
    prober.set_targets([ProbeTarget(node="peer", address=responder.address)])
    assert prober.probe_round()["peer"] is not None
    responder.close()  # the peer is gone: its port answers nothing (or ICMP unreachable)
    assert prober.probe_round() == {"peer": None}
    assert prober.probe_round() == {"peer": None}
    assert lost == ["peer"]  # once, on the change
    answered, silent = prober.drain()
    assert (answered.sent, answered.received) == (1, 1)
    assert (silent.sent, silent.received, silent.rtt_p50_seconds, silent.loss_ratio) == (2, 0, None, 1.0)
    # the last answer came before the first loss's deadline: the server orders them on these times
    assert answered.started_at <= answered.ended_at < silent.started_at <= silent.ended_at
    assert prober.lost_total == 2
    prober.close()


def test_a_target_that_never_answered_is_lost_not_an_exception() -> None:
    lost: list[str] = []
    prober = Prober("me", timeout_seconds=0.1, on_loss=lost.append)
    prober.set_targets([ProbeTarget(node="ghost", address=f"127.0.0.1:{free_udp_port()}"),
                        ProbeTarget(node="far", address="192.0.2.1:9")])  # TEST-NET-1: no route here, or silence
    assert prober.probe_round() == {"far": None, "ghost": None}
    assert sorted(lost) == ["far", "ghost"]
    assert {r.target: r.received for r in prober.drain()} == {"far": 0, "ghost": 0}
    prober.close()


def test_only_ip_literals_are_probed_never_this_node_and_never_too_many() -> None:
    prober = Prober("me")
    prober.set_targets([ProbeTarget(node="named", address="example.com:9000"),
                        ProbeTarget(node="me", address="127.0.0.1:9000"),
                        ProbeTarget(node="any", address="0.0.0.0:9000"),
                        ProbeTarget(node="noport", address="10.0.0.1"),
                        ProbeTarget(node="v6", address="[::1]:9000"),
                        ProbeTarget(node="ok", address="10.0.0.2:9000")])
    assert prober.targets() == {"v6": ("::1", 9000), "ok": ("10.0.0.2", 9000)}
    prober.set_targets([ProbeTarget(node="long", address="[0:0::1]:9000")])
    assert prober.targets() == {"long": ("::1", 9000)}, "normalised, so the reply's address matches"
    prober.set_targets([ProbeTarget(node=f"n{i}", address=f"10.0.0.{i % 250 + 1}:9000") for i in range(200)])
    assert len(prober.targets()) == MAX_TARGETS
    prober.close()


def test_the_responder_refuses_what_is_not_a_probe(responder: ProbeResponder) -> None:
    host, port = responder.address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.3)
        s.sendto(b"GET / HTTP/1.0\r\n\r\n", (host, int(port)))
        s.sendto(b"SNTP" + b"x" * 200, (host, int(port)))  # right magic, wrong size: no amplification
        with pytest.raises(TimeoutError):
            s.recvfrom(1024)
        probe = PACKET.pack(MAGIC, 7, b"12345678")
        s.sendto(probe, (host, int(port)))
        reply, _ = s.recvfrom(1024)
    assert len(reply) == len(probe) and reply[:4] == b"SNTR" and reply[4:] == probe[4:]
    assert responder.refused_total == 2 and responder.answered_total == 1


def test_the_responder_is_rate_limited() -> None:
    r = ProbeResponder("127.0.0.1", 0, rate=1.0, burst=3.0)
    r.start()
    host, port = r.address.rsplit(":", 1)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.3)
            for seq in range(20):
                s.sendto(PACKET.pack(MAGIC, seq, b"12345678"), (host, int(port)))
            got = 0
            try:
                while True:
                    s.recvfrom(64)
                    got += 1
            except TimeoutError:
                pass
        assert got == 3 and r.limited_total == 17
    finally:
        r.close()


def test_a_reply_that_matches_no_probe_is_counted_as_stray(responder: ProbeResponder) -> None:
    prober = Prober("me", timeout_seconds=0.3)
    prober.set_targets([ProbeTarget(node="peer", address=responder.address)])
    assert prober.probe_round()["peer"] is not None  # opens the prober's socket
    sock = next(iter(prober._socks.values()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as forger:
        forger.sendto(b"SNTR" + PACKET.pack(MAGIC, 1, b"wrongnon")[4:], sock.getsockname())
        forger.sendto(b"short", sock.getsockname())
    assert prober.probe_round()["peer"] is not None
    assert prober.stray_total == 2
    prober.close()


def test_the_prober_thread_probes_every_interval(responder: ProbeResponder) -> None:
    prober = Prober("me", interval_seconds=0.05, timeout_seconds=0.04)
    prober.set_targets([ProbeTarget(node="peer", address=responder.address)])
    prober.start()
    deadline = time.monotonic() + 3
    while prober.sent_total < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    prober.close()
    assert prober.sent_total >= 5 and sum(r.received for r in prober.drain()) >= 4


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
