"""examples/hangs: each reproducer hangs where its README says, checked with real py-spy and /proc.

Nothing here asserts on mtpdiag's diagnosis or on timing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import unavailable
from mtpdiag.capture import procfs
from mtpdiag.capture.discover import find_targets
from support.recorder import record
from support.settle import settled


def _threads(pid: int) -> dict[str, list[dict]]:
    """thread name -> frames (innermost first) of a live process."""
    return {t["thread_name"]: t["frames"] for t in json.loads(record.py_spy_dump(pid, as_json=True))}


def _names(frames: list[dict]) -> list[str]:
    return [f["name"] for f in frames]


Threads = dict[str, list[dict]]


def _each_rank_settles(ranks: dict[int, int], check: Callable[[int, Threads], None]) -> None:
    """``check(rank, threads)`` of each rank, read again while it fails (``support.settle``)."""
    for rank, pid in ranks.items():
        settled(lambda pid=pid: _threads(pid), lambda threads, rank=rank: check(rank, threads))


def _main_in_all_reduce(rank: int, threads: Threads) -> None:
    assert _in_torch_distributed(threads["MainThread"]) == "all_reduce", (rank, _names(threads["MainThread"])[:4])


def _in_torch_distributed(frames: list[dict]) -> str | None:
    """The innermost torch.distributed function of a stack, or None."""
    top = frames[0] if frames else {}
    return top["name"] if "torch/distributed/" in (top.get("filename") or "") else None


# scenario -> rank -> (innermost function of the main thread, innermost torch.distributed function of any
# other thread or None): what the recorded fixtures show, and what the analysis may rely on
RECORDED = {
    "hang_side_thread": {
        0: ("backward", "reduce_scatter_single"),
        1: ("backward", "all_gather_single"),
        2: ("backward", "all_gather_single"),
        3: ("backward", "all_gather_single"),
    },
    "hang_lock_wait": {
        0: ("all_reduce", None),
        1: ("log_metrics", None),
        2: ("all_reduce", None),
        3: ("all_reduce", None),
    },
    "hang_data_loader": {
        0: ("all_reduce", None),
        1: ("all_reduce", None),
        2: ("_PollLikeSelector.select", None),
        3: ("all_reduce", None),
    },
    "hang_unreadable": {0: ("all_reduce", None), 1: ("all_reduce", None), 2: ("all_reduce", None)},
    "hang_comm_init": {
        0: ("_new_process_group_helper", None),
        1: ("_new_process_group_helper", None),
        2: ("_new_process_group_helper", None),
        3: ("barrier", None),
    },
}


@pytest.mark.parametrize("scenario", sorted(RECORDED))
def test_recorded_fixture_shows_each_rank_where_the_readme_says(scenario):
    folder = record.CAPTURES / scenario
    got = {}
    for rank in RECORDED[scenario]:
        threads = json.loads((folder / f"rank{rank}.json").read_text())
        main = next(t for t in threads if t["thread_name"] == "MainThread")["frames"]
        others = [_in_torch_distributed(t["frames"]) for t in threads if t["thread_name"] != "MainThread"]
        got[rank] = (main[0]["name"], next((o for o in others if o), None))
    assert got == RECORDED[scenario]


def test_recorded_unreadable_rank_is_py_spys_refusal():
    meta = json.loads((record.CAPTURES / "hang_unreadable" / "scenario.json").read_text())
    assert "EPERM" in meta["where"]["3"]["py_spy_error"]
    assert not (record.CAPTURES / "hang_unreadable" / "rank3.json").exists()


@pytest.fixture
def hung(request):
    with record.hung_job(record.SCENARIOS[request.param]) as (job, ranks, _):
        yield job, ranks


@pytest.mark.e2e
@pytest.mark.parametrize("hung", ["hang_side_thread"], indirect=True)
def test_side_thread_collective_while_every_main_thread_waits_in_c(hung):
    _, ranks = hung

    def check(rank: int, threads: Threads) -> None:
        main = threads["MainThread"]
        assert _names(main)[0] == "backward" and not _in_torch_distributed(main), (rank, _names(main)[:4])
        side = threads.get("autograd-engine", [])
        assert _in_torch_distributed(side) == ("reduce_scatter_single" if rank == 0 else "all_gather_single"), (
            rank,
            _names(side)[:4],
        )

    _each_rank_settles(ranks, check)


@pytest.mark.e2e
@pytest.mark.parametrize("hung", ["hang_lock_wait"], indirect=True)
def test_lock_wait(hung):
    _, ranks = hung

    def check(rank: int, threads: Threads) -> None:
        main = threads["MainThread"]
        if rank == 1:
            assert _names(main)[0] == "log_metrics" and not _in_torch_distributed(main), _names(main)[:4]
            assert "checkpoint_thread" in _names(threads.get("checkpoint-writer", []))
        else:
            _main_in_all_reduce(rank, threads)

    _each_rank_settles(ranks, check)


@pytest.mark.e2e
@pytest.mark.parametrize("hung", ["hang_data_loader"], indirect=True)
def test_data_loader_worker_stalls_one_rank(hung):
    job, ranks = hung
    assert len(ranks) == 4 and len(job.workers()) == 4  # the DataLoader workers are helpers, not ranks

    def check(rank: int, threads: Threads) -> None:
        main = threads["MainThread"]
        if rank == 2:
            assert not _in_torch_distributed(main), _names(main)[:6]
            assert any("torch/utils/data/dataloader.py" in f["filename"] for f in main), _names(main)[:6]
        else:
            _main_in_all_reduce(rank, threads)

    _each_rank_settles(ranks, check)
    helpers = [p for p in procfs.descendants(ranks[2]) if (procfs.read_env(p) or {}).get("RANK") == "2"]
    assert helpers, "rank 2 has no DataLoader worker process"
    # mtpdiag's own discovery expands the agent to the four ranks, not their DataLoader workers
    assert sorted(find_targets([job.pid], scan_all=False)) == sorted(ranks.values())


def _require_ptrace_of_parent() -> None:
    """The unreadable rank's helper traces its parent: root may; elsewhere Yama may refuse (CI runs as root)."""
    if os.geteuid() != 0:
        unavailable("needs root to PTRACE_SEIZE a parent process (Yama ptrace_scope)")


@pytest.mark.e2e
@pytest.mark.parametrize("hung", ["hang_unreadable"], indirect=True)
def test_unreadable_rank_refuses_py_spy(hung):
    job, ranks = hung
    _require_ptrace_of_parent()
    with pytest.raises(RuntimeError, match="py-spy failed"):
        record.py_spy_dump(ranks[3], as_json=True)
    status = Path(f"/proc/{ranks[3]}/status").read_text()
    assert int(next(line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:"))) != 0
    _each_rank_settles({rank: pid for rank, pid in ranks.items() if rank != 3}, _main_in_all_reduce)
    assert sorted(find_targets([job.pid], scan_all=False)) == sorted(ranks.values())  # the tracer is no rank


@pytest.mark.e2e
@pytest.mark.parametrize("hung", ["hang_comm_init"], indirect=True)
def test_comm_init_waits_for_the_rank_that_never_creates_the_group(hung):
    _, ranks = hung

    def check(rank: int, threads: Threads) -> None:
        names = _names(threads["MainThread"])
        if rank == 3:
            assert "barrier" in names[:3] and "new_group" not in names, names[:6]
        else:
            assert "new_group" in names, (rank, names[:8])

    _each_rank_settles(ranks, check)
