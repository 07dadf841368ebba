"""A small real network on this machine, for tests and benchmarks that need more than loopback.

Topology for ``Lab(3)`` (``P`` is the per-lab prefix ``snt<pid % 10000>l<n>``, ``x`` a free 10.x.0.0/24
with x in 200..250 that nothing on this machine routes yet)::

    root namespace
      P-br  (Linux bridge, 10.x.0.1/24 = lab.gateway)
       |            |            |
      P-h0         P-h1         P-h2          host ends of the veth pairs, enslaved to P-br
       |            |            |
    +--------+   +--------+   +--------+
    | eth0   |   | eth0   |   | eth0   |     namespace P-0, P-1, P-2: lo up, rp_filter off,
    | .10    |   | .11    |   | .12    |     eth0 = 10.x.0.(10+i)/24
    +--------+   +--------+   +--------+
        \\___ P-t1 ... P-t0 ___/              only while degrade_pair(0, 1, ...) is active:
              DelayLink thread                a TUN device per side and a /32 route to the peer

Why TUN and not netem: this kernel has no ``sch_netem``, so ``tc qdisc ... netem delay`` is unavailable.
``degrade_pair(i, j, delay, loss)`` instead routes i<->j traffic (and only that) into a TUN device in
each of the two namespaces; a userspace thread in this process (:mod:`tests.network.delaylink`) holds both
TUN fds and copies each IP packet across after ``delay`` seconds, dropping ``loss`` of them. Packets keep
the real eth0 addresses, so UDP and TCP between i and j still work, just slower.

What it touches: only what it creates - its own namespaces, veth pairs, bridge and TUN devices, all named
with the lab's prefix, plus the processes started through :meth:`Lab.popen`. Every one of them is
removed by ``__exit__``/:meth:`Lab.close`, by an ``atexit`` hook, or when setup fails halfway; nothing
is deleted that this lab did not create. No sysctl, route or firewall rule of the root namespace changes
(beyond the connected route of the bridge's own address, which goes away with the bridge).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from tests.network.delaylink import DelayLink, open_tun

_COUNTER = itertools.count()
_LIVE: set[Lab] = set()  # strong refs: a forgotten lab is still cleaned up at exit
_LOCK_PATH = "/tmp/sentinel-netlab.lock"


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    address: str
    host_veth: str


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip <args>``; raise with its stderr when ``check`` and it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network routed or addressed in the root namespace (the default route excepted)."""
    nets = []
    routes = _ip("-4", "route", "show", "table", "all").stdout.splitlines()
    addrs = [line.split()[1] for line in _ip("-4", "-o", "addr").stdout.splitlines() if " inet " in line]
    for token in [*(r.split()[0] for r in routes if r.split()), *addrs]:
        try:
            nets.append(ipaddress.ip_network(token, strict=False))
        except ValueError:
            continue  # 'default', 'local', 'broadcast', ...
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def _free_subnet_octet() -> int:
    used = _used_networks()
    start = os.getpid() % 51
    for k in range(51):
        x = 200 + (start + k) % 51
        candidate = ipaddress.ip_network(f"10.{x}.0.0/24")
        if not any(candidate.overlaps(n) for n in used):
            return x
    raise RuntimeError("no free 10.x.0.0/24 with x in 200..250")


class Lab:
    """``n_hosts`` network namespaces on one bridge; see the module docstring."""

    _available: str | bool | None = False  # False = not probed yet

    def __init__(self, n_hosts: int, seed: int = 0) -> None:
        if not 1 <= n_hosts <= 99:
            raise ValueError("n_hosts must be in 1..99")
        self.prefix = f"snt{os.getpid() % 10000}l{next(_COUNTER)}"
        self.bridge = f"{self.prefix}-br"
        self.seed = seed
        self.hosts: list[Host] = []
        self.gateway = ""
        self._namespaces: list[str] = []
        self._links: list[str] = []  # root-namespace devices we created, in creation order
        self._procs: list[subprocess.Popen[Any]] = []
        self._pairs: dict[tuple[int, int], DelayLink] = {}
        self._closed = False
        _LIVE.add(self)
        try:
            self._build(n_hosts)
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------------------------------
    def _build(self, n_hosts: int) -> None:
        with open(_LOCK_PATH, "a") as lock:  # serialise subnet choice between concurrent processes
            fcntl.flock(lock, fcntl.LOCK_EX)
            x = _free_subnet_octet()
            _ip("link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            self.gateway = f"10.{x}.0.1"
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(n_hosts):
            self.hosts.append(self._add_host(i, f"10.{x}.0.{10 + i}"))

    def _add_host(self, i: int, address: str) -> Host:
        ns, host_end, ns_end = f"{self.prefix}-{i}", f"{self.prefix}-h{i}", f"{self.prefix}-n{i}"
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        self._links.append(host_end)
        _ip("link", "set", ns_end, "netns", ns)
        _ip("link", "set", host_end, "master", self.bridge)
        _ip("link", "set", host_end, "up")
        self._ns_ip(ns, "link", "set", ns_end, "name", "eth0")
        self._ns_ip(ns, "addr", "add", f"{address}/24", "dev", "eth0")
        self._ns_ip(ns, "link", "set", "lo", "up")
        self._ns_ip(ns, "link", "set", "eth0", "up")
        for scope in ("all", "default", "eth0"):
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.conf.{scope}.rp_filter=0"],
                           check=True, capture_output=True, timeout=30)
        return Host(i, ns, address, host_end)

    @staticmethod
    def _ns_ip(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _ip("-n", ns, *args, check=check)

    # -- processes -----------------------------------------------------------------------------------
    def popen(self, i: int, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in host ``i``'s namespace; it is killed (with its group) when the lab closes."""
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[i].namespace, *argv], **kw)
        self._procs.append(proc)
        return proc

    def run(self, i: int, argv: list[str], timeout: float = 30.0, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in host ``i``'s namespace to completion, capturing text output."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", self.hosts[i].namespace, *argv], timeout=timeout, **kw)

    # -- faults --------------------------------------------------------------------------------------
    def link_down(self, i: int) -> None:
        """Cut host ``i`` off: its veth's bridge end goes down."""
        _ip("link", "set", self.hosts[i].host_veth, "down")

    def link_up(self, i: int) -> None:
        _ip("link", "set", self.hosts[i].host_veth, "up")

    def _tun_name(self, peer: int) -> str:
        return f"{self.prefix}-t{peer}"

    def degrade_pair(self, i: int, j: int, delay_seconds: float, loss_ratio: float = 0.0) -> None:
        """Make only the i<->j path ``delay_seconds`` slower each way and drop ``loss_ratio`` of it."""
        key = (min(i, j), max(i, j))
        if i == j or key in self._pairs:
            raise ValueError(f"pair {key} is the same host or already degraded")
        DelayLink.check(delay_seconds, loss_ratio)
        fds: list[int] = []
        try:
            for me, peer in ((i, j), (j, i)):
                ns, tun = self.hosts[me].namespace, self._tun_name(peer)
                self._ns_ip(ns, "tuntap", "add", "dev", tun, "mode", "tun")
                fds.append(open_tun(ns, tun))
                self._ns_ip(ns, "link", "set", tun, "up")
                self._ns_ip(ns, "route", "add", f"{self.hosts[peer].address}/32", "dev", tun,
                            "src", self.hosts[me].address)
            self._pairs[key] = DelayLink(fds[0], fds[1], delay_seconds, loss_ratio, seed=self.seed).start()
        except BaseException:
            for fd in fds:
                os.close(fd)
            self._remove_tuns(i, j)
            raise

    def _remove_tuns(self, i: int, j: int) -> None:
        for me, peer in ((i, j), (j, i)):
            ns, tun = self.hosts[me].namespace, self._tun_name(peer)
            self._ns_ip(ns, "route", "del", f"{self.hosts[peer].address}/32", "dev", tun, check=False)
            self._ns_ip(ns, "link", "del", tun, check=False)

    def restore_pair(self, i: int, j: int) -> None:
        """Undo :meth:`degrade_pair`: routes and TUN devices removed, forwarder stopped."""
        link = self._pairs.pop((min(i, j), max(i, j)), None)
        if link is None:
            raise ValueError(f"pair ({i}, {j}) is not degraded")
        link.stop()
        self._remove_tuns(i, j)

    # -- teardown ------------------------------------------------------------------------------------
    def _kill_processes(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()

    def close(self) -> None:
        """Remove everything this lab created (idempotent; also run at interpreter exit)."""
        if self._closed:
            return
        self._closed = True
        for link in self._pairs.values():
            link.stop()
        self._pairs.clear()
        self._kill_processes()
        for ns in reversed(self._namespaces):
            _ip("netns", "del", ns, check=False)
        for dev in reversed(self._links):  # veth host ends usually vanish with their namespace
            if _ip("link", "show", "dev", dev, check=False).returncode == 0:
                _ip("link", "del", dev, check=False)
        self._namespaces.clear()
        self._links.clear()
        _LIVE.discard(self)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- capability probe ----------------------------------------------------------------------------
    @classmethod
    def available(cls) -> str | None:
        """None when a lab can be built here, else why not (a reason for ``pytest.skip``)."""
        if cls._available is False:
            cls._available = _probe()
        return cls._available  # type: ignore[return-value]


def _probe() -> str | None:
    if os.geteuid() != 0:
        return "network lab needs root"
    if shutil.which("ip") is None:
        return "network lab needs iproute2 'ip'"
    if not os.path.exists("/dev/net/tun"):
        return "network lab needs /dev/net/tun"
    name = f"snt{os.getpid() % 10000}probe"
    try:
        added = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"ip netns add failed: {exc}"
    if added.returncode != 0:
        return f"ip netns add failed: {added.stderr.strip()}"
    deleted = _ip("netns", "del", name, check=False)
    if deleted.returncode != 0:
        return f"ip netns del failed: {deleted.stderr.strip()}"
    return None


@atexit.register
def _close_all() -> None:
    for lab in list(_LIVE):
        lab.close()
