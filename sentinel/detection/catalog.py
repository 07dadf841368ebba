"""The fault catalog: hardware events → severity, action, layer and what to check next.

The table is data (`fault_catalog.toml` next to this module, or the file named by
`fault_catalog_file`); loading validates every entry so a typo fails at start, not at 3 a.m.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sentinel.telemetry.schemas import EVENT_KINDS, HardwareEvent

SEVERITIES = ("info", "warning", "critical")
ACTIONS = ("record", "restart_task", "reset_accelerator", "restart_node")
LAYERS = ("hardware", "interconnect", "compute", "input_pipeline", "checkpoint_io", "software")
# NVIDIA's "Resolution Bucket (Immediate Action)" names, verbatim from the Xid catalog's Xids sheet
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). "" means NVIDIA gives none.
BUCKETS = ("RESTART_APP", "RESET_GPU", "RESTART_BM", "RESTART_VM", "IGNORE", "CONTACT_SUPPORT",
           "CHECK_MECHANICALS", "CHECK_UVM", "UPDATE_SWFW", "WORKFLOW_XID_45", "WORKFLOW_XID_48",
           "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154")
# What normally causes the fault: the running program, the GPU and its links, or the driver/firmware.
ORIGINS = ("application", "hardware", "driver")
_DEFAULTS = {"bucket": "", "origin": "hardware"}  # a catalog file written before these fields still loads
MAX_XID = 100_000  # as HardwareEvent.xid


class CatalogError(ValueError):
    pass


@dataclass(frozen=True)
class CatalogEntry:
    title: str
    severity: str
    action: str
    layer: str
    explanation: str = ""
    next_steps: tuple[str, ...] = ()
    bucket: str = ""  # NVIDIA's resolution bucket, verbatim ("" where NVIDIA gives none, or not an XID)
    origin: str = "hardware"

    @property
    def application(self) -> bool:
        """Normally caused by the running program, not the accelerator (XID 13, 31, 43, 45, RESTART_APP)."""
        return self.origin == "application"

    @property
    def opens_incident(self) -> bool:
        """Informational records are kept as events; everything else becomes an incident."""
        return not (self.severity == "info" and self.action == "record")

    def steps(self, **values: Any) -> list[str]:
        return [_fill(step, values) for step in self.next_steps]

    def headline(self, **values: Any) -> str:
        return _fill(self.title, values)


def _fill(template: str, values: dict[str, Any]) -> str:
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", str(value))
    return out


def _entry(where: str, raw: object) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: must be a table, not {type(raw).__name__} {raw!r:.40}")
    known = {"title", "severity", "action", "layer", "explanation", "next_steps", "codes", "bucket", "origin"}
    unknown = set(raw) - known
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for name, allowed in (("severity", SEVERITIES), ("action", ACTIONS), ("layer", LAYERS),
                          ("bucket", ("", *BUCKETS)), ("origin", ORIGINS)):
        if raw.get(name, _DEFAULTS.get(name)) not in allowed:
            raise CatalogError(f"{where}: {name} must be one of {', '.join(a or repr(a) for a in allowed)}, "
                               f"not {raw.get(name)!r}")
    if not isinstance(raw.get("title"), str) or not raw["title"]:
        raise CatalogError(f"{where}: needs a title")
    steps = raw.get("next_steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise CatalogError(f"{where}: next_steps must be a list of strings")
    explanation = raw.get("explanation", "")
    if not isinstance(explanation, str):
        raise CatalogError(f"{where}: explanation must be a string")
    return CatalogEntry(title=raw["title"], severity=raw["severity"], action=raw["action"], layer=raw["layer"],
                        explanation=explanation, next_steps=tuple(steps),
                        bucket=raw.get("bucket", _DEFAULTS["bucket"]), origin=raw.get("origin", _DEFAULTS["origin"]))


def _is_xid(code: object) -> bool:
    # bool is an int to Python: `codes = [true]` must not silently mean XID 1
    return isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= MAX_XID


BUILT_IN = "built-in fault catalog"
# Event kinds added after operators may have copied the catalog: a file without them takes the built-in entries.
LATER_KINDS = frozenset({"link_down", "link_up"})


@dataclass(frozen=True)
class FaultCatalog:
    xids: dict[int, CatalogEntry]
    default_xid: CatalogEntry
    events: dict[str, CatalogEntry]

    @classmethod
    def load(cls, path: str | Path | None = None) -> FaultCatalog:
        if path is None:
            text = resources.files("sentinel.detection").joinpath("fault_catalog.toml").read_text()
            where = BUILT_IN
        else:
            where = str(path)
            try:
                text = Path(path).read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CatalogError(f"{where}: not UTF-8 text: {exc}") from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"{where}: not valid TOML: {exc}") from exc
        return cls.parse(data, where)

    @classmethod
    def parse(cls, data: dict[str, Any], where: str = "fault catalog") -> FaultCatalog:
        unknown = set(data) - {"xid", "default_xid", "event"}
        if unknown:  # `[[xids]]` for `[[xid]]` would otherwise load a catalog without a single XID
            raise CatalogError(f"{where}: unknown table(s) {', '.join(sorted(map(repr, unknown)))}; "
                               "expected [[xid]], [default_xid] and [event.<kind>]")
        tables = data.get("xid", [])
        if not isinstance(tables, list):
            raise CatalogError(f"{where}: xid must be an array of tables ([[xid]])")
        xids: dict[int, CatalogEntry] = {}
        first_listed: dict[int, int] = {}
        for i, raw in enumerate(tables):
            entry = _entry(f"{where}: xid entry {i + 1}", raw)
            codes = raw.get("codes")
            if not isinstance(codes, list) or not codes or not all(_is_xid(c) for c in codes):
                raise CatalogError(f"{where}: xid entry {i + 1} needs codes = [integers from 0 to {MAX_XID}]")
            for code in codes:
                if code in xids:
                    raise CatalogError(f"{where}: xid entry {i + 1}: XID {code} is listed twice "
                                       f"(also in xid entry {first_listed[code] + 1})")
                xids[code] = entry
                first_listed[code] = i
        if "default_xid" not in data:
            raise CatalogError(f"{where}: needs a [default_xid] table")
        default = _entry(f"{where}: default_xid", data["default_xid"])
        kinds = data.get("event", {})
        if not isinstance(kinds, dict):
            raise CatalogError(f"{where}: event must be a table of [event.<kind>] tables")
        events: dict[str, CatalogEntry] = {}
        for kind, raw in kinds.items():
            if kind not in EVENT_KINDS or kind == "xid":
                raise CatalogError(f"{where}: [event.{kind}] is not an event kind; one of "
                                   f"{', '.join(k for k in EVENT_KINDS if k != 'xid')}")
            events[kind] = _entry(f"{where}: event.{kind}", raw)
        missing = [k for k in EVENT_KINDS if k != "xid" and k not in events]
        if missing and set(missing) <= LATER_KINDS and where != BUILT_IN:
            # a copy made before these kinds existed: they keep their built-in meaning (it is not an error)
            built_in = cls.load().events
            events.update({k: built_in[k] for k in missing})
            missing = []
        if missing:
            raise CatalogError(f"{where}: no entry for event kind(s) {', '.join(missing)}")
        return cls(xids=xids, default_xid=default, events=events)

    def to_dict(self) -> dict[str, Any]:
        """The catalog as the TOML document `parse` reads: XIDs with the same entry share one [[xid]] table."""
        grouped: dict[CatalogEntry, list[int]] = {}
        for code, entry in sorted(self.xids.items()):
            grouped.setdefault(entry, []).append(code)
        return {"xid": [{"codes": codes, **_entry_dict(entry)} for entry, codes in grouped.items()],
                "default_xid": _entry_dict(self.default_xid),
                "event": {kind: _entry_dict(entry) for kind, entry in self.events.items()}}

    def lookup(self, event: HardwareEvent) -> CatalogEntry:
        if event.kind == "xid":
            if event.xid is None:
                return self.default_xid
            return self.xids.get(event.xid, self.default_xid)
        return self.events[event.kind]


def _entry_dict(entry: CatalogEntry) -> dict[str, Any]:
    return {"title": entry.title, "severity": entry.severity, "action": entry.action, "layer": entry.layer,
            "explanation": entry.explanation, "next_steps": list(entry.next_steps), "bucket": entry.bucket,
            "origin": entry.origin}
