"""The synthetic fleet: node names, registrations, and reports assembled from pre-rendered fragments."""

from __future__ import annotations

import json
import math
import random
from array import array
from dataclasses import dataclass, field
from typing import Any

from sentinel.telemetry.schemas import AcceleratorInfo, NodeRegistration

SIM_MODEL = "sim-h100-80gb"  # as collectors/sim.py
MEMORY_TOTAL_BYTES = 80 * 2**30
WORKING_SET_BYTES = 60 * 2**30
IDLE_WATTS, MAX_WATTS = 70.0, 700.0
PEAK_FLOPS = 989e12
LEVELS = 101  # utilization 0.00 … 1.00


def default_xids() -> list[int]:
    """XID codes that open incidents, from the fault catalog (79, 48, 94, 13, …)."""
    from sentinel.detection.catalog import FaultCatalog

    catalog = FaultCatalog.load()
    return sorted(code for code, entry in catalog.xids.items() if entry.opens_incident)


def node_name(prefix: str, index: int) -> str:
    return f"{prefix}{index:05d}"


def accelerator_uuid(node: str, index: int) -> str:
    return f"SIM-{node}-{index}"  # as collectors/sim.py


def registration(node: str, accelerators: int, interval_seconds: float) -> NodeRegistration:
    return NodeRegistration(
        name=node, hostname=f"{node}.sim", interval_seconds=interval_seconds, agent_version="simulate",
        sources=[f"sim:{accelerators}"], labels={"simulated": "true"},
        accelerators=[AcceleratorInfo(uuid=accelerator_uuid(node, i), index=i, model=SIM_MODEL,
                                      memory_total_bytes=MEMORY_TOTAL_BYTES, source="sim", simulated=True,
                                      peak_flops=PEAK_FLOPS) for i in range(accelerators)])


def sample_fields(utilization: float, xids: dict[str, int] | None = None, ecc_uncorrected: int = 0) -> dict[str, Any]:
    """An accelerator sample's fields but its uuid, derived from utilization as collectors/sim.py does."""
    # A training job's memory is flat once it runs: a fixed working set with a little noise (no trend, no "leak").
    used = WORKING_SET_BYTES + (round(utilization * 100) % 7) * 16 * 2**20
    return {"utilization_ratio": round(utilization, 2), "memory_used_bytes": used,
            "memory_total_bytes": MEMORY_TOTAL_BYTES, "memory_peak_bytes": WORKING_SET_BYTES + 2**30,
            "power_watts": round(IDLE_WATTS + (MAX_WATTS - IDLE_WATTS) * utilization, 1),
            "temperature_celsius": round(32.0 + 45.0 * utilization, 1), "sm_clock_hz": 1.98e9,
            "throttle_reasons": [], "ecc_corrected_total": 0, "ecc_uncorrected_total": ecc_uncorrected,
            "retired_pages_total": 0, "remapped_rows_total": 0, "remap_failure": False, "pcie_replay_total": 0,
            "nvlink_errors_total": 0, "xid_errors_total": xids or {}, "processes": []}


def _fragment(fields: dict[str, Any]) -> bytes:
    """`,"utilization_ratio":…}`: what follows `{"uuid":"…"` in a sample."""
    return b"," + json.dumps(fields, separators=(",", ":")).encode()[1:]


FRAGMENTS = [_fragment(sample_fields(level / (LEVELS - 1))) for level in range(LEVELS)]
HOST = json.dumps({"cpu_ratio": 0.35, "load1": 12.0, "memory_used_bytes": 400 * 2**30,
                   "memory_total_bytes": 2 * 2**40, "disk_used_bytes": 2**40, "disk_total_bytes": 4 * 2**40,
                   "net_rx_bytes_total": 0, "net_tx_bytes_total": 0, "task_memory": []},
                  separators=(",", ":")).encode()


@dataclass
class NodeFaults:
    """Counters of a node that has had a fault: the only per-node state beyond `seq`."""

    xids: dict[int, dict[str, int]] = field(default_factory=dict)  # accelerator index → {xid: count}
    ecc: dict[int, int] = field(default_factory=dict)  # accelerator index → uncorrected count


class Fleet:
    """Names, seqs and report bodies of N simulated nodes."""

    def __init__(self, nodes: int, accelerators: int, interval_seconds: float, prefix: str, rng: random.Random):
        self.nodes = nodes
        self.accelerators = accelerators
        self.interval = interval_seconds
        self.prefix = prefix
        self.rng = rng
        self.seqs = array("q", bytes(8 * nodes))
        self.faults: dict[int, NodeFaults] = {}
        self._phase = [rng.random() for _ in range(nodes)]  # where each node is in its load cycle

    def name(self, index: int) -> str:
        return node_name(self.prefix, index)

    def next_seq(self, index: int) -> int:
        self.seqs[index] += 1
        return self.seqs[index]

    def utilization_level(self, index: int, now: float) -> int:
        """A busy node's load: its own level between 0.70 and 0.95, swaying ±0.03 over 10 minutes."""
        x = 0.70 + 0.25 * self._phase[index] + 0.03 * math.sin(2 * math.pi * (now / 600.0 + self._phase[index]))
        return max(0, min(LEVELS - 1, int(x * (LEVELS - 1))))

    def body(self, index: int, seq: int, now: float, events: list[dict[str, Any]] | None = None) -> bytes:
        node = self.name(index)
        level = self.utilization_level(index, now)
        faults = self.faults.get(index)
        parts = [b'{"node":"', node.encode(), b'","seq":', str(seq).encode(), b',"sent_at":', repr(now).encode(),
                 b',"interval_seconds":', repr(self.interval).encode(), b',"host":', HOST, b',"accelerators":[']
        rand = self.rng.random
        for i in range(self.accelerators):
            if i:
                parts.append(b",")
            parts += (b'{"uuid":"', accelerator_uuid(node, i).encode(), b'"')
            lvl = max(0, min(LEVELS - 1, level + int(rand() * 7) - 3))
            if faults is not None and (i in faults.xids or i in faults.ecc):
                parts.append(_fragment(sample_fields(lvl / (LEVELS - 1), faults.xids.get(i), faults.ecc.get(i, 0))))
            else:
                parts.append(FRAGMENTS[lvl])
        # Every field, defaults too, as the agent's model_dump_json() sends them.
        parts.append(b'],"events":')
        parts.append(json.dumps(events or [], separators=(",", ":")).encode())
        parts.append(b',"tasks":[],"task_exits":[]}')
        return b"".join(parts)

    def fault(self, index: int, now: float, xids: list[int], kind: str | None = None,
              xid: int | None = None, accelerator: int | None = None) -> dict[str, Any]:
        """Record a random fault (XID from the catalog, or uncorrectable ECC) and return its event."""
        acc = self.rng.randrange(self.accelerators) if accelerator is None else accelerator
        kind = kind or ("ecc" if self.rng.random() < 0.25 else "xid")
        uuid = accelerator_uuid(self.name(index), acc)
        state = self.faults.setdefault(index, NodeFaults())
        if kind == "ecc":
            state.ecc[acc] = state.ecc.get(acc, 0) + 1
            return {"kind": "ecc", "accelerator_uuid": uuid, "message": "uncorrectable ECC error (simulated)",
                    "observed_at": now}
        code = xid if xid is not None else self.rng.choice(xids)
        counts = state.xids.setdefault(acc, {})
        counts[str(code)] = counts.get(str(code), 0) + 1
        return {"kind": "xid", "accelerator_uuid": uuid, "xid": code, "message": f"XID {code} (simulated)",
                "observed_at": now}
