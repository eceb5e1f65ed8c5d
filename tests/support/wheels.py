"""Released wheels for the tests: fetched from PyPI with pip, unpacked in part, cached (never committed).

``unpacked(root, requirement, select)`` runs ``pip download --no-deps --only-binary=:all:`` once,
extracts the members ``select`` keeps into ``root`` and marks the tree complete; later runs reuse it.
A tree is published whole (a temporary directory renamed into place), so a concurrent or interrupted
run never sees half of one. In CI (``CI`` set) a failed download fails the test; elsewhere it skips it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from conftest import unavailable

CACHE_ROOT = Path.home() / ".cache" / "mtpdiag-tests"


def cache_dir(env: str, name: str) -> Path:
    """``$env`` when set, else ``~/.cache/mtpdiag-tests/<name>``."""
    return Path(os.environ.get(env) or CACHE_ROOT / name)


def unpacked(
    root: Path,
    requirement: str,
    select: Callable[[str], str | None],
    mark: str,
    pythons: Sequence[str | None] = (None,),
) -> Path:
    """``root`` holding the members of ``requirement``'s wheel that ``select`` maps to a relative path.

    ``pythons`` are the ``--python-version`` values to try in turn (None: this interpreter's), for a
    release that ships wheels only for a newer Python than ours.
    """
    if (root / mark).is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}-") as tmp:
        archive = _download(requirement, Path(tmp) / "download", pythons)
        staged = Path(tmp) / "tree"
        staged.mkdir()
        for name, read in _members(archive):
            target = select(name)
            if target is not None:
                path = staged / target
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(read())
        (staged / mark).write_text(f"{requirement} from {archive.name}\n")
        if root.exists():
            shutil.rmtree(root)
        try:
            os.replace(staged, root)
        except OSError:
            if not (root / mark).is_file():  # another run published it first
                raise
    return root


def _download(requirement: str, dest: Path, pythons: Sequence[str | None]) -> Path:
    last = "no attempt"
    for python in pythons:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(dest),
            requirement,
        ]
        if python is not None:
            cmd += ["--python-version", python]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            last = "pip download timed out"
            continue
        found = sorted(dest.glob("*.whl"))
        if done.returncode == 0 and found:
            return found[0]
        last = (done.stderr.strip().splitlines() or ["pip download produced nothing"])[-1]
    unavailable(f"{requirement} is not available: pip download failed: {last}")


def _members(archive: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """(name inside the wheel, reader). Only wheels: an sdist would have to be built to be downloaded."""
    with zipfile.ZipFile(archive) as wheel:
        for name in wheel.namelist():
            yield name, lambda name=name: wheel.read(name)
