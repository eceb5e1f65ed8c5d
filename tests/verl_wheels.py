"""Real verl engine files for the tests, fetched from PyPI with pip and cached (never committed).

``verl_engine_file("0.7.1")`` runs ``pip download --no-deps verl==0.7.1`` once, unpacks only
``verl/workers/engine/megatron/transformer_impl.py`` and the dist-info ``METADATA`` into
``<cache>/<version>/`` -- the layout of site-packages, so ``mtpdiag check`` reads the version the
way it does for an installed verl -- and reuses them on later runs.

The cache is ``~/.cache/mtpdiag-tests/verl`` unless ``MTPDIAG_VERL_CACHE`` names another. In CI
(``CI`` set) a failed download fails the test; elsewhere it skips it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ENGINE = "verl/workers/engine/megatron/transformer_impl.py"
MEGATRON_CONFIG = "verl/trainer/config/_generated_ppo_megatron_trainer.yaml"  # in 0.8.0 and later
LAYOUT_MARK = ".mtpdiag-tree-v2"  # the unpacked tree holds everything these helpers extract
VERSIONS = ("0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1")


def cache_dir() -> Path:
    return Path(os.environ.get("MTPDIAG_VERL_CACHE") or Path.home() / ".cache" / "mtpdiag-tests" / "verl")


def verl_root(version: str) -> Path:
    """The unpacked tree of one version: ``<root>/verl/...`` and ``<root>/verl-V.dist-info/METADATA``."""
    root = cache_dir() / version
    if not (root / LAYOUT_MARK).is_file():
        _fetch(version, root)
    return root


def verl_megatron_config(version: str) -> Path:
    """verl ``version``'s generated PPO Megatron trainer config (the full config tree, as shipped)."""
    path = verl_root(version) / MEGATRON_CONFIG
    if not path.is_file():
        pytest.fail(f"verl {version} ships no {MEGATRON_CONFIG}")
    return path


def verl_engine_file(version: str) -> Path:
    """verl ``version``'s Megatron engine file, downloaded and unpacked on first use."""
    return verl_root(version) / ENGINE


def _fetch(version: str, root: Path) -> None:
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{version}-") as tmp:
        wheels = Path(tmp) / "wheels"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(wheels), f"verl=={version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            _unavailable(version, "pip download timed out")
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            _unavailable(version, f"pip download failed: {last}")
        found = sorted(wheels.glob(f"verl-{version}-*.whl"))
        if not found:
            _unavailable(version, "pip download produced no wheel")
        staged = Path(tmp) / "tree"
        metadata = f"verl-{version}.dist-info/METADATA"
        with zipfile.ZipFile(found[0]) as wheel:
            names = set(wheel.namelist())
            for member in (ENGINE, metadata, MEGATRON_CONFIG):
                if member not in names and member == MEGATRON_CONFIG:
                    continue  # older releases have no generated config
                target = staged / member
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(member))
        (staged / LAYOUT_MARK).write_text("engine, METADATA and the megatron config where shipped\n")
        # Publish whole: a concurrent or interrupted run never sees half a tree.
        if root.exists():
            shutil.rmtree(root)
        try:
            os.replace(staged, root)
        except OSError:
            if not (root / LAYOUT_MARK).is_file():  # another run published it first
                raise


def _unavailable(version: str, why: str):
    message = f"verl {version} is not available: {why}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
