"""RDMA ports (InfiniBand and RoCE) read from sysfs: state, rate and the fabric counters.

The tree is the kernel's ABI (Documentation/ABI/stable/sysfs-class-infiniband), under a root that stands for
`/sys` (`sentinel collector --source rdma --sysfs-root DIR`; client_python's `proc=` idea):

    DIR/class/infiniband/<device>/ports/<n>/{state,phys_state,rate,link_layer}
    DIR/class/infiniband/<device>/ports/<n>/counters/<name>     (PMA port counters)
    DIR/class/infiniband/<device>/ports/<n>/hw_counters/<name>  (driver counters; absent on many devices)

Counters become totals the agent keeps monotonic. A reading lower than the last one is a wrap when the last one
was near the top of a 32- or 64-bit range (the difference is added across the wrap), else a reset (`perfquery
-R`, a driver reload: the new reading is counted from zero, and that window has no rate). The PMA's narrow error
counters (8/16-bit) do not wrap, they stick at their maximum: such a counter is listed as `saturated`.

A file that is missing, empty, "N/A", non-numeric or unreadable leaves its field out and is counted by reason
(`sentinel_plugin_errors_total{plugin="rdma:<reason>"}`); a device that disappears drops its ports, with a
`link_down` event for each that was ACTIVE. A thread polls every port's state twice a second and pushes
`link_down` / `link_up` at once (NVSentinel checks link state every second).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from collectors.base import Collector, EmitEvent, Readings, SourceUnavailable, register
from sentinel.telemetry.schemas import Assignment, HardwareEvent, NicPort

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
MAX_PORTS = 64  # the wire schema's bound on NodeReport.nics
MAX_COUNTERS = 128  # and on NicPort.counters
DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")  # in 4-octet units: reported as bytes
WORDS = 4
# PMA PortCounters widths (IBTA vol. 1, 16.1.3.5): these saturate at their maximum rather than wrap.
NARROW: dict[str, int] = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
}
WRAP_NEAR = 0.75  # a drop from above this share of a range's top is a wrap, not a reset


def read_text(path: Path, errors: dict[str, int]) -> str | None:
    """The file's stripped text, or None (counted) when it is missing, unreadable, empty or "N/A"."""
    try:
        text = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        reason = "missing"
    except OSError:  # EACCES, or EINVAL from a counter the device does not support
        reason = "unreadable"
    else:
        if text and text.upper() not in ("N/A", "NA"):
            return text
        reason = "empty" if not text else "not_available"
    errors[reason] = errors.get(reason, 0) + 1
    return None


def read_number(path: Path, errors: dict[str, int]) -> int | None:
    text = read_text(path, errors)
    if text is None:
        return None
    try:
        value = int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        errors["non_numeric"] = errors.get("non_numeric", 0) + 1
        return None
    if value < 0:
        errors["non_numeric"] = errors.get("non_numeric", 0) + 1
        return None
    return value


def parse_state(text: str | None) -> tuple[int | None, str | None]:
    """"4: ACTIVE" → (4, "ACTIVE"); "5: LinkUp" → (5, "LinkUp")."""
    if not text:
        return None, None
    number, sep, name = text.partition(":")
    if not sep:
        return None, text[:32]
    try:
        ident = int(number.strip())
    except ValueError:
        return None, name.strip()[:32] or None
    return (ident if 0 <= ident <= 15 else None), name.strip()[:32] or None


def parse_rate(text: str | None) -> float | None:
    """"100 Gb/sec (4X EDR)" → bytes per second."""
    if not text:
        return None
    try:
        gbits = float(text.split()[0])
    except (ValueError, IndexError):
        return None
    return gbits * 1e9 / 8 if gbits >= 0 else None


def advance(last: int, now: int) -> tuple[int, bool]:
    """(how much the counter grew from `last` to `now`, whether that is exact). Never negative."""
    if now >= last:
        return now - last, True
    for bits in (32, 64):
        top = 2**bits
        if last < top and last >= top * WRAP_NEAR and now < top * (1 - WRAP_NEAR):
            return top - last + now, True
    return now, False  # reset: what it counted since is all we know, and the window has no rate


@dataclass
class _Counter:
    raw: int  # the last reading, in the kernel's units
    total: int  # monotonic, in reported units


@dataclass
class _PortState:
    counters: dict[str, _Counter] = field(default_factory=dict)
    read_at: float = 0.0
    active: bool | None = None
    flaps: int = 0


class RdmaCollector(Collector):
    name = "rdma"

    def __init__(self, root: Path | str = "/sys", node: str = "", *, poll_seconds: float = POLL_SECONDS):
        self.root = Path(root)
        self.base = self.root / "class" / "infiniband"
        if not self.base.is_dir():
            raise SourceUnavailable(f"no RDMA devices: {self.base} is not a directory")
        self.node = node
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, int], _PortState] = {}
        self._errors: dict[str, int] = {}
        self._emit: EmitEvent | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- discovery -------------------------------------------------------------------------

    def port_dirs(self) -> list[tuple[str, int, Path]]:
        found: list[tuple[str, int, Path]] = []
        try:
            devices = sorted(p for p in self.base.iterdir() if p.is_dir())
        except OSError:
            self._count("unreadable")
            return []
        for device in devices:
            try:
                ports = sorted((p for p in (device / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
            except OSError:
                continue  # a device going away between the two listings
            found.extend((device.name, int(p.name), p) for p in ports)
        return found[:MAX_PORTS]

    def _count(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._errors[reason] = self._errors.get(reason, 0) + n

    def error_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._errors)

    # -- collecting ------------------------------------------------------------------------

    def collect(self, assignments: list[Assignment]) -> Readings:
        self.poll_links()  # a change since the last poll is an event first, then in this reading
        errors: dict[str, int] = {}
        ports = [self._read_port(device, number, path, errors) for device, number, path in self.port_dirs()]
        for reason, n in errors.items():
            self._count(reason, n)
        return Readings(nics=ports)

    def _read_port(self, device: str, number: int, path: Path, errors: dict[str, int]) -> NicPort:
        state_id, state = parse_state(read_text(path / "state", errors))
        phys_id, phys = parse_state(read_text(path / "phys_state", errors))
        rate_text = read_text(path / "rate", errors)
        rate = parse_rate(rate_text)
        if rate_text is not None and rate is None:
            errors["non_numeric"] = errors.get("non_numeric", 0) + 1
        raw = self._read_counters(path / "counters", errors, required=True)
        raw |= self._read_counters(path / "hw_counters", errors, required=False)
        now = time.monotonic()
        with self._lock:
            live = self._ports.setdefault((device, number), _PortState())
            totals, rates, saturated = self._fold(live, raw, now)
            flaps = live.flaps  # the state itself moves only in poll_links, which emits the event
        return NicPort(device=device, port=number, state=state, state_id=state_id, phys_state=phys,
                       phys_state_id=phys_id, rate_bytes_per_second=rate,
                       link_layer=read_text(path / "link_layer", errors), counters=totals, rates=rates,
                       link_flaps_total=flaps, saturated=saturated)

    def _read_counters(self, directory: Path, errors: dict[str, int], *, required: bool) -> dict[str, int]:
        try:
            names = sorted(p.name for p in directory.iterdir())
        except FileNotFoundError:
            if required:
                errors["missing"] = errors.get("missing", 0) + 1
            return {}
        except OSError:
            errors["unreadable"] = errors.get("unreadable", 0) + 1
            return {}
        out: dict[str, int] = {}
        for name in names[:MAX_COUNTERS]:
            if not name.replace("_", "").isalnum() or len(name) > 64:
                continue
            value = read_number(directory / name, errors)
            if value is not None:
                out[name] = value
        return out

    @staticmethod
    def _fold(live: _PortState, raw: dict[str, int], now: float) -> tuple[dict[str, int], dict[str, float],
                                                                          list[str]]:
        """Fold this reading into the port's monotonic totals; (totals, rates per second, saturated names)."""
        elapsed = now - live.read_at if live.read_at else 0.0
        rates: dict[str, float] = {}
        saturated: list[str] = []
        for name, value in raw.items():
            scale = WORDS if name in DATA_COUNTERS else 1
            counter = live.counters.get(name)
            if counter is None:
                live.counters[name] = _Counter(raw=value, total=value * scale)
            else:
                grown, exact = advance(counter.raw, value)
                counter.raw, counter.total = value, counter.total + grown * scale
                if exact and elapsed > 0:
                    rates[name] = grown * scale / elapsed
            width = NARROW.get(name)
            if width is not None and value >= 2**width - 1:
                saturated.append(name)
        live.read_at = now
        totals = {name: c.total for name, c in live.counters.items() if name in raw}
        return totals, rates, saturated

    # -- link state --------------------------------------------------------------------------

    def start(self, emit_event: EmitEvent) -> None:
        self._emit = emit_event
        self.poll_links()  # the first poll only learns the states
        self._thread = threading.Thread(target=self._watch, name="sentinel-rdma-links", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll_links()
            except Exception:  # a watcher that dies silently would hide every later link_down
                log.exception("rdma link poll failed: node=%s", self.node)

    def poll_links(self) -> list[HardwareEvent]:
        """Read every port's state; a port that left ACTIVE (or whose device is gone) gives link_down, one
        that came back link_up. The events are emitted, and returned for the caller's tests."""
        seen: dict[tuple[str, int], str | None] = {}
        errors: dict[str, int] = {}
        for device, number, path in self.port_dirs():
            seen[(device, number)] = parse_state(read_text(path / "state", errors))[1]
        events: list[HardwareEvent] = []
        with self._lock:
            for key, live in list(self._ports.items()):
                if key not in seen:
                    if live.active:
                        events.append(self._event("link_down", key, "device gone from sysfs"))
                    del self._ports[key]
            for key, state in seen.items():
                live = self._ports.setdefault(key, _PortState())
                was = live.active
                changed = self._note_state(live, state)
                if changed and was is not None:
                    kind = "link_up" if live.active else "link_down"
                    events.append(self._event(kind, key, f"port state {state or 'unreadable'}"))
        for event in events:
            log.warning("rdma %s: node=%s nic=%s %s", event.kind, self.node, event.nic, event.message)
            if self._emit is not None:
                self._emit(event)
        return events

    @staticmethod
    def _note_state(live: _PortState, state: str | None) -> bool:
        """Record the port's state; True when it moved between ACTIVE and not. An unreadable state changes
        nothing (a read error is not a link going down)."""
        if state is None:
            return False
        active = state == "ACTIVE"
        if live.active is None:
            live.active = active
            return False
        if active == live.active:
            return False
        if live.active and not active:
            live.flaps += 1
        live.active = active
        return True

    @staticmethod
    def _event(kind: str, key: tuple[str, int], message: str) -> HardwareEvent:
        return HardwareEvent.model_validate({"kind": kind, "nic": f"{key[0]}/{key[1]}", "message": message,
                                             "observed_at": time.time()})

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_seconds + 1.0)


def _factory(argument: str | None, node: str) -> RdmaCollector:
    return RdmaCollector(argument or "/sys", node)


register("rdma", _factory)
