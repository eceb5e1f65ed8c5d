"""Real verl files for the tests, fetched from PyPI with pip and cached (never committed).

``verl_engine_file("0.7.1")`` runs ``pip download --no-deps verl==0.7.1`` once, unpacks the files the
tests read (the Megatron engine, ``verl/utils/megatron_utils.py``, the generated Megatron config) and
the dist-info ``METADATA`` into ``<cache>/<version>/`` -- the layout of site-packages, so ``mtpdiag
check`` reads the version the way it does for an installed verl -- and reuses them on later runs.

The cache is ``~/.cache/mtpdiag-tests/verl`` unless ``MTPDIAG_VERL_CACHE`` names another. In CI
(``CI`` set) a failed download fails the test; elsewhere it skips it (``tests/support/wheels.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.wheels import cache_dir as _cache_dir
from support.wheels import unpacked

ENGINE = "verl/workers/engine/megatron/transformer_impl.py"
MEGATRON_UTILS = "verl/utils/megatron_utils.py"
MEGATRON_CONFIG = "verl/trainer/config/_generated_ppo_megatron_trainer.yaml"  # in 0.8.0 and later
LAYOUT_MARK = ".mtpdiag-tree-v3"  # the unpacked tree holds everything these helpers extract
VERSIONS = ("0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1")


def cache_dir() -> Path:
    return _cache_dir("MTPDIAG_VERL_CACHE", "verl")


def verl_root(version: str) -> Path:
    """The unpacked tree of one version: ``<root>/verl/...`` and ``<root>/verl-V.dist-info/METADATA``."""
    wanted = {ENGINE, MEGATRON_UTILS, MEGATRON_CONFIG, f"verl-{version}.dist-info/METADATA"}
    return unpacked(
        cache_dir() / version, f"verl=={version}", lambda name: name if name in wanted else None, LAYOUT_MARK
    )


def verl_megatron_config(version: str) -> Path:
    """verl ``version``'s generated PPO Megatron trainer config (the full config tree, as shipped)."""
    path = verl_root(version) / MEGATRON_CONFIG
    if not path.is_file():
        pytest.fail(f"verl {version} ships no {MEGATRON_CONFIG}")
    return path


def verl_engine_file(version: str) -> Path:
    """verl ``version``'s Megatron engine file, downloaded and unpacked on first use."""
    return verl_root(version) / ENGINE


def verl_file(version: str, member: str) -> Path:
    """Another file of verl ``version`` that ``verl_root`` unpacks (``MEGATRON_UTILS``)."""
    return verl_root(version) / member
