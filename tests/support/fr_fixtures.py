"""The recorded Flight Recorder fixtures, and the means to derive variants of them for the tests.

``tests/fixtures/fr/<scenario>/`` holds real dumps of hung gloo jobs (``tests/fixtures/record_fr.py``):
``rank_<R>`` is torch's pickle, ``json/rank_<R>`` torch's JSON form. NCCL-format fixtures recorded from
the NCCL-behaviour reproducer live in ``tests/fixtures/captures/<scenario>/fr/``. A derived variant
loads a real dump's dict, changes named fields, and writes it back as torch would (a plain pickle);
every test that does so says which field of torch's writer it changes and why.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FR_FIXTURES = REPO / "tests" / "fixtures" / "fr"
CAPTURES = REPO / "tests" / "fixtures" / "captures"


def gloo_scenarios() -> list[Path]:
    return sorted(p for p in FR_FIXTURES.iterdir() if (p / "rank_0").is_file())


def nccl_scenarios() -> list[Path]:
    """The NCCL-format dump directories recorded from the NCCL-behaviour reproducer, when present: ``fr/``
    holds the dumps written on the timeout, ``fr_live/`` those asked for later through the debug-info pipe."""
    return sorted(
        p for pattern in ("*/fr", "*/fr_live") for p in CAPTURES.glob(pattern) if p.is_dir() and any(p.iterdir())
    )


def dump_files(directory: Path) -> list[Path]:
    """The per-rank pickle files of a fixture directory (not its json/ or scenario.json)."""
    return sorted(
        (p for p in directory.iterdir() if p.is_file() and p.name[-1:].isdigit()),
        key=lambda p: int("".join(ch for ch in p.name if ch.isdigit()) or 0),
    )


def raw(scenario: str, rank: int) -> dict:
    """A fresh copy of a recorded pickle's dict (our own fixture: plain data)."""
    return copy.deepcopy(pickle.loads((FR_FIXTURES / scenario / f"rank_{rank}").read_bytes()))


def write_set(directory: Path, dumps: dict[int, dict], prefix: str = "rank_") -> str:
    """Write dicts as torch writes dumps, ``<directory>/<prefix><rank>``; returns the prefix path."""
    directory.mkdir(parents=True, exist_ok=True)
    for rank, data in dumps.items():
        (directory / f"{prefix}{rank}").write_bytes(pickle.dumps(data))
    return str(directory / prefix)


def entries_of(data: dict, desc: str) -> list[dict]:
    return [e for e in data["entries"] if e["process_group"][1] == desc]


def group_name(data: dict, desc: str) -> str:
    return next(name for name, cfg in data["pg_config"].items() if cfg["desc"] == desc)
