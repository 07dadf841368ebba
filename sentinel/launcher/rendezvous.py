"""Is an attempt's rendezvous port listening yet? Read from /proc/net/tcp{,6}, without connecting to it.

A warm restart starts every rank within milliseconds; a rank that dials rank 0's TCPStore before it listens
backs off for ~0.5 s (torch's client retry), longer than the whole warm restart. So once an attempt showed
that its rank 0 listens on MASTER_PORT, the next warm attempt starts rank 0 first and the others as soon as
the port listens (local.py), bounded so that a job that listens late loses little.
"""

from __future__ import annotations

import time
from pathlib import Path

LISTEN = "0A"


def listening(port: int, proc: Path = Path("/proc")) -> bool:
    """A socket in LISTEN state on `port` (any address, IPv4 or IPv6) on this machine's network namespace."""
    wanted = f":{port:04X}"
    for name in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN and fields[1].endswith(wanted):
                return True
    return False


def wait_listening(port: int, timeout_seconds: float, poll_seconds: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while True:
        if listening(port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_seconds)
