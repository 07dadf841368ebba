"""Builders for wire payloads used across tests."""

from __future__ import annotations

from typing import Any


def registration(name: str = "node-a", accelerators: int = 2, interval: float = 5.0) -> dict[str, Any]:
    return {"name": name, "hostname": f"{name}.test", "interval_seconds": interval, "agent_version": "test",
            "sources": ["sim"],
            "accelerators": [{"uuid": f"SIM-{name}-{i}", "index": i, "model": "sim-h100-80gb",
                              "memory_total_bytes": 80 * 2**30, "source": "sim", "simulated": True}
                             for i in range(accelerators)]}


def sample(uuid: str, utilization: float = 0.5) -> dict[str, Any]:
    return {"uuid": uuid, "utilization_ratio": utilization, "memory_used_bytes": 2**30,
            "memory_total_bytes": 80 * 2**30, "power_watts": 300.0, "temperature_celsius": 55.0}


def report(node: str = "node-a", seq: int = 1, accelerators: int = 2, events: list[dict[str, Any]] | None = None,
           interval: float = 5.0) -> dict[str, Any]:
    return {"node": node, "seq": seq, "sent_at": 1_800_000_000.0, "interval_seconds": interval,
            "host": {"cpu_ratio": 0.25, "memory_used_bytes": 2**33, "memory_total_bytes": 2**35},
            "accelerators": [sample(f"SIM-{node}-{i}") for i in range(accelerators)],
            "events": events or []}
