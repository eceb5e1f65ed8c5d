"""Ranks that finalized Python on their way out are a job ending, not a capture failure (issue #22: a CI run's
``watch`` of a job that ended exited 3, "could not capture any of 2 target(s) (pid 28084: R; pid 28085: Error:
Failed to find a python interpreter in the .data section)": it sampled the ranks in their teardown, after Python
was finalized and before the processes were gone).

The rank here is a real Python process that, like a rank in its teardown, lives on after ``Py_Finalize``: a C
exit handler (``sleep``) keeps it there. It is captured with the real py-spy.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mtpdiag.capture import capture, procfs
from mtpdiag.capture.pyspy import CaptureFailed, dump
from mtpdiag.errors import InputError, NothingCaptured
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.watcher import JobEnded, Watcher
from mtpdiag.vocabulary.states import ProcessState

# Runs until a line arrives on stdin, then exits; libc calls sleep(3600) after Python is finalized.
_LINGERING = """
import ctypes, sys
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.sleep, ctypes.c_void_p), ctypes.c_void_p(3600), None)
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def rank():
    """A Python process that runs until told to exit, then lingers without Python (see the module docstring)."""
    proc = subprocess.Popen([sys.executable, "-c", _LINGERING], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _finalize(proc: subprocess.Popen[bytes]) -> None:
    """Let the rank exit, and wait until py-spy finds no interpreter in it (its Python is finalized)."""
    assert proc.stdin is not None
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        try:
            dump(proc.pid, nonblocking=True)
        except CaptureFailed as exc:
            if exc.no_interpreter:
                return
        time.sleep(0.1)
    pytest.fail(f"pid {proc.pid} still had a Python interpreter 120 s after it was told to exit")


def _listed(pid: int) -> list[int]:
    stat = procfs.read_stat(pid)
    if stat is None or stat.state == ProcessState.ZOMBIE:
        raise InputError(f"pid {pid} does not exist")
    return [pid]


def _watcher(pid: int) -> Watcher:
    return Watcher(
        list_targets=lambda: _listed(pid),
        take_stacks=lambda targets, busy: capture(targets, nonblocking=busy, expand=False),
        layout=LayoutOptions(),
        interval=1.0,
        stall=5.0,
    )


def test_capture_of_a_rank_without_python_says_it_is_exiting(rank):
    _finalize(rank)
    with pytest.raises(NothingCaptured, match="Failed to find a python interpreter") as raised:
        capture([rank.pid], expand=False)
    assert raised.value.exiting and not raised.value.timed_out


def test_a_live_rank_is_not_exiting(rank):
    assert capture([rank.pid], expand=False).captures[0].threads
    assert not CaptureFailed("py-spy timed out after 1s", timed_out=True).no_interpreter


def test_watch_takes_ranks_that_finalized_python_for_a_job_ending_then_ends(rank):
    watcher = _watcher(rank.pid)
    watcher.sample(0.0)  # the CPU baseline
    assert watcher.sample(1.0).snapshot is not None  # the rank read while it runs Python
    _finalize(rank)
    assert watcher.sample(2.0).snapshot is None  # no stacks, and no NothingCaptured (exit 3)
    quiet_since = watcher.tracker.quiet_since
    assert watcher.sample(3.0).snapshot is None
    assert watcher.tracker.quiet_since == quiet_since  # a rank asleep in its teardown is not seen to move
    rank.kill()
    rank.wait()
    with pytest.raises(JobEnded):
        watcher.sample(4.0)


def test_last_look_at_ranks_that_finalized_python_is_the_end_of_the_job(rank):
    watcher = _watcher(rank.pid)
    watcher.sample(0.0)
    watcher.sample(1.0)
    _finalize(rank)
    with pytest.raises(JobEnded):
        watcher.last_look()


def test_a_rank_never_read_without_python_is_still_nothing_captured(rank):
    """py-spy says the same of a Python build it cannot read, for good: only ranks read before are exiting."""
    _finalize(rank)
    watcher = _watcher(rank.pid)
    watcher.sample(0.0)
    with pytest.raises(NothingCaptured, match="python interpreter"):
        watcher.sample(1.0)
