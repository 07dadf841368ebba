"""The shape the architecture promises (docs/architecture.md, "Layers"), checked on every run.

The package graph below the edge has no cycle; nothing below the edge imports a router, a command or the
runtime; no router imports another; modules stay under 400 lines and functions under 60. The checks read
the source with `ast` (structure.py); the tests at the end prove they catch what they are for, on a copy
of the tree with a cycle added on purpose.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.architecture import structure

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


@pytest.fixture(scope="module")
def modules() -> dict[str, structure.Module]:
    return structure.load()


def test_the_package_graph_below_the_edge_has_no_cycle(modules: dict[str, structure.Module]) -> None:
    assert structure.cycles(structure.package_graph(modules)) == []


def test_nothing_below_the_edge_imports_a_router_a_command_or_the_runtime(modules: dict[str, structure.Module]) -> None:
    assert structure.backward_imports(modules) == []


def test_no_router_imports_another_router(modules: dict[str, structure.Module]) -> None:
    assert structure.router_imports(modules) == []


def test_only_the_composition_root_imports_the_runtime(modules: dict[str, structure.Module]) -> None:
    assert structure.runtime_importers(modules) == []


def test_no_module_is_over_400_lines(modules: dict[str, structure.Module]) -> None:
    assert [(m.name, m.lines) for m in modules.values() if m.lines > MAX_MODULE_LINES] == []


def test_no_function_is_over_60_lines() -> None:
    long = [(f"{f.module}.{f.name}", f.lines) for f in structure.functions() if f.lines > MAX_FUNCTION_LINES]
    assert long == []


def test_the_edge_is_what_the_docs_say(modules: dict[str, structure.Module]) -> None:
    """Routers, commands and the composition root are the edge; a domain's service is not."""
    assert modules["sentinel.nodes.api"].is_edge and modules["sentinel.auth.cli"].is_edge
    assert modules["sentinel.runtime"].is_edge and modules["sentinel.deps"].is_edge
    assert not modules["sentinel.nodes.service"].is_edge and not modules["sentinel.pipeline.report"].is_edge


# -- the checks catch what they are for --------------------------------------------------------------------

def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """The source tree copied, with `line` appended to `module` (a dotted name)."""
    root = tmp_path / "tree"
    for source in structure.SOURCES:
        shutil.copytree(structure.ROOT / source, root / source, ignore=shutil.ignore_patterns("__pycache__"))
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")
    return root


def test_a_cycle_added_on_purpose_is_found(tmp_path: Path) -> None:
    # nodes is below remediation (remediation drains nodes); nodes importing remediation closes a loop
    root = _copy_with(tmp_path, "sentinel.nodes.service", "from sentinel.remediation import engine  # a cycle")
    found = structure.cycles(structure.package_graph(structure.load(root)))
    assert any({"sentinel.nodes", "sentinel.remediation"} <= set(cycle) for cycle in found), found


def test_a_lazy_import_inside_a_function_counts(tmp_path: Path) -> None:
    line = "def _later() -> None:\n    from sentinel.alerting import service  # noqa: F401"
    root = _copy_with(tmp_path, "sentinel.incidents.service", line)
    found = structure.cycles(structure.package_graph(structure.load(root)))
    assert any({"sentinel.incidents", "sentinel.alerting"} <= set(cycle) for cycle in found), found


def test_a_domain_importing_a_router_or_the_runtime_is_found(tmp_path: Path) -> None:
    root = _copy_with(tmp_path, "sentinel.jobs.service",
                      "from sentinel.checkpoints.api import router  # noqa: F401\nimport sentinel.runtime  # noqa")
    modules = structure.load(root)
    assert ("sentinel.jobs.service", "sentinel.checkpoints.api") in structure.backward_imports(modules)
    assert structure.runtime_importers(modules) == ["sentinel.jobs.service"]


def test_a_router_importing_another_is_found(tmp_path: Path) -> None:
    root = _copy_with(tmp_path, "sentinel.ui.api", "from sentinel.jobs.api import get_job  # noqa: F401")
    assert ("sentinel.ui.api", "sentinel.jobs.api") in structure.router_imports(structure.load(root))
