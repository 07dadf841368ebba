"""The fault catalog is data: the built-in table follows NVIDIA's XID buckets, and a bad file fails loudly."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

import pytest

from sentinel.detection.catalog import CatalogError, FaultCatalog
from sentinel.telemetry.schemas import EVENT_KINDS, HardwareEvent


def event(kind: str, xid: int | None = None) -> HardwareEvent:
    return HardwareEvent(kind=kind, accelerator_uuid="GPU-1", xid=xid, observed_at=1.0)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def catalog() -> FaultCatalog:
    return FaultCatalog.load()


@pytest.mark.parametrize(("code", "severity", "action"), [
    (79, "critical", "restart_node"),
    (48, "critical", "reset_accelerator"), (64, "critical", "reset_accelerator"), (95, "critical", "reset_accelerator"),
    (94, "warning", "restart_task"), (13, "warning", "restart_task"), (31, "warning", "restart_task"),
    (43, "warning", "restart_task"), (63, "info", "record"), (92, "info", "record")])
def test_xid_buckets(catalog: FaultCatalog, code: int, severity: str, action: str) -> None:
    entry = catalog.lookup(event("xid", code))
    assert (entry.severity, entry.action) == (severity, action)
    assert entry.opens_incident == (severity != "info")


def test_unknown_xids_and_every_event_kind_are_classified(catalog: FaultCatalog) -> None:
    unknown = catalog.lookup(event("xid", 4242))
    assert unknown.headline(xid=4242) == "XID 4242" and unknown.opens_incident
    assert catalog.lookup(event("xid", None)) == catalog.default_xid
    for kind in EVENT_KINDS:
        if kind != "xid":
            assert catalog.lookup(event(kind)).title
    assert catalog.lookup(event("ecc")).action == "reset_accelerator"
    assert catalog.lookup(event("remap")).severity == "critical"
    assert catalog.lookup(event("offline")).action == "restart_node"
    assert not catalog.lookup(event("clear")).opens_incident


def test_next_steps_are_filled_in(catalog: FaultCatalog) -> None:
    steps = catalog.lookup(event("xid", 48)).steps(node="gpu-07", accelerator="GPU-abc", xid=48)
    assert any("gpu-07" in s for s in steps) and any("GPU-abc" in s for s in steps)
    assert not any("{" in s for s in steps)


def builtin() -> dict:  # type: ignore[type-arg]
    return tomllib.loads(resources.files("sentinel.detection").joinpath("fault_catalog.toml").read_text())


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["xid"][0].update(severity="fatal"), "severity must be one of"),
    (lambda d: d["xid"][0].update(action="reboot"), "action must be one of"),
    (lambda d: d["xid"][1].update(codes=[79]), "XID 79 is listed twice"),
    (lambda d: d["event"].pop("ecc"), "no entry for event kind(s) ecc"),
    (lambda d: d["event"].update(bogus=d["event"]["ecc"]), "[event.bogus] is not an event kind"),
    (lambda d: d["xid"][0].update(sevrity="critical"), "unknown field(s) sevrity"),
    (lambda d: d.pop("default_xid"), "needs a [default_xid] table"),
])
def test_a_bad_catalog_says_what_is_wrong(change, message: str) -> None:  # type: ignore[no-untyped-def]
    data = builtin()
    change(data)
    with pytest.raises(CatalogError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        FaultCatalog.parse(data, "test catalog")


def test_an_edited_copy_replaces_the_builtin(tmp_path: Path) -> None:
    text = resources.files("sentinel.detection").joinpath("fault_catalog.toml").read_text()
    edited = text.replace('codes = [63, 92]\ntitle = "ECC recording event"\nseverity = "info"',
                          'codes = [63, 92]\ntitle = "ECC recording event"\nseverity = "warning"')
    assert edited != text
    path = tmp_path / "catalog.toml"
    path.write_text(edited)
    assert FaultCatalog.load(path).lookup(event("xid", 92)).severity == "warning"
    path.write_text("not = [valid")
    with pytest.raises(CatalogError, match="not valid TOML"):
        FaultCatalog.load(path)
