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
from mtpdiag.model import Env, RankCapture, Snapshot
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.watcher import FR_ANSWER_S, Watcher
from mtpdiag.vocabulary.states import WatchPhase
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
    assert set(state) == {"asked", "read_mtime", "first_read", "marks"} and state["marks"]
    assert LiveProgress(pickle.loads(pickle.dumps(state))).state() == state
    assert set(LiveProgress(state).state({1})["asked"]) == {1}
    assert LiveProgress(state).state({1})["marks"] == state["marks"]  # the groups span the nodes: kept whole


def test_established_once_every_rank_with_a_pipe_answered_a_first_time(job):
    world = job(RANKS)
    progress = LiveProgress()
    assert progress.established_at() == float("-inf")  # no rank with a pipe seen yet: nothing to wait for
    progress.poll(world.captures)
    job.answer(0, dump_at(0, 1.0))
    progress.poll(world.captures)
    assert progress.established_at() is None  # ranks 1-3 have not answered
    for rank in RANKS:
        job.answer(rank, dump_at(rank, 1.0))
    progress.poll(world.captures)
    first = progress.established_at()
    assert first is not None and first <= time.time()
    for rank in RANKS:
        job.answer(rank, dump_at(rank, 1.3))
    progress.poll(world.captures)
    assert progress.established_at() == first  # the first reads, not the latest
    restored = LiveProgress(progress.state())  # as --ray hands it to a node's capture task
    assert restored.established_at() == float("-inf")  # the pipes are seen at a poll...
    restored.poll(world.captures)
    assert restored.established_at() == first  # ...and the first reads are kept


def _watcher(world, progress: LiveProgress, stall: float) -> Watcher:
    """A watch of the ranks of ``world`` (this process), whose stacks and CPU never change."""
    snapshot = Snapshot(captures=world.captures, host="job", created="", tool_version="")
    return Watcher(
        list_targets=lambda: [os.getpid()],
        take_stacks=lambda _targets, _busy: snapshot,
        layout=LayoutOptions(),
        interval=1.0,
        stall=stall,
        fr_progress=progress,
        read_cpu=lambda targets: dict.fromkeys(targets, 0),
    )


def test_no_hang_is_called_before_the_flight_recorder_could_see_a_whole_window(job):
    """A CI run's ``watch --ray`` called a healthy job hung after 6 s: its samples were slow, and the Flight
    Recorder had read a first dump of only some ranks, so no group could yet be seen to move."""
    world = job(RANKS)
    watcher = _watcher(world, LiveProgress(), stall=0.5)
    for now in (0.0, 1.0, 2.0):
        watcher.sample(now)  # the CPU baseline, then stacks that never change: asks rank 0, which does not answer
    assert watcher.tracker.is_hang(3.0, 0.5)  # the stacks alone would call a hang
    assert watcher.decide(3.0) == WatchPhase.SLOW
    job.answer(0, dump_at(0, 1.0))
    watcher.sample(3.0)  # rank 0's first dump, then every rank asked
    for rank in RANKS:
        job.answer(rank, dump_at(rank, 1.0))
    watcher.sample(4.0)
    assert watcher.decide(4.0) == WatchPhase.SLOW  # every rank read, but not a window ago
    time.sleep(0.6)
    assert watcher.decide(4.0) == WatchPhase.HANG


def test_ranks_that_never_answer_leave_the_call_to_the_stacks_later(job):
    world = job(RANKS)
    watcher = _watcher(world, LiveProgress(), stall=0.5)
    for now in (0.0, 1.0, 2.0):
        watcher.sample(now)
    # the window counts from the last progress, less the time the blocking reads held the ranks (StallTracker.held_s)
    start = watcher.tracker.quiet_since + watcher.tracker.held_s
    assert watcher.decide(start + 0.5 + FR_ANSWER_S - 0.1) == WatchPhase.SLOW
    assert watcher.decide(start + 0.5 + FR_ANSWER_S) == WatchPhase.HANG
