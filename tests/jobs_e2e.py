"""Shared helpers for end-to-end tests: run real torchrun/gloo jobs and the real ``mtpdiag`` CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from mtpdiag.capture import procfs
from mtpdiag.fix.verify.launch import Job, start_torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MTP_WORKER = os.path.join(ROOT, "examples", "mtp_cp_deadlock", "worker.py")
GATED_WORKER = os.path.join(ROOT, "examples", "gated_collectives", "worker.py")


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m mtpdiag ARGS`` as a user would run it."""
    return subprocess.run([sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """The same entry point (mtpdiag.cli.main) in this process: no interpreter start-up per call."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from mtpdiag.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["mtpdiag", *args]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def run_json(*args: str, expect: int = 1) -> dict:
    result = run_cli(*args, "--json")
    assert result.returncode == expect, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


@contextmanager
def hung_job(script: str, args: list[str], tmp_path, nproc: int = 4, env: dict | None = None,
             stop_rank: int | None = None):
    """A real job that has stopped making progress; killed (every descendant) on exit."""
    job = start_torchrun(script, args, nproc, env=env, log_path=str(tmp_path / "job.log"))
    try:
        if stop_rank is not None:
            pids = job.wait_for_workers(timeout=120)
            _wait_for_log(tmp_path / "job.log", "step", timeout=120)
            os.kill(_pid_of_rank(pids, stop_rank), signal.SIGSTOP)
        job.wait_until_stuck(quiet_s=2.5, timeout=180)
        yield job
    finally:
        job.kill()


def _pid_of_rank(pids: list[int], rank: int) -> int:
    for pid in pids:
        if (procfs.read_env(pid) or {}).get("RANK") == str(rank):
            return pid
    raise AssertionError(f"no worker with RANK={rank}")


def _wait_for_log(path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared in {path}")


def require_private_network() -> None:
    """Skip unless jobs may run in their own network namespace (root, and ``unshare --net`` allowed);
    in CI (``CI`` set) fail instead: there the network-loss reproducer must run."""
    if os.geteuid() != 0:
        reason = "needs root for unshare --net / nsenter"
    else:
        try:
            probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=30)
            reason = None if probe.returncode == 0 else f"unshare --net refused: {probe.stderr.strip()}"
        except FileNotFoundError:
            reason = "unshare (util-linux) is not installed"
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def by_rank(report: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in report["ranks"]}


def worker_pids(job: Job) -> dict[int, int]:
    return {int((procfs.read_env(p) or {})["RANK"]): p for p in job.workers()}


def session_members(sessions: set[int]) -> list[int]:
    """The live processes of these sessions (a job started with ``start_new_session`` leads one)."""
    members = []
    for pid in procfs.all_pids():
        stat = procfs.read_stat(pid)
        if stat is not None and stat.session in sessions and stat.state != "Z":
            members.append(pid)
    return members


def end_sessions(sessions: set[int], also: set[int] = frozenset()) -> list[int]:
    """SIGKILL every process of the sessions, ``also`` and every descendant of them; what is left (should be none).

    Everything is stopped before anything is killed, so a raylet cannot start a worker in between.
    """
    for _ in range(5):
        pids = set(session_members(sessions)) | {p for p in also if procfs.read_stat(p)}
        pids |= {d for p in list(pids) for d in procfs.descendants(p)}
        if not pids:
            return []
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                (s := procfs.read_stat(p)) is not None and s.state != "Z" for p in pids):
            time.sleep(0.1)
    return session_members(sessions)
