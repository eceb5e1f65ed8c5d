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


def as_of(data: dict, t_ns: int) -> dict:
    """A recorded NCCL-format dump as its rank would have written it at ``t_ns`` (time.time_ns()), while the job
    still moved: the entries created by then, completed only when their completion was discovered by then, and
    ``pg_status`` counted from them as torch counts it (a send/recv by its p2p sequence number, anything else by
    its collective one). The recorded dump is what the rank wrote at the end; ``as_of`` at a time after its last
    entry gives back its ``pg_status`` exactly (tests/unit/test_group_marks.py checks it), so an earlier dump of
    a real job is derived, not invented."""
    out = copy.deepcopy(data)
    kept = []
    for e in out["entries"]:
        if e["time_created_ns"] > t_ns:
            continue
        done_ns = e.get("time_discovered_completed_ns")
        if e["state"] == "completed" and (done_ns is None or done_ns > t_ns):
            e.update(state="scheduled", time_discovered_started_ns=None, time_discovered_completed_ns=None)
        kept.append(e)
    status: dict[str, dict[str, int]] = {}
    for e in kept:
        seq = e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"]
        s = status.setdefault(
            str(e["pg_id"]),
            {"last_enqueued_collective": -1, "last_started_collective": -1, "last_completed_collective": -1},
        )
        s["last_enqueued_collective"] = max(s["last_enqueued_collective"], seq)
        if e["state"] == "completed":
            s["last_completed_collective"] = max(s["last_completed_collective"], seq)
    out["entries"], out["pg_status"] = kept, status
    return out


def nccl_dump(scenario: str, rank: int, live: bool = True) -> dict:
    """A fresh copy of a dump recorded from the NCCL-behaviour reproducer (``fr_live``: asked for through the
    debug-info pipe after the hang; ``fr``: written at the timeout)."""
    path = CAPTURES / scenario / ("fr_live" if live else "fr") / f"rank_{rank}"
    return copy.deepcopy(pickle.loads(path.read_bytes()))
