"""``mtpdiag run``'s directory stays small over a long healthy job (issue #21, item 6), and a rank that exited
gets the last lines of its own log (item 7).

The watching is ``run``'s Supervisor and a ``Watcher(spare=True)`` over a snapshot recorded from a real job
(tests/fixtures/captures), whose rank 0 is a live child process here; the Flight Recorder's answers are a
``ProgressSignal`` that moves in bursts, so the job keeps going from progress to slow and back, the phase changes
``events.log`` records. Nothing runs py-spy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from mtpdiag.commands.run import OnHang, Supervisor
from mtpdiag.inputs.bundle import load_bundle
from mtpdiag.model import replace
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline import run_files as rf
from mtpdiag.pipeline.run_dir import RunDir
from mtpdiag.pipeline.watcher import Watcher
from support.captures import CAPTURES

WINDOW = 10.0


class _Bursts:
    """A collective completed at 20 polls in a row, then none for 5 (shorter than the window: slow, not hung)."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self, captures) -> float | None:  # noqa: ARG002 - ProgressSignal's signature
        self.polls += 1
        return time.time() if self.polls % 25 < 20 else None  # completed as it was read


def _supervisor(tmp_path, child) -> Supervisor:
    bundle = load_bundle(os.path.join(CAPTURES, "nccl_mtp_cp_pp_spin", "bundle.json"))
    rank0 = replace(bundle.captures[0], pid=child.pid)
    snapshot = replace(bundle, captures=(rank0,))
    layout = LayoutOptions(cp=2, pp=2)
    supervisor = Supervisor(
        child, RunDir.claim(tmp_path / "run"), layout, OnHang.KEEP, WINDOW, 1800.0, 1.0, False, 30, 10
    )
    supervisor.watcher = Watcher(
        list_targets=lambda: [child.pid],
        take_stacks=lambda _pids, _busy: snapshot,
        layout=LayoutOptions(cp=2, pp=2),
        interval=1.0,
        stall=WINDOW,
        fr_progress=_Bursts(),
        read_cpu=lambda pids: {p: time.monotonic_ns() for p in pids},  # a spinning main thread
        local_fr=True,
        arm_on_progress=True,
        spare=True,
    )
    return supervisor


def test_a_long_healthy_run_keeps_its_directory_bounded(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        supervisor = _supervisor(tmp_path, child)
        supervisor.run_dir.max_log_bytes = 8 << 10  # the bound, small enough to be passed many times here
        base = time.monotonic()
        for second in range(6000):  # 100 minutes of samples, one a second
            assert supervisor._step(base + second) is None
        events = tmp_path / "run" / "events.log"
        older = tmp_path / "run" / "events.log.1"
        lines = older.read_text().splitlines() + events.read_text().splitlines()
        longest = max(len(line) + 1 for line in lines)
        assert events.stat().st_size <= (8 << 10) + longest and older.stat().st_size <= (8 << 10) + longest
        assert lines[-1].split(" ", 1)[1].startswith(str(supervisor.phase))  # the newest phase is kept
        assert sum(" slow: " in line for line in lines) > 50  # many phase changes were written, and rotated
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
            "events.log",
            "events.log.1",
            "fr",
            "fr-pipe",
            "run.json",
        ]  # no hang was called, no sample was written
        assert not supervisor.called and supervisor.watcher.reads
        assert len(supervisor.watcher.tracker.stacks) <= 1  # the last stacks of the one rank, no history
        print(f"\n{len(lines)} events kept of 6000 samples; {supervisor.watcher.reads}")
    finally:
        child.kill()
        child.wait()


def test_only_the_first_hangs_are_written_in_full(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        supervisor = _supervisor(tmp_path, child)
        supervisor.watcher.local_fr = False  # the recorded ranks' dumps are not on this host
        supervisor.watcher.last = supervisor.watcher.take_stacks([], False)
        for _ in range(rf.MAX_HANG_REPORTS + 2):
            assert supervisor._call(time.monotonic()) is None  # --on-hang keep
            supervisor.called = False  # as if the job had recovered in between
    finally:
        child.kill()
        child.wait()
    out = tmp_path / "run"
    written = sorted(p.name for p in out.iterdir() if p.name.startswith("hang-"))
    assert written == sorted(f"hang-{n}" for n in range(2, rf.MAX_HANG_REPORTS + 1))
    assert (out / "report.txt").exists() and all((out / name / "report.txt").exists() for name in written)
    events = (out / "events.log").read_text()
    assert events.count("hang called after") == rf.MAX_HANG_REPORTS + 2
    assert events.count(f"not written: the run directory keeps the first {rf.MAX_HANG_REPORTS} hangs") == 2


def test_a_rank_that_exited_gets_the_last_lines_of_its_torchrun_log(tmp_path):
    """torchrun --tee/--redirects: the rank's stderr goes to ``<dir>/stderr.log``, beside the error file whose
    path torchrun gives it in TORCHELASTIC_ERROR_FILE. The rank is a real process that prints and dies."""
    logs = tmp_path / "attempt_0" / "1"
    logs.mkdir(parents=True)
    script = (
        "import sys\n"
        "for i in range(15): print(f'rank 1 step {i}', file=sys.stderr)\n"
        "print('\\x1b[2Jcleared?', file=sys.stderr)\n"
        "sys.stdin.read()\n"
        "1 / 0\n"
    )
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(logs / "error.json")}
    with open(logs / "stderr.log", "w") as err:
        rank = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 60
        while "cleared?" not in (logs / "stderr.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # it runs the script, so its environment is its own (not its parent's before exec)
        where = rf.rank_log_dir(rank.pid)  # read while it lives, as run reads it when it first sees a rank
        assert where == str(logs)
        rank.communicate(b"", timeout=60)
    finally:
        rank.kill()
        rank.wait()
    tail = rf.rank_log_tail(where)
    assert tail is not None and tail[0] == "stderr.log" and len(tail[1]) == rf.TAIL_LINES
    assert tail[1][-1] == "ZeroDivisionError: division by zero"
    assert "rank 1 step 14" in tail[1] and "rank 1 step 4" not in tail[1]
    assert all(line.isprintable() for line in tail[1])  # the escape sequence was replaced
    text = rf.exit_text(1, rank.pid, "with code 1", tail)
    assert (
        text.splitlines()[0]
        == f"rank exited: rank 1 (pid {rank.pid}) with code 1; the last 10 lines of its stderr.log:"
    )
    assert text.splitlines()[1] == f"    {tail[1][0]}"
    assert rf.rank_log_tail(str(tmp_path)) is None  # torchrun kept no log (no --tee, no --redirects)
    assert rf.exit_text(1, 5, "with code 1", None).endswith(rf.NO_LOG_HINT)
