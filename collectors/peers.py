"""Which process on this node is at the other end of a TCP connection to the agent.

For a connection made from this node, the client's socket lives in the agent's network namespace, so
the kernel's socket table (one exact sock_diag query, or `/proc/net/tcp{,6}` where netlink is refused)
gives the socket's inode; the process that holds it has `socket:[inode]` among its file descriptors.
A connection from another host (or another network namespace, or through a proxy process) has no such
socket here, or it is held by the proxy: it is never taken for the process it names. Reading other
users' descriptors needs root (or CAP_SYS_PTRACE).

Costs, once per connection: one sock_diag query (~15 µs) and one `readlink` per descriptor of the claimed
process; the whole-node descriptor scan (ms) only when the claimed process does not hold the socket.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from pathlib import Path

PROC = Path("/proc")
MAX_DEPTH = 64  # how far up the parent chain `is_ancestor` walks
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR, TCP_ESTABLISHED = 4, 20, 1, 2, 1


def _v4_bytes(ip: str) -> bytes | None:
    try:
        packed = socket.inet_pton(socket.AF_INET6, ip) if ":" in ip else socket.inet_pton(socket.AF_INET, ip)
    except OSError:
        return None
    if len(packed) == 4:
        return packed
    return packed[12:] if packed[:12] == b"\0" * 10 + b"\xff\xff" else None


def _v6_bytes(ip: str) -> bytes | None:
    v4 = _v4_bytes(ip)
    if v4 is not None:
        return b"\0" * 10 + b"\xff\xff" + v4
    try:
        return socket.inet_pton(socket.AF_INET6, ip)
    except OSError:
        return None


def _proc_net_key(ip_bytes: bytes, port: int) -> str:
    """An address as /proc/net/tcp{,6} prints it: each 32-bit word in host byte order, then the port."""
    words = struct.unpack(f"={len(ip_bytes) // 4}I", ip_bytes)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def client_socket(client: tuple[str, int], server: tuple[str, int], proc: Path = PROC) -> tuple[int, int] | None:
    """(inode, uid) of the client's socket of the TCP connection client → server, when that socket is in this
    network namespace (a process on this node); None otherwise."""
    if proc == PROC:
        try:
            return _diag_lookup(client, server)
        except OSError:  # no sock_diag here (an old kernel, a sandbox): read the tables
            pass
    return _proc_net_lookup(client, server, proc)


def _diag_lookup(client: tuple[str, int], server: tuple[str, int]) -> tuple[int, int] | None:
    """One exact sock_diag query (what `ss` uses): ~15 µs, where /proc/net/tcp walks the whole table (ms)."""
    for family, encode in ((socket.AF_INET, _v4_bytes), (socket.AF_INET6, _v6_bytes)):
        here, there = encode(client[0]), encode(server[0])
        if here is None or there is None:
            continue
        sockid = (struct.pack("!HH", client[1], server[1]) + here.ljust(16, b"\0") + there.ljust(16, b"\0")
                  + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))  # any interface, no cookie
        request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(header + request)
            answer = nl.recv(8192)
        if struct.unpack_from("=H", answer, 4)[0] == NLMSG_ERROR:
            code = -struct.unpack_from("=i", answer, 16)[0]
            if code == errno.ENOENT:
                continue
            raise OSError(code, os.strerror(code))
        # inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue, wqueue, uid, inode
        state, (uid, inode) = answer[17], struct.unpack_from("=II", answer, 16 + 64)
        return (inode, uid) if state == TCP_ESTABLISHED and inode > 0 else None
    return None


def _proc_net_lookup(client: tuple[str, int], server: tuple[str, int], proc: Path) -> tuple[int, int] | None:
    for table, encode in (("tcp", _v4_bytes), ("tcp6", _v6_bytes)):
        here, there = encode(client[0]), encode(server[0])
        if here is None or there is None:
            continue
        needle = f" {_proc_net_key(here, client[1])} {_proc_net_key(there, server[1])} ".encode()
        try:
            text = (proc / "net" / table).read_bytes()
        except OSError:
            continue
        at = text.find(needle)
        if at < 0:
            continue
        end = text.find(b"\n", at)
        fields = text[at:end if end >= 0 else len(text)].split()
        # local rem st tx:rx tr:when retrnsmt uid timeout inode
        if len(fields) >= 9 and fields[2] == b"01" and int(fields[8]) > 0:
            return int(fields[8]), int(fields[6])
    return None


def holds_socket(pid: int, inode: int, proc: Path = PROC) -> bool:
    """Whether process `pid` has socket `inode` open (False when it is gone or its descriptors are unreadable)."""
    target = f"socket:[{inode}]"
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(fd_dir / name) == target:
                return True
        except OSError:
            continue
    return False


def pids(proc: Path = PROC) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


def parent_pid(pid: int, proc: Path = PROC) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def alive(pid: int, proc: Path = PROC) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def is_ancestor(ancestor: int, pid: int, proc: Path = PROC) -> bool:
    """Whether `ancestor` is `pid`'s parent, grandparent, …"""
    current: int | None = pid
    for _ in range(MAX_DEPTH):
        current = parent_pid(current, proc) if current else None
        if not current:
            return False
        if current == ancestor:
            return True
    return False


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every process below `pid`, nearest first (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for other in pids(proc):
        parent = parent_pid(other, proc)
        if parent is not None:
            children.setdefault(parent, []).append(other)
    out: list[int] = []
    frontier = [pid]
    while frontier and len(out) < 100_000:
        frontier = [c for p in frontier for c in children.get(p, [])]
        out.extend(frontier)
    return out


def socket_owner(inode: int, hint: int | None, proc: Path = PROC, *, beyond_hint: bool = True) -> int | None:
    """The process holding socket `inode`: `hint` (the pid a batch names) first, then (`beyond_hint`) the
    processes under it (its data-loader workers), then every process on the node; None when none is seen."""
    if hint is not None and holds_socket(hint, inode, proc):
        return hint
    if not beyond_hint:
        return None
    below = descendants(hint, proc) if hint is not None and alive(hint, proc) else []
    for pid in below:
        if holds_socket(pid, inode, proc):
            return pid
    seen = {hint, *below}
    for pid in pids(proc):
        if pid not in seen and holds_socket(pid, inode, proc):
            return pid
    return None
