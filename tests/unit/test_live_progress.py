"""``watch``'s Flight Recorder signal (``LiveProgress``) against the job's side of the debug-info pipe.

The test plays the job: it holds ``<prefix>0.pipe`` open for reading, as torch's monitor thread does, reads
the requests mtpdiag writes, and answers them late, as torch does when its monitor looks at the pipe once a
second. The answers are real dumps (tests/fixtures/fr/gloo_mtp_cp_pp): rank 2's dump, whose groups
completed 1 collective, stands for an earlier dump of the watched rank, and rank 0's, with 2, for a later one.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from mtpdiag.capture.flight_recorder import LiveProgress
from mtpdiag.model import Env, RankCapture
from support.fr_fixtures import FR_FIXTURES

FEWER, MORE = FR_FIXTURES / "gloo_mtp_cp_pp" / "rank_2", FR_FIXTURES / "gloo_mtp_cp_pp" / "rank_0"


@pytest.fixture
def job(tmp_path):
    """This process as rank 0 of a job with a debug-info pipe; ``requests()`` reads what mtpdiag asked."""
    pipe = tmp_path / "pipe_0.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    env = Env(
        RANK="0",
        TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "rank_"),
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(tmp_path / "pipe_"),
    )
    capture = RankCapture(pid=os.getpid(), rank=0, state="S", env=env)

    class Job:
        captures = (capture,)

        @staticmethod
        def requests() -> int:
            try:
                return len(os.read(fd, 128)) // 2
            except BlockingIOError:
                return 0

        @staticmethod
        def answer(dump, age_s: float = 0.0) -> None:
            """Write the dump as torch does, with its mtime ``age_s`` in the past."""
            path = tmp_path / "rank_0"
            shutil.copyfile(dump, path)
            stamp = time.time() - age_s
            os.utime(path, (stamp, stamp))

    yield Job
    os.close(fd)


def test_a_late_answer_still_counts_and_a_rank_is_asked_again_once_it_answered(job):
    progress = LiveProgress()
    assert progress.poll(job.captures) is False and job.requests() == 1
    assert progress.poll(job.captures) is False and job.requests() == 0  # not answered yet: not asked again
    job.answer(FEWER)
    assert progress.poll(job.captures) is False  # the first answer is the baseline
    assert job.requests() == 1  # answered, so asked again
    assert progress.poll(job.captures) is False and job.requests() == 0
    job.answer(MORE)  # the answer to the second request, two polls after it was asked
    assert progress.poll(job.captures) is True and job.requests() == 1
    assert progress.poll(job.captures) is False  # nothing newer since


def test_a_dump_older_than_the_first_request_is_no_baseline(job):
    """A dump the job wrote earlier (an inspect, a past timeout) says nothing of "since the last sample"."""
    job.answer(FEWER, age_s=30.0)
    progress = LiveProgress()
    assert progress.poll(job.captures) is False
    assert progress.poll(job.captures) is False  # the old dump was not read as a baseline
    job.answer(MORE)
    assert progress.poll(job.captures) is False  # this answer is the baseline, not progress over the old dump
    job.answer(FEWER)
    assert progress.poll(job.captures) is False  # fewer completed is not progress


def test_a_lost_request_is_made_again(job, monkeypatch):
    progress = LiveProgress()
    monkeypatch.setattr(LiveProgress, "REASK_S", 0.2)
    progress.poll(job.captures)
    assert job.requests() == 1
    time.sleep(0.3)
    progress.poll(job.captures)
    assert job.requests() == 1
