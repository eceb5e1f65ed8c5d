"""Bad live targets through the real CLI (``python -m mtpdiag``): a pid that is gone or not Python, ptrace
refused, workers that exit mid-capture, a stopped rank, no py-spy. One stderr line, the documented exit code
(2 input error, 3 nothing captured), no traceback, and partial results kept where there are any.

Live targets are small ``python -c`` programs with RANK/WORLD_SIZE in their environment (workers as far as
mtpdiag can tell; no torch), so the file runs fast. Privileges are taken away rather than granted: the tests
run as root, and ``setpriv --bounding-set=-cap`` runs mtpdiag (or a target) without CAP_SYS_PTRACE.
docs/hardening.md maps each input class to its test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from mtpdiag.capture import procfs
from mtpdiag.model import STATE_STOPPED
from support.hardening import REPORT_STATES, mtpdiag, needs_root_and, one_error_line, partial_report, without_cap

SLEEP = "import time; time.sleep(300)"
NON_DUMPABLE = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(300)"  # PR_SET_DUMPABLE


@pytest.fixture
def start():
    """Start processes for a test; every one (and its descendants) is SIGKILLed afterwards."""
    procs: list[subprocess.Popen] = []

    def run(*cmd: str, env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        for pid in [*procfs.descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)


def ranked(start, rank: int, world: int, code: str = SLEEP, prefix: tuple[str, ...] = ()) -> int:
    """A Python worker (RANK/WORLD_SIZE set) running ``code`` (each one sleeps); returns its pid once it sleeps
    there: its main thread has gone quiet, past the imports, which a loaded machine can stretch over seconds."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
    proc = start(*prefix, sys.executable, "-c", code, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stat = procfs.read_stat(proc.pid)
        if stat and procfs.is_python(proc.pid) and (procfs.read_env(proc.pid) or {}).get("RANK") == str(rank):
            return _asleep(proc.pid)
        time.sleep(0.05)
    raise AssertionError(f"pid {proc.pid} never became a ranked Python process")


def _asleep(pid: int, timeout: float = 120.0) -> int:
    """``pid`` once it has slept (state S) with an idle main thread at every read for a second: still in its imports
    it would be runnable (R), or waiting for a CPU with its ticks still (which "no CPU used" alone mistakes for
    sleep)."""
    deadline = time.monotonic() + timeout
    since, last = None, None
    while time.monotonic() < deadline:
        stat, ticks = procfs.read_stat(pid), procfs.main_thread_ticks(pid)
        if stat is None or ticks is None:
            raise AssertionError(f"pid {pid} exited before it slept")
        if stat.state != "S" or ticks != last:
            since, last = None, ticks
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} never slept in its code within {timeout} s")


# ------------------------------------------------------------------------------------------ live targets


def test_nonexistent_pid(start):
    gone = start("true")
    gone.wait(timeout=30)
    one_error_line(mtpdiag("inspect", "--pid", str(gone.pid)), 2, f"pid {gone.pid} does not exist")


def test_non_python_pid(start):
    sleeper = start("sleep", "300")
    one_error_line(
        mtpdiag("inspect", "--pid", str(sleeper.pid), "--json"), 2, f"pid {sleeper.pid} is not a Python process"
    )


def test_ptrace_denied_is_nothing_captured_with_the_reason(start):
    """mtpdiag without CAP_SYS_PTRACE against a non-dumpable root worker: py-spy is refused (exit 3)."""
    needs_root_and("setpriv")
    worker = ranked(start, 0, 1, NON_DUMPABLE)
    one_error_line(
        mtpdiag("inspect", "--pid", str(worker), prefix=without_cap("sys_ptrace")),
        3,
        "could not capture any of 1 target",
        "permission denied",
        "CAP_SYS_PTRACE",
    )


def test_ptrace_denied_on_one_rank_keeps_the_other(start):
    """The readable rank (started with the same reduced capabilities) is reported; the other is unreadable."""
    needs_root_and("setpriv")
    denied = ranked(start, 0, 2, NON_DUMPABLE)
    readable = ranked(start, 1, 2, prefix=without_cap("sys_ptrace"))
    done = mtpdiag("inspect", "--pid", str(denied), "--pid", str(readable), "--json", prefix=without_cap("sys_ptrace"))
    report = partial_report(done, "1 of 2 ranks not captured", "rank 0", "permission denied")
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[0]["state"] == "unreadable" and "permission denied" in ranks[0]["error"]
    assert ranks[1]["state"] == "waiting" and report["stacks"][ranks[1]["stack"]][-1]["function"] == "<module>"
    assert ranks[1]["wait"]["kind"] == "sleep"  # time.sleep: /proc says clock_nanosleep, the line calls sleep()
    assert report["verdict"] == "incomplete"


CHURN = """
import os, random, subprocess, sys, time
CHILD = "import random, time; time.sleep(random.uniform(0.3, 2.0))"
workers = {}
while True:
    for rank in range(4):
        if rank not in workers or workers[rank].poll() is not None:
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4")
            workers[rank] = subprocess.Popen([sys.executable, "-c", CHILD], env=env)
    time.sleep(0.05)
"""


def test_workers_exiting_mid_capture_are_gone_or_left_out(start):
    """A launcher whose 4 ranked workers keep exiting after a random short time: capture it repeatedly.
    Each run reports the ranks it saw (a rank that exited is "gone", named on stderr), or fails with one
    line; never a crash."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    launcher = start(sys.executable, "-c", CHURN, env=env)
    time.sleep(2)
    reports = 0
    for _ in range(6):  # about one run in six catches a worker exiting between discovery and its dump
        done = mtpdiag("inspect", "--pid", str(launcher.pid), "--json", "--timeout", "10")
        assert "Traceback" not in done.stderr
        assert done.returncode in (0, 1, 2, 3, 4), done.stderr
        if done.returncode in (2, 3):  # every worker exited between discovery and the dump
            one_error_line(done, done.returncode)
            continue
        reports += 1
        report = json.loads(done.stdout)
        missing = [r for r in report["ranks"] if r["state"] in ("gone", "unreadable")]
        assert {r["state"] for r in report["ranks"]} <= REPORT_STATES
        assert all("exited" in r["error"] for r in missing if r["state"] == "gone")
        if missing:
            partial_report(done, f"{len(missing)} of {len(report['ranks'])} ranks not captured")
        else:
            assert done.stderr == ""
    assert reports >= 1  # the launcher always has workers: most runs must produce a report


def test_frozen_rank_is_captured_as_stopped_and_left_stopped(start):
    worker = ranked(start, 0, 1)
    os.kill(worker, signal.SIGSTOP)
    for flags in (["--nonblocking"], []):  # without the flag, a stopped target is read non-blocking anyway
        done = mtpdiag("inspect", "--pid", str(worker), "--json", *flags)
        # A stopped rank alone: stuck, and nothing else captured to say why: incomplete, exit 4, never 0
        assert done.returncode == 4 and done.stderr == "", (flags, done.returncode, done.stderr)
        report = json.loads(done.stdout)
        (rank,) = report["ranks"]
        assert rank["state"] == "stopped" and report["stacks"][rank["stack"]][-1]["function"] == "<module>", flags
        assert report["verdict"] == "incomplete" and report["findings"][0]["id"] == "unexplained-wait"
        assert procfs.read_stat(worker).state == STATE_STOPPED  # mtpdiag never resumes a rank a user stopped


def _venv_without_pyspy(tmp_path: Path) -> tuple[str, dict]:
    """An interpreter whose directory has no py-spy (a venv over this one's packages) and a PATH without it."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    # --system-site-packages reaches the base interpreter's packages only: when this one is itself a venv (the
    # project's .venv), add its packages, .pth files included, so that mtpdiag's dependencies import.
    ours = [d for d in {*site.getsitepackages(), sysconfig.get_path("purelib")} if os.path.isdir(d)]
    theirs = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(theirs, "_mtpdiag_tests_parent.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in sorted(ours))
    )
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not os.path.exists(os.path.join(d, "py-spy"))
    )
    env = dict(os.environ, PATH=path)
    assert shutil.which("py-spy", path=path) is None
    assert not (venv / "bin" / "py-spy").exists()
    return python, env


def test_py_spy_missing(start, tmp_path):
    python, env = _venv_without_pyspy(tmp_path)
    worker = ranked(start, 0, 1)
    one_error_line(
        mtpdiag("inspect", "--pid", str(worker), python=python, env=env),
        2,
        "py-spy not found on PATH",
        "pip install py-spy",
    )
    bundle = tmp_path / "b.json"
    one_error_line(
        mtpdiag("collect", "--pid", str(worker), "--out", str(bundle), python=python, env=env), 2, "py-spy not found"
    )
    assert not bundle.exists()
