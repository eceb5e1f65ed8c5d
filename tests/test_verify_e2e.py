"""``mtpdiag verify`` through the real CLI: real torchrun + gloo worlds, real megatron-core, real py-spy.

Three real runs (4 worlds of at most 2 CPU ranks): ``--cp 2 --engine both --json``, ``--cp 1 --engine
buggy`` and ``--cp 2 --engine buggy``. After each, none of its workers may be alive and its result
directories must be gone. The input-error tests start no world.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.layout import ParallelLayout
from mtpdiag.verify.runner import WORKER_SCRIPT

REPO = Path(__file__).resolve().parents[1]


def run_verify(*args: str, tmp: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real CLI. With ``tmp``, verify's result directories (named on every worker's command
    line) go under it, so this test's workers can be told from those of other runs on the machine."""
    env = dict(os.environ, TMPDIR=str(tmp)) if tmp is not None else None
    return subprocess.run([sys.executable, "-m", "mtpdiag", "verify", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def surviving_workers(marker: str) -> list[int]:
    """Live processes (not zombies) running our worker script with ``marker`` on their command line."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if WORKER_SCRIPT in argv and any(marker in a for a in argv) and state != "Z":
            out.append(int(name))
    return out


@pytest.fixture
def run_dir(tmp_path):
    """A TMPDIR for one verify run; afterwards none of its workers may be alive."""
    yield tmp_path
    left = surviving_workers(str(tmp_path))
    assert not left, f"verify left worker processes behind: {left}"
    assert not list(tmp_path.glob("mtpdiag-verify-*")), "verify left its result directories behind"


@pytest.mark.e2e
def test_both_engines_cp2_buggy_deadlocks_fixed_completes(run_dir):
    proc = run_verify("--cp", "2", "--engine", "both", "--json", tmp=run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "mtpdiag.verify/1"
    assert doc["layout"]["cp"] == 2 and doc["safe"] is True
    runs = {r["engine"]: r for r in doc["runs"]}
    assert set(runs) == {"buggy", "fixed"}

    buggy = runs["buggy"]
    assert buggy["outcome"] == "deadlock"
    assert buggy["report"] is not None, buggy["notes"]
    assert "mtp-cp-gated-reduce" in [f["id"] for f in buggy["report"]["findings"]]
    assert buggy["metric"]["writes"] == 0  # the src rank never got out of the reduce

    fixed = runs["fixed"]
    layout = ParallelLayout.for_world(2, cp=2)
    assert fixed["outcome"] == "completed"
    assert fixed["metric"]["expected"] == fixed["metric"]["observed"] == 1.5  # mean of losses 1 and 2
    assert fixed["metric"]["group"] == [0, 1]
    assert fixed["metric"]["writes"] == len(layout.groups("dp_cp")) == 1
    assert fixed["report"] is None


@pytest.mark.e2e
def test_buggy_gate_completes_without_context_parallelism(run_dir):
    proc = run_verify("--cp", "1", "--engine", "buggy", tmp=run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "buggy: completed" in proc.stdout
    assert "needs CP>1" in proc.stdout


@pytest.mark.e2e
def test_buggy_gate_with_context_parallelism_is_unsafe(run_dir):
    proc = run_verify("--engine", "buggy", "--cp", "2", tmp=run_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "buggy: deadlock" in proc.stdout
    assert "UNSAFE" in proc.stdout


@pytest.mark.parametrize("args, words", [
    (("--tp", "4", "--cp", "4", "--pp", "2", "--engine", "both"), "at most 16"),
    (("--cp", "2", "--dp", "16", "--engine", "fixed"), "--dp 1"),
    (("--cp", "3", "--ep", "2", "--dp", "1", "--engine", "both"), "does not divide"),
    (("--override", "a.b=1", "--engine", "both"), "--override needs --config"),
    (("--engine", "nonsense"), "use one of"),
    (("--engine", "/nonexistent/transformer_impl.py"), "no such file"),
    (("--config", str(REPO / "tests/fixtures/configs/ppo_megatron_cp2_pp2.yaml"), "--cp", "4", "--engine", "both"),
     "layout conflict: --cp 4"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    proc = run_verify(*args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
