"""The network lab itself: real namespaces on a bridge, a link cut, one pair slowed or made lossy through
the TUN delay line while the others stay fast, the root namespace reachable at the gateway, and nothing
left behind afterwards."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.network.netlab import Lab

pytestmark = pytest.mark.netns

PORT = 9555
SERVER = f"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", {PORT}))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""
CLIENT = """
import socket, sys, time
addr, port, count, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(timeout)
best = None
for n in range(count):
    t0 = time.perf_counter()
    s.sendto(str(n).encode(), (addr, port))
    try:
        while s.recv(2048) != str(n).encode():
            pass
    except socket.timeout:
        continue
    rtt = time.perf_counter() - t0
    best = rtt if best is None else min(best, rtt)
print("TIMEOUT" if best is None else f"RTT {best * 1000:.3f}")
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    reason = Lab.available()
    if reason is not None:
        pytest.skip(reason)
    with Lab(3) as built:
        server = built.popen(1, [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield built


def rtt_ms(lab: Lab, client: int, server: int = 1, count: int = 5, timeout: float = 0.5) -> float | None:
    """Best echo RTT in ms from host ``client`` to the server in host ``server``; None on timeout."""
    argv = [sys.executable, "-c", CLIENT, lab.hosts[server].address, str(PORT), str(count), str(timeout)]
    done = lab.run(client, argv, timeout=30)
    assert done.returncode == 0, done.stderr
    word, *value = done.stdout.split()
    return None if word == "TIMEOUT" else float(value[0])


def test_hosts_have_their_own_namespaces_and_addresses(lab: Lab) -> None:
    assert [h.index for h in lab.hosts] == [0, 1, 2]
    assert len({h.namespace for h in lab.hosts}) == 3
    assert lab.gateway.endswith(".0.1")
    for host in lab.hosts:
        shown = lab.run(host.index, ["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
        assert f"inet {host.address}/24" in shown


def test_echo_answers_both_clients(lab: Lab) -> None:
    for client in (0, 2):
        rtt = rtt_ms(lab, client)
        assert rtt is not None and rtt < 10, (client, rtt)


def test_link_down_cuts_the_host_and_link_up_restores_it(lab: Lab) -> None:
    lab.link_down(1)
    try:
        assert rtt_ms(lab, 0, count=2, timeout=0.3) is None
    finally:
        lab.link_up(1)
    for _ in range(20):  # the bridge port needs a moment to forward again
        if rtt_ms(lab, 0, count=1, timeout=0.3) is not None:
            break
    rtt = rtt_ms(lab, 0)
    assert rtt is not None and rtt < 10


def test_degrade_pair_slows_only_that_pair(lab: Lab) -> None:
    lab.degrade_pair(0, 1, 0.02)
    try:
        slow, fast = rtt_ms(lab, 0), rtt_ms(lab, 2)
        assert slow is not None and slow >= 40, slow
        assert fast is not None and fast < 10, fast
        tun = lab.run(0, ["ip", "-o", "link", "show"]).stdout
        assert f"{lab.prefix}-t1" in tun
    finally:
        lab.restore_pair(0, 1)
    rtt = rtt_ms(lab, 0)
    assert rtt is not None and rtt < 10, rtt
    assert f"{lab.prefix}-t1" not in lab.run(0, ["ip", "-o", "link", "show"]).stdout


def test_total_loss_drops_only_that_pair(lab: Lab) -> None:
    lab.degrade_pair(0, 1, 0.0, loss_ratio=1.0)
    try:
        assert rtt_ms(lab, 0, count=3, timeout=0.3) is None
        rtt = rtt_ms(lab, 2)
        assert rtt is not None and rtt < 10, rtt
    finally:
        lab.restore_pair(0, 1)
    assert rtt_ms(lab, 0) is not None


def test_host_reaches_a_tcp_server_on_the_gateway(lab: Lab) -> None:
    listener = socket.create_server((lab.gateway, 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            got.append(conn.recv(100))
            conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    code = (f"import socket; c = socket.create_connection(({lab.gateway!r}, {port}), timeout=5); "
            "c.sendall(b'ping'); print(c.recv(100).decode())")
    done = lab.run(0, [sys.executable, "-c", code], timeout=20)
    thread.join(timeout=10)
    listener.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pong"
    assert got == [b"ping"]


def _names() -> str:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    return netns + links


def test_nothing_is_left_after_exit() -> None:
    reason = Lab.available()
    if reason is not None:
        pytest.skip(reason)
    with Lab(2) as small:
        small.popen(0, ["sleep", "60"])
        small.degrade_pair(0, 1, 0.01)
        inside = _names()
        assert f"{small.prefix}-0" in inside and f"{small.prefix}-br" in inside
        assert f"{small.prefix}-h1" in inside
        proc = small._procs[0]
    assert proc.poll() is not None
    left = _names()
    assert f"{small.prefix}-" not in left, left
