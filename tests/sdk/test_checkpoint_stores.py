"""What sets the two directory tiers apart: durability. A real save, traced by strace(1) in a real process.

What both tiers honour (the API, the layout, locking, garbage collection) is the shared contract in
tests/contracts/test_checkpoint_store_contract.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.sdk.stores import LocalDirStore, SharedDirStore

SAVE = """
import sys
from sentinel.sdk.chunks import digest
from sentinel.sdk.stores import STORES
store = STORES[sys.argv[1]](sys.argv[2])
data = b"x" * 4096
store.write_pack([(digest(data), memoryview(data))])
store.put_manifest(1, 1, 0, b'{"tensors": []}')
"""

# The syncs and renames of that save on the shared tier, in order: the pack, its index (written aside, renamed
# into place, the directory synced), then the manifest the same way. Pack ids and temporary-name suffixes are
# random, so they are normalised.
STEP = "manifests/job-1/step-000000000001"
SHARED_SAVE = [
    "fsync packs/<pack>.pack",
    "fsync packs/.<pack>.idx.<tmp>",
    "rename packs/.<pack>.idx.<tmp> packs/<pack>.idx",
    "fsync packs",
    f"fsync {STEP}/.rank-00000.json.<tmp>",
    f"rename {STEP}/.rank-00000.json.<tmp> {STEP}/rank-00000.json",
    f"fsync {STEP}",
]


def _strace_problem() -> str | None:
    if shutil.which("strace") is None:
        return "strace(1) is not installed"
    probe = subprocess.run(["strace", "-qq", "-o", "/dev/null", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"strace cannot trace here: {probe.stderr.strip()}"


needs_strace = pytest.mark.skipif(_strace_problem() is not None, reason=str(_strace_problem()))


def traced_save(tier: str, root: Path, tmp_path: Path) -> list[str]:
    """The sync and rename calls one save makes on the files under `root`, written as `SHARED_SAVE` writes them."""
    trace = tmp_path / "strace.txt"
    subprocess.run(["strace", "-f", "-qq", "-y", "-o", str(trace), "-e",
                    "trace=fsync,fdatasync,sync_file_range,rename,renameat,renameat2",
                    sys.executable, "-c", SAVE, tier, str(root)], check=True, timeout=120)
    calls = []
    for line in trace.read_text().splitlines():
        synced = re.search(r"\b(?:fsync|fdatasync|sync_file_range)\(\d+<([^>]*)>", line)
        renamed = re.search(r"\brename(?:at2?)?\(", line)
        if synced and synced.group(1).startswith(str(root)):
            calls.append(f"fsync {synced.group(1)}")
        elif renamed and str(root) in line:
            calls.append("rename " + " ".join(re.findall(r'"([^"]*)"', line)))
    prefix = f"{root}/"
    return [re.sub(r"\.[0-9a-f]{8}\.tmp\b", ".<tmp>", re.sub(r"\b[0-9a-f]{32}\b", "<pack>", c.replace(prefix, "")))
            for c in calls]


@needs_strace
def test_the_shared_tier_syncs_every_file_and_directory_before_it_is_used(tmp_path: Path):
    """A pack is on disk before the index that names it, an index or manifest before its rename makes it visible,
    and the rename itself (the directory) before the save goes on: a crash at any point leaves no reference to
    data the filesystem may lose."""
    assert SharedDirStore.tier == "persistent" and SharedDirStore.durable
    calls = traced_save("persistent", tmp_path / "store", tmp_path)
    assert calls == SHARED_SAVE


@needs_strace
def test_the_local_tier_never_syncs(tmp_path: Path):
    """The node-local tier trades durability for speed (it is lost with the node anyway): the same save, no fsync."""
    assert LocalDirStore.tier == "local" and not LocalDirStore.durable
    calls = traced_save("local", tmp_path / "store", tmp_path)
    assert calls == [c for c in SHARED_SAVE if c.startswith("rename ")]
