"""Bad targets for ``mtpdiag collect`` through the real CLI: exit 2, one stderr line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.bundle import save_bundle
from mtpdiag.capture import pyspy
from mtpdiag.errors import InputError
from mtpdiag.model import Snapshot

REPO = Path(__file__).resolve().parents[1]


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpdiag", "collect", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


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
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
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
