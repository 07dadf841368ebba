"""The live-test helpers themselves."""

from __future__ import annotations

from tests.live import free_port


def test_free_port_never_hands_out_a_port_twice():
    # 2,000 binds to port 0 over the ~28k ephemeral ports offer some port twice (about 70 pairs expected):
    # two daemons configured with two such "free" ports then collide on one.
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
