"""Released megatron-core sources for the tests, fetched from PyPI with pip and cached (never committed).

``megatron_root("0.16")`` runs ``pip download --no-deps --only-binary=:all: megatron-core==0.16.1`` (the
minor's latest patch) once and unpacks its ``megatron/**/*.py`` into ``<cache>/0.16.1/``. Releases
from 0.17 on ship wheels for Python >= 3.12 only, so when this interpreter finds no wheel the download
is retried with ``--python-version 3.12``: the tests read the source with ``ast`` and never import it.

The cache is ``~/.cache/mtpdiag-tests/megatron-core`` unless ``MTPDIAG_MEGATRON_CACHE`` names another.
In CI (``CI`` set) a failed download fails the test; elsewhere it skips it (``tests/support/wheels.py``).
"""

from __future__ import annotations

from pathlib import Path

from support.wheels import cache_dir as _cache_dir
from support.wheels import unpacked

# Each minor release's latest patch on PyPI.
RELEASES = {
    "0.13": "0.13.1",
    "0.14": "0.14.0",
    "0.15": "0.15.3",
    "0.16": "0.16.1",
    "0.17": "0.17.1",
    "0.18": "0.18.2",
    "0.19": "0.19.2",
}
LAYOUT_MARK = ".mtpdiag-tree-v1"


def cache_dir() -> Path:
    return _cache_dir("MTPDIAG_MEGATRON_CACHE", "megatron-core")


def megatron_root(minor: str) -> Path:
    """The unpacked tree of a minor release's latest patch: ``<root>/megatron/core/...``."""
    version = RELEASES[minor]
    return unpacked(
        cache_dir() / version, f"megatron-core=={version}", _python_source, LAYOUT_MARK, pythons=(None, "3.12")
    )


def _python_source(name: str) -> str | None:
    return name if name.startswith("megatron/") and name.endswith(".py") else None
