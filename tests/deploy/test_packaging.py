"""A non-editable install (the container image, /opt/sentinel from systemd's notes) carries every data
file the code reads: each file under the packages that is not Python must match a package-data pattern.
Found by building the image: `sentinel/network/nic_rules.toml` was missing and the server did not start."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sentinel", "collectors", "migrations")
IGNORED_SUFFIXES = {".py", ".pyc"}


def test_every_data_file_in_the_packages_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    missing = []
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix in IGNORED_SUFFIXES or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT)
            owners = [pkg for pkg in config if rel.is_relative_to(Path(*pkg.split(".")))]
            covered = any(path.relative_to(ROOT / Path(*pkg.split("."))).match(pattern)
                          for pkg in owners for pattern in config[pkg])
            if not covered:
                missing.append(str(rel))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
