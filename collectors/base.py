"""The contract every source of readings fulfils, and the name → factory table.

A source that fails to start is logged and skipped by the agent (node-problem-detector style);
a source that raises OSError while collecting is skipped for that interval only.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field

from sentinel.telemetry.schemas import (
    AcceleratorInfo,
    AcceleratorSample,
    Assignment,
    HardwareEvent,
    HostMetrics,
    NicPort,
)

EmitEvent = Callable[[HardwareEvent], None]


class SourceUnavailable(RuntimeError):
    """The source cannot run on this machine (no driver, no device); the agent goes on without it."""


@dataclass
class Readings:
    host: HostMetrics | None = None
    accelerators: list[AcceleratorSample] = field(default_factory=list)
    nics: list[NicPort] = field(default_factory=list)


class Collector(abc.ABC):
    """One source of readings on a node: host, nvml, rdma or sim."""

    name: str = "collector"

    def start(self, emit_event: EmitEvent) -> None:  # noqa: B027 - optional hook
        """Begin watching for fault events; `emit_event` may be called from any thread."""

    def accelerators(self) -> list[AcceleratorInfo]:
        """The accelerators this source reports on (empty for host)."""
        return []

    @abc.abstractmethod
    def collect(self, assignments: list[Assignment]) -> Readings:
        """Read the current values. `assignments` are the tasks the server placed on this node."""

    def error_counts(self) -> dict[str, int]:
        """Bad inputs the source skipped and counted so far, by reason (`sentinel_plugin_errors_total` on the
        agent's /metrics, label plugin="<source>:<reason>")."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles and stop background threads."""


# (argument after the colon, node name) → source
Factory = Callable[[str | None, str], Collector]
_FACTORIES: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    _FACTORIES[name] = factory


def _import_builtin_sources() -> None:
    import collectors.host
    import collectors.nvml
    import collectors.rdma
    import collectors.sim  # noqa: F401 - the built-in sources register themselves on import


def registered() -> list[str]:
    """The source names `create` accepts (the part of a spec before the colon), sorted."""
    _import_builtin_sources()
    return sorted(_FACTORIES)


def create(spec: str, node: str) -> Collector:
    """Build a source from its spec: `host`, `nvml`, `sim:4`."""
    _import_builtin_sources()
    name, _, argument = spec.partition(":")
    if name not in _FACTORIES:
        known = ", ".join(sorted(_FACTORIES))
        raise ValueError(f"unknown source {name!r} (known: {known})")
    return _FACTORIES[name](argument or None, node)
