"""What the hardening tests share: the real CLI in a fresh interpreter, and what its failures must look like
(one stderr line, the documented exit code, no traceback; partial results with one warning line)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import unavailable
from support.captures import scenario_dir

REPO = Path(__file__).resolve().parents[2]
MTP = Path(scenario_dir("mtp_cp_pp"))
REPORT_STATES = {"collective", "waiting", "running", "stopped", "gone", "unreadable"}


def mtpdiag(
    *args: str,
    prefix: tuple[str, ...] = (),
    python: str = sys.executable,
    env: dict | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter, optionally behind a wrapper such as ``setpriv``."""
    return subprocess.run(
        [*prefix, python, "-m", "mtpdiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
        cwd=REPO,
    )


def one_error_line(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The run failed with ``code`` and exactly one ``mtpdiag: error:`` line that holds ``words``."""
    assert done.returncode == code, (done.returncode, done.stdout[-1000:], done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpdiag: error: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert done.stdout == ""
    return lines[0]


def partial_report(done: subprocess.CompletedProcess, *words: str) -> dict:
    """A report was printed (exit 1: a problem, or 4: ranks stuck for reasons the evidence cannot give; never 0
    with a rank unread) and stderr is one ``mtpdiag: warning:`` line holding ``words``."""
    assert done.returncode in (1, 4), (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpdiag: warning: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return json.loads(done.stdout)


def needs_root_and(tool: str) -> None:
    if os.geteuid() != 0 or shutil.which(tool) is None:
        unavailable(f"needs root and {tool}")


def without_cap(*caps: str) -> tuple[str, ...]:
    """``setpriv`` arguments that drop ``caps`` from the bounding set: root keeps uid 0 but not their power."""
    return ("setpriv", "--bounding-set=" + ",".join(f"-{c}" for c in caps))
