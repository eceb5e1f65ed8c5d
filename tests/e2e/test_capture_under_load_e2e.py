"""Capture on a loaded node: py-spy that waits for a CPU is slow, not stuck, and every rank is still read.

The job is the healthy NCCL-behaviour loop of ``test_gpu_hang_e2e`` (3 s device steps, the host waiting at one line
for each; cp 2 on two ranks). The capture runs in a thread of this process that is put into a CPU group with a
quota of 1% of a CPU (``support/cpu_quota.py``), so py-spy, which inherits it, stays runnable and waits seconds for
each of the ~20 ms of CPU a dump needs, as on a loaded node (measured there: 20 s of run-queue wait for 18 ms on a
CPU). That is how ``watch`` failed on a healthy job in a loaded CI run: "could not capture any of 4 target(s) (...
py-spy timed out after 10s)". Here the timeout is 1 s, so a capture that counted wall time would time out on every
rank. (Two busy loops beside a py-spy at nice 19 made the same starvation, and burned a core of CI for the
module's minutes.)

The job's host syncs wait in a futex, not spinning: four spinning ranks would only starve the rest of the machine
(they made this module the slowest of CI, 25 minutes at load 40, and every other test slower with it).

No timing is asserted: the wall time of each capture is printed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from mtpdiag.capture import capture
from mtpdiag.fix.verify.launch import Job, start_torchrun
from support.cpu_quota import cpu_quota
from support.jobs_e2e import ROOT, run_cli_here, wait_for_log

pytestmark = pytest.mark.e2e

NCCL_WORKER = os.path.join(ROOT, "examples", "nccl_behaviour", "worker.py")
HEALTHY = ["--healthy", "--cp", "2", "--pp", "1", "--device-step-s", "3", "--sync", "futex"]
RANKS = [0, 1]  # two: each starved capture reads every rank, and each rank of the job costs start-up CPU
STARVED_QUOTA_US, STARVED_PERIOD_US = 1_000, 100_000  # 1% of a CPU, for the capture and its py-spy
T = TypeVar("T")


@pytest.fixture(scope="module")
def healthy_job(tmp_path_factory) -> Iterator[Job]:
    """The healthy job, once it has run a step."""
    tmp = tmp_path_factory.mktemp("under-load")
    (tmp / "fr").mkdir()
    (tmp / "pipes").mkdir()
    env = {
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp / "fr" / "rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp / "pipes" / "rank_"),
    }
    log = tmp / "job.log"
    with start_torchrun(NCCL_WORKER, HEALTHY, len(RANKS), env=env, log_path=str(log)) as job:
        job.wait_for_workers(timeout=240)
        wait_for_log(log, "rank 0 step 1 ", timeout=240, job=job)
        yield job


def starved(work: Callable[[], T]) -> T:
    """``work()`` on a thread in a CPU group with ``STARVED_QUOTA_US`` every ``STARVED_PERIOD_US``; what it starts
    (py-spy) inherits the group."""
    result: list[T] = []
    failure: list[BaseException] = []

    with cpu_quota(STARVED_QUOTA_US, STARVED_PERIOD_US, "a py-spy that waits for a CPU") as group:

        def run() -> None:
            try:
                group.add_thread(threading.get_native_id())
                result.append(work())
            except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
                failure.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=run, name="starved-capture")
        thread.start()
        thread.join(timeout=1800)  # a starved watch scales its window to its captures: 900 s was overrun at load 40
        assert not thread.is_alive(), "the starved capture never returned"
        print(f"\nstarved ({STARVED_QUOTA_US / STARVED_PERIOD_US:.0%} of a CPU): {time.monotonic() - started:.1f} s")
        if failure:
            raise failure[0]
        return result[0]


@pytest.mark.parametrize("nonblocking", [False, True], ids=["paused", "nonblocking"])
def test_capture_reads_every_rank_while_py_spy_waits_for_a_cpu(healthy_job, nonblocking):
    snapshot = starved(lambda: capture([healthy_job.pid], nonblocking=nonblocking, timeout=1.0))
    assert [c.rank for c in snapshot.captures] == RANKS
    for c in snapshot.captures:
        assert c.threads and c.main_thread is not None and c.main_thread.frames, (c.rank, c.state, c.error)
        # read as asked: no timeout, so no fallback to a read without pausing
        assert c.nonblocking == nonblocking and c.error is None, (c.rank, c.error)


def test_inspect_reads_every_rank_while_py_spy_waits_for_a_cpu(healthy_job):
    result = starved(lambda: run_cli_here("inspect", "--pid", str(healthy_job.pid), "--timeout", "1", "--json"))
    assert result.returncode != 3, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert [r["rank"] for r in report["ranks"]] == RANKS
    assert all(r["stack"] is not None and r["state"] != "unreadable" for r in report["ranks"]), report["ranks"]


def test_watch_makes_no_false_call_while_py_spy_waits_for_a_cpu(healthy_job, tmp_path):
    """The failure of the loaded CI run, made certain: watch, a healthy job, a starved py-spy.

    watch sees progress by comparing samples, so it must get a few: it watches four times as long as one starved
    capture took here (at least 20 s). When the load grows meanwhile and the samples it got did not show the job
    move, watch says so (exit 4, incomplete: "run watch longer (--duration)"), never ok and never a hang; the
    test then does what it says, with twice the duration (seen in CI: 2 samples in 47 s of a 20 s watch)."""
    started = time.monotonic()
    starved(lambda: capture([healthy_job.pid], nonblocking=True, timeout=1.0))
    duration = max(20.0, 4 * (time.monotonic() - started))
    for _ in range(3):
        args = ("watch", "--pid", str(healthy_job.pid), "--duration", f"{duration:.0f}", "--timeout", "1", "--json")
        args += ("--out", str(tmp_path))  # a false call's bundle: here, not in the repository
        result = starved(lambda args=args: run_cli_here(*args))
        assert result.returncode in (0, 4), result.stderr[-2000:]  # never a hang (1), never nothing captured (3)
        if result.returncode == 0:
            break
        told = json.loads(result.stdout)
        assert told["progress"]["hang"] is False and "run watch longer (--duration)" in told["notes"][-1], told
        print(f"watch of {duration:.0f} s: {told['progress']['samples']} samples, no progress seen yet; again")
        duration *= 2
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "ok" and report["progress"]["hang"] is False
    assert report["progress"]["samples"] >= 2
    assert [r["rank"] for r in report["ranks"]] == RANKS
    assert all(r["stack"] is not None for r in report["ranks"]), report["ranks"]
    assert healthy_job.proc.poll() is None
