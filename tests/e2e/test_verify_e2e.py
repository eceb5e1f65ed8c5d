"""``mtpdiag verify`` through the real CLI: real torchrun + gloo worlds, real megatron-core, real py-spy.

Three real runs (4 worlds of at most 2 CPU ranks): ``--cp 2 --engine both --json``, ``--cp 1 --engine
buggy`` and ``--cp 2 --engine buggy``. After each, none of its workers may be alive and its result
directories must be gone. The input-error and judgement tests start no world.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.fix.verify import MetricWrite, check_metric, expected_outcome, metric_group, rank_loss, src_ranks
from mtpdiag.fix.verify.runner import WORKER_SCRIPT
from mtpdiag.layout import ParallelLayout

REPO = Path(__file__).resolve().parents[2]


def run_verify(*args: str, tmp: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real CLI. With ``tmp``, verify's result directories (named on every worker's command
    line) go under it, so this test's workers can be told from those of other runs on the machine."""
    env = dict(os.environ, TMPDIR=str(tmp)) if tmp is not None else None
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", "verify", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


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


@pytest.mark.parametrize(
    "args, words",
    [
        (("--tp", "4", "--cp", "4", "--pp", "2", "--engine", "both"), "at most 16"),
        (("--cp", "2", "--dp", "16", "--engine", "fixed"), "--dp 1"),
        (("--cp", "3", "--ep", "2", "--dp", "1", "--engine", "both"), "does not divide"),
        (("--override", "a.b=1", "--engine", "both"), "--override needs --config"),
        (("--engine", "nonsense"), "use one of"),
        (("--engine", "/nonexistent/transformer_impl.py"), "no such file"),
        (
            (
                "--config",
                str(REPO / "tests/fixtures/configs/ppo_megatron_cp2_pp2.yaml"),
                "--cp",
                "4",
                "--engine",
                "both",
            ),
            "layout conflict: --cp 4",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    proc = run_verify(*args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------- the pure judgement (no world)


def test_src_ranks_are_one_per_dp_replica_in_one_dp_cp_group():
    layout = ParallelLayout.for_world(16, tp=2, cp=2, pp=2)  # dp 2
    src = src_ranks(layout)
    assert len(src) == layout.dp == 2
    for rank in src:
        c = layout.coords(rank)
        assert (c["tp"], c["cp"], c["pp"]) == (0, 0, 1)
    group = metric_group(layout)
    assert set(src) <= set(group) and len(group) == layout.dp * layout.cp


def test_metric_check_catches_a_mean_over_the_wrong_group_and_a_missing_writer():
    layout = ParallelLayout.for_world(4, cp=2)  # dp 2: DP×CP group [0, 1, 2, 3], src ranks 0 and 2
    right = sum(rank_loss(r) for r in range(4)) / 4
    good = check_metric(layout, [MetricWrite(0, right, (0, 1, 2, 3)), MetricWrite(2, right, (0, 1, 2, 3))])
    assert good.ok and good.observed == right and good.writes == 2

    cp_only = (rank_loss(0) + rank_loss(1)) / 2  # what an average over the CP group alone would give
    bad = check_metric(layout, [MetricWrite(0, cp_only, (0, 1))])
    assert not bad.ok
    assert any("not the DP x CP group" in p for p in bad.problems)
    assert any("did not write" in p for p in bad.problems)
    assert any(f"wrote {cp_only:g}" in p for p in bad.problems)


def test_expected_outcome_is_a_deadlock_only_for_the_buggy_gate_with_cp_above_1():
    assert expected_outcome("buggy", ParallelLayout.for_world(2, cp=2)) == "deadlock"
    assert expected_outcome("buggy", ParallelLayout.for_world(4, pp=2)) == "completed"
    assert expected_outcome("fixed", ParallelLayout.for_world(2, cp=2)) == "completed"
