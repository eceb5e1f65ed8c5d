"""At a hang's call, the Flight Recorder dumps in the report are fresh: newer than the last progress seen
(issue #21, item 3: "ask the job for its Flight Recorder dumps through the pipe").

The dumps the samples asked for are used when every rank's is newer than the last progress; a dump from before
it (or none) shows the job as it was, so the job is asked again through its pipe and the fresh one is waited
for. As in tests/unit/test_live_progress.py, the test plays the job's side of the pipe: this process is rank 0,
holds ``<prefix>0.pipe`` open for reading, and answers a request with a real dump
(tests/fixtures/fr/gloo_mtp_cp_pp/rank_0). The stacks are rank 0's recorded capture of the same reproducer.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from mtpdiag.capture import flight_recorder, procfs
from mtpdiag.inputs.bundle import load_bundle
from mtpdiag.model import Env, RankCapture, replace
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.watcher import Watcher
from support.captures import CAPTURES
from support.fr_fixtures import FR_FIXTURES

DUMP = FR_FIXTURES / "gloo_mtp_cp_pp" / "rank_0"
QUIET_S = 12.0  # the last progress was this long ago


@pytest.fixture
def rank0(tmp_path):
    """This process as rank 0 of a job with a debug-info pipe, and a Watcher whose last sample is its stacks."""
    pipe = tmp_path / "pipe_0.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    env = Env(
        RANK="0",
        WORLD_SIZE="4",
        TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "rank_"),
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(tmp_path / "pipe_"),
    )
    bundle = load_bundle(os.path.join(CAPTURES, "nccl_mtp_cp_pp_spin", "bundle.json"))
    (recorded,) = [c for c in bundle.captures if c.rank == 0]
    snapshot = replace(bundle, captures=(replace(recorded, pid=os.getpid(), env=env),))
    watcher = Watcher(
        list_targets=lambda: [os.getpid()],
        take_stacks=lambda _pids, _busy: snapshot,
        layout=LayoutOptions(cp=2, pp=2),
        interval=1.0,
        stall=10.0,
    )
    watcher.last = snapshot
    watcher.tracker = replace(watcher.tracker, quiet_since=time.monotonic() - QUIET_S, stack_samples_while_quiet=5)
    yield watcher, fd, tmp_path / "rank_0"
    os.close(fd)


def _write_dump(path, age_s: float, pause_s: float = 0.0) -> None:
    """The dump written in place, as torch writes it; with ``pause_s``, its first half that long before the rest
    (a large dump, or a writer that waits for a CPU): a read meanwhile is cut short (CI-40)."""
    data = DUMP.read_bytes()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        time.sleep(pause_s)
        f.write(data[len(data) // 2 :])
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


def _answer_requests(fd: int, path, seen: list[float], stop: threading.Event) -> None:
    """torch's monitor: it looks at the pipe every 0.2 s and dumps once for each request it reads."""
    while not stop.is_set():
        try:
            asked = len(os.read(fd, 128)) // 2
        except BlockingIOError:
            asked = 0
        if asked:
            seen.append(time.time())
            _write_dump(path, 0.0, pause_s=0.6)
        time.sleep(0.2)


def test_a_dump_older_than_the_last_progress_is_asked_for_again_and_waited_for(rank0):
    watcher, fd, path = rank0
    _write_dump(path, QUIET_S + 50)  # from a minute ago: the job as it was, before it hung
    seen: list[float] = []
    stop = threading.Event()
    monitor = threading.Thread(target=_answer_requests, args=(fd, path, seen, stop), daemon=True)
    monitor.start()
    try:
        asked_before = time.time()
        report = watcher.call_hang(time.monotonic(), fr_wait_s=30.0)
    finally:
        stop.set()
        monitor.join()
    assert watcher.fr_requested and len(seen) == 1 and seen[0] >= asked_before
    fr = watcher.last.flight_recorder
    assert fr is not None and [d.rank for d in fr.ranks] == [0]
    assert os.stat(path).st_mtime >= asked_before - 0.05  # the dump read is the one written for the call
    assert report.progress is not None and report.progress.hang


def test_dumps_newer_than_the_last_progress_are_used_without_asking(rank0):
    watcher, fd, path = rank0
    _write_dump(path, 1.0)  # the samples' last request was answered a second ago, well after the last progress
    watcher.call_hang(time.monotonic(), fr_wait_s=30.0)
    assert not watcher.fr_requested
    try:
        asked = len(os.read(fd, 128))
    except BlockingIOError:
        asked = 0
    assert asked == 0  # nothing was written to the pipe
    fr = watcher.last.flight_recorder
    assert fr is not None and [d.rank for d in fr.ranks] == [0]


def test_a_job_without_a_pipe_is_not_asked(rank0):
    watcher, _fd, path = rank0
    last = watcher.last
    no_pipe = replace(last.captures[0], env=replace(last.captures[0].env, TORCH_NCCL_DEBUG_INFO_PIPE_FILE=None))
    watcher.last = replace(last, captures=(no_pipe,))
    _write_dump(path, QUIET_S + 50)  # the watchdog's old dump: what there is
    watcher.call_hang(time.monotonic(), fr_wait_s=30.0)
    assert not watcher.fr_requested
    assert watcher.last.flight_recorder is not None


def test_a_dump_cut_short_that_stopped_changing_is_said_at_once_not_read_again(tmp_path, monkeypatch):
    """A dump is read again only while it may be mid-write (changed in the last TORN_DUMP_WAIT_S): a file cut short
    long ago stays so, and is one note at once, not TORN_DUMP_WAIT_S later."""
    path = tmp_path / "rank_0"
    data = DUMP.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    started = procfs.start_time(os.getpid())
    assert started is not None
    stamp = started + 0.01  # of this run (not older than the process), and no longer changing
    time.sleep(max(0.0, stamp + flight_recorder.TORN_DUMP_WAIT_S + 0.1 - time.time()))
    os.utime(path, (stamp, stamp))
    capture = RankCapture(
        pid=os.getpid(), rank=0, state="S", env=Env(RANK="0", TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "rank_"))
    )
    waits: list[float] = []
    monkeypatch.setattr(flight_recorder.time, "sleep", waits.append)
    found = flight_recorder.find_dumps((capture,))
    assert found.dumps is None and waits == []
    assert len(found.notes) == 1 and found.notes[0].startswith("Flight Recorder dumps found but not read"), found.notes
