"""The RDMA port rules (nic_rules.toml): which counter movements open an incident. Data, editable."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_FILE = Path(__file__).with_name("nic_rules.toml")
SEVERITIES = ("info", "warning", "critical")
ACTIONS = ("record", "restart_node")


@dataclass(frozen=True)
class NicRule:
    name: str
    counter: str
    severity: str
    action: str
    title: str
    explanation: str
    next_steps: tuple[str, ...]
    increase: float | None = None
    window_seconds: float = 300.0
    per_second: float | None = None

    def fill(self, text: str, **values: Any) -> str:
        try:
            return text.format(**values)
        except (KeyError, IndexError, ValueError):
            return text


def load_rules(path: Path | None = None) -> list[NicRule]:
    """Read and check the rules; a mistake names the rule and the field."""
    source = path or DEFAULT_FILE
    with open(source, "rb") as f:
        raw = tomllib.load(f)
    rules = []
    for i, entry in enumerate(raw.get("rule", [])):
        where = f"{source}: rule {i + 1} ({entry.get('name', '?')})"
        unknown = set(entry) - {"name", "counter", "increase", "window_seconds", "per_second", "severity",
                                "action", "title", "explanation", "next_steps"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        missing = [k for k in ("name", "counter") if k not in entry]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if ("increase" in entry) == ("per_second" in entry):
            raise ValueError(f"{where}: give exactly one of increase or per_second")
        if entry.get("severity", "warning") not in SEVERITIES:
            raise ValueError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
        if entry.get("action", "record") not in ACTIONS:
            raise ValueError(f"{where}: action must be one of {', '.join(ACTIONS)}")
        threshold = entry.get("increase", entry.get("per_second"))
        if not isinstance(threshold, int | float) or threshold <= 0:
            raise ValueError(f"{where}: the threshold must be a positive number")
        rules.append(NicRule(
            name=str(entry["name"]), counter=str(entry["counter"]), severity=entry.get("severity", "warning"),
            action=entry.get("action", "record"), title=str(entry.get("title", entry["name"])),
            explanation=str(entry.get("explanation", "")), next_steps=tuple(entry.get("next_steps", [])),
            increase=float(entry["increase"]) if "increase" in entry else None,
            window_seconds=float(entry.get("window_seconds", 300.0)),
            per_second=float(entry["per_second"]) if "per_second" in entry else None))
    return rules
