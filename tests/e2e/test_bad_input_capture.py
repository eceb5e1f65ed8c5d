"""Bad targets for ``mtpdiag collect`` through the real CLI: exit 2, one stderr line, no traceback."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from mtpdiag.capture import capture, procfs, pyspy
from mtpdiag.errors import InputError, NothingCaptured
from mtpdiag.inputs.bundle import save_bundle
from mtpdiag.model import Snapshot

REPO = Path(__file__).resolve().parents[2]


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", "collect", *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def _assert_usage_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0]
    assert done.stdout == ""


@pytest.fixture
def started():
    procs: list[subprocess.Popen] = []

    def start(*cmd: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_nonexistent_pid(tmp_path, started):
    gone = started("true")
    gone.wait(timeout=10)
    done = _collect("--pid", str(gone.pid), "--out", str(tmp_path / "b.json"))
    _assert_usage_error(done, f"pid {gone.pid} does not exist")
    assert not (tmp_path / "b.json").exists()


def test_non_python_pid(tmp_path, started):
    sleeper = started("sleep", "100")
    done = _collect("--pid", str(sleeper.pid), "--out", str(tmp_path / "b.json"))
    _assert_usage_error(done, f"pid {sleeper.pid}", "not a Python process", "no ranked Python descendants")


def test_python_pid_without_rank(tmp_path, started):
    idle = started(sys.executable, "-c", "import time; time.sleep(100)")
    done = _collect("--pid", str(idle.pid), "--out", str(tmp_path / "b.json"))
    _assert_usage_error(done, f"pid {idle.pid}", "without RANK")


def test_invalid_pid_value(tmp_path):
    _assert_usage_error(_collect("--pid", "0", "--out", str(tmp_path / "b.json")), "pid 0")
    _assert_usage_error(_collect("--pid", "twelve", "--out", str(tmp_path / "b.json")))


def test_out_in_a_missing_directory_fails_before_capturing(tmp_path, started):
    sleeper = started("sleep", "100")  # not a worker either: the destination is checked first
    done = _collect("--pid", str(sleeper.pid), "--out", str(tmp_path / "nowhere" / "b.json"))
    _assert_usage_error(done, "nowhere", "does not exist")


def test_missing_out(started):
    sleeper = started("sleep", "100")
    _assert_usage_error(_collect("--pid", str(sleeper.pid)), "out")


def test_py_spy_missing_is_an_input_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(InputError, match=r"py-spy not found on PATH \(pip install py-spy\)"):
        pyspy.find_pyspy()


def test_bundle_into_missing_directory(tmp_path):
    with pytest.raises(InputError) as exc:
        save_bundle(Snapshot(captures=()), str(tmp_path / "nowhere" / "b.json"))
    assert "nowhere" in str(exc.value) and "\n" not in str(exc.value)


def test_py_spy_errors_become_one_line(started):
    sleeper = started("sleep", "100")
    with pytest.raises(pyspy.CaptureFailed) as exc:
        pyspy.dump(sleeper.pid, timeout=30.0)
    assert "\n" not in str(exc.value) and "Error" in str(exc.value)
    assert "backtrace" not in str(exc.value).lower()


@pytest.mark.usefixtures("started")
def test_every_target_failing_is_nothing_captured(tmp_path, monkeypatch):
    """A ranked Python process whose dump cannot finish in time: NothingCaptured (exit 3), target untouched.

    The py-spy here stops itself before it starts (SIGSTOP, then it execs the real one): it cannot finish. A real
    py-spy given 1 ms was not reliably too slow: it may finish before mtpdiag's clock has counted a millisecond
    of it (CI-50, on a loaded machine), and a py-spy that has exited is done."""
    import os

    stopped_py_spy = tmp_path / "py-spy"
    stopped_py_spy.write_text(f'#!/bin/sh\nkill -STOP $$\nexec {shlex.quote(pyspy.find_pyspy())} "$@"\n')
    stopped_py_spy.chmod(0o755)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", WANDB_API_KEY="canary-5e3b")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(100)"], env=env, stdin=subprocess.DEVNULL)
    try:
        _wait_until_python(worker.pid)
        with monkeypatch.context() as patched:
            patched.setattr(pyspy, "find_pyspy", lambda: str(stopped_py_spy))
            with pytest.raises(NothingCaptured) as exc:
                capture([worker.pid], timeout=0.5)
        assert exc.value.exit_code == 3 and "timed out" in str(exc.value) and "\n" not in str(exc.value)
        assert procfs.read_stat(worker.pid).state != "T"  # not left stopped
        (c,) = capture([worker.pid], timeout=30.0).captures
        assert c.rank == 0 and c.world_size == 1 and c.main_thread.frames[-1].function == "<module>"
        assert "canary" not in str(msgspec.to_builtins(c))
    finally:
        worker.kill()
        worker.wait(timeout=10)


def _wait_until_python(pid: int) -> None:
    """Until the interpreter has started (``sys.executable`` may be a launcher that execs it)."""
    import time

    for _ in range(400):
        stat = procfs.read_stat(pid)
        if (
            stat
            and stat.state in "SR"
            and procfs.is_python(pid)
            and (procfs.read_env(pid) or {}).get("RANK")
            and procfs.main_thread_syscall(pid) == "clock_nanosleep"
        ):  # it reached its time.sleep
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never reached its sleep as a Python process")
