"""``watch``'s Flight Recorder signal (``LiveProgress``) against the job's side of the debug-info pipe.

The test plays the job: it holds every rank's ``<prefix><rank>.pipe`` open for reading, as torch's monitor thread
does, reads the requests mtpdiag writes, and answers them late, as torch does when its monitor looks at the pipe
once a second. The answers are dumps recorded from the NCCL-behaviour reproducer
(tests/fixtures/captures/nccl_mtp_cp_pp_spin/fr_live), as each rank wrote them after the hang or, derived by
``as_of``, as it would have written them earlier while the job moved.
"""

from __future__ import annotations

import os
import pickle
import time

import pytest

from mtpdiag.capture.flight_recorder import LiveProgress
from mtpdiag.model import Env, RankCapture
from support.fr_fixtures import as_of, nccl_dump

HANG = "nccl_mtp_cp_pp_spin"
T0 = 1796064475  # s: the recorded job's collectives completed between T0 + 0.8 and T0 + 1.9
RANKS = (0, 1, 2, 3)


def dump_at(rank: int, t_s: float | None) -> dict:
    """Rank ``rank``'s dump as written at T0 + ``t_s`` (None: after the hang)."""
    data = nccl_dump(HANG, rank)
    return data if t_s is None else as_of(data, int((T0 + t_s) * 1e9))


def completions(data: dict) -> set[float]:
    return {e["time_discovered_completed_ns"] / 1e9 for e in data["entries"] if e["time_discovered_completed_ns"]}


@pytest.fixture
def job(tmp_path):
    """This process as the four ranks of a job with a debug-info pipe; ``requests()`` reads what mtpdiag asked,
    rank by rank."""
    fds = {}
    captures = []
    for rank in RANKS:
        pipe = tmp_path / f"pipe_{rank}.pipe"
        os.mkfifo(pipe)
        fds[rank] = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        env = Env(
            RANK=str(rank),
            TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "rank_"),
            TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(tmp_path / "pipe_"),
        )
        captures.append(RankCapture(pid=os.getpid(), rank=rank, state="S", env=env))

    class Job:
        def __init__(self, ranks: tuple[int, ...]) -> None:
            self.captures = tuple(c for c in captures if c.rank in ranks)

        @staticmethod
        def requests() -> dict[int, int]:
            asked = {}
            for rank, fd in fds.items():
                try:
                    asked[rank] = len(os.read(fd, 128)) // 2
                except BlockingIOError:
                    continue
            return {r: n for r, n in asked.items() if n}

        @staticmethod
        def answer(rank: int, data: dict, age_s: float = 0.0) -> None:
            """Write the dump as torch does (a pickle, replaced whole), with its mtime ``age_s`` in the past."""
            path = tmp_path / f"rank_{rank}"
            path.write_bytes(pickle.dumps(data))
            stamp = time.time() - age_s
            os.utime(path, (stamp, stamp))

    yield Job
    for fd in fds.values():
        os.close(fd)


def test_one_rank_a_sample_while_the_job_moves_and_every_rank_after_a_quiet_read(job):
    world = job(RANKS)
    progress = LiveProgress()
    assert progress.poll(world.captures) is None and job.requests() == {0: 1}  # nothing read yet: one rank
    job.answer(0, dump_at(0, 1.0))
    assert progress.poll(world.captures) is None  # a baseline shows no group past a mark: a quiet read...
    assert job.requests() == {0: 1, 1: 1, 2: 1, 3: 1}  # ...so every rank is asked
    for rank in RANKS:
        job.answer(rank, dump_at(rank, 1.0))
    assert progress.poll(world.captures) is None and job.requests() == {0: 1, 1: 1, 2: 1, 3: 1}  # still quiet
    later = {rank: dump_at(rank, 1.3) for rank in RANKS}
    for rank in RANKS:
        job.answer(rank, later[rank])  # in rank order: rank 0's dump is the oldest
    moved = progress.poll(world.captures)
    assert moved is not None and moved in set().union(*(completions(d) for d in later.values()))
    assert moved <= T0 + 1.3  # dated when the collective completed, not when its dump was read
    assert job.requests() == {0: 1}  # moving: one rank, the one whose dump is oldest
    job.answer(0, dump_at(0, 1.8))
    assert progress.poll(world.captures) is not None
    assert job.requests() == {1: 1}  # the next in turn
    assert progress.poll(world.captures) is None and job.requests() == {2: 1}  # no answer yet: one more in turn
    job.answer(1, later[1])  # the same as rank 1's last dump: it did nothing since
    assert progress.poll(world.captures) is None
    assert job.requests() == {0: 1, 1: 1, 3: 1}  # a quiet read: every rank without a request open


def test_a_rank_read_rarely_shows_no_progress_after_the_hang_that_its_groups_already_showed(job):
    """Rank 3 was last read while the job moved; after the hang ranks 0-2 were read. Its first dump since is past
    no shared group's mark, and what it alone shows (its own sends and receives) is dated before the hang."""
    progress = LiveProgress()
    world = job(RANKS)
    progress.poll(world.captures)
    job.answer(0, dump_at(0, 1.1))
    progress.poll(world.captures)  # the first answer: a baseline, so every rank is asked
    for rank in RANKS:
        job.answer(rank, dump_at(rank, 1.1))
    progress.poll(world.captures)
    assert set(job.requests()) == set(RANKS)  # quiet reads: every rank asked again
    for rank in (0, 1, 2):
        job.answer(rank, dump_at(rank, None))
    hung = [dump_at(r, None) for r in (0, 1, 2)]
    last = progress.poll(world.captures)  # the last collective, as the first member read saw it complete
    assert last in set().union(*map(completions, hung)) and last == pytest.approx(T0 + 1.868, abs=1e-3)
    job.answer(3, dump_at(3, None))
    seen = progress.poll(world.captures)
    assert seen is not None and seen <= T0 + 1.8 < time.time() - 1  # rank 3's last receive, not this read
    assert seen == pytest.approx(max(completions(dump_at(3, None))), abs=1e-6)


def test_a_dump_older_than_the_first_request_is_no_baseline(job):
    """A dump the job wrote earlier (an inspect, a past timeout) says nothing of "since the last sample"."""
    rank0 = job((0,))
    job.answer(0, dump_at(0, 1.0), age_s=30.0)
    progress = LiveProgress()
    assert progress.poll(rank0.captures) is None
    assert progress.poll(rank0.captures) is None  # the old dump was not read as a baseline
    job.answer(0, dump_at(0, 1.5))
    assert progress.poll(rank0.captures) is None  # this answer is the baseline, not progress over the old dump
    job.answer(0, dump_at(0, 1.0))
    assert progress.poll(rank0.captures) is None  # fewer completed is not progress


def test_a_lost_request_is_made_again(job, monkeypatch):
    rank0 = job((0,))
    progress = LiveProgress()
    monkeypatch.setattr(LiveProgress, "REASK_S", 0.2)
    progress.poll(rank0.captures)
    assert job.requests() == {0: 1}
    progress.poll(rank0.captures)
    assert job.requests() == {}  # not answered yet: not asked again
    time.sleep(0.3)
    progress.poll(rank0.captures)
    assert job.requests() == {0: 1}


def test_the_state_round_trips_through_plain_data(job):
    world = job(RANKS)
    progress = LiveProgress()
    progress.poll(world.captures)
    job.answer(0, dump_at(0, 1.0))
    progress.poll(world.captures)
    state = progress.state()
    assert set(state) == {"asked", "read_mtime", "marks"} and state["marks"]
    assert LiveProgress(pickle.loads(pickle.dumps(state))).state() == state
    assert set(LiveProgress(state).state({1})["asked"]) == {1}
    assert LiveProgress(state).state({1})["marks"] == state["marks"]  # the groups span the nodes: kept whole
