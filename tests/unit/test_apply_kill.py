"""Kill `mtpdiag apply` (and `apply --revert`) at random moments: the engine file must always hold either
the original bytes or the fixed bytes, and the original must never be lost.

MTPDIAG_APPLY_SLOW_WRITE holds the process between writing the temp file and renaming it over the target,
so half of the rounds can aim their SIGKILL inside that window; the other half kill at a random moment.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpdiag.fix.rewrite import SLOW_WRITE_ENV, TEMP_SUFFIX, rewrite_engine
from support.verl_wheels import verl_engine_file

pytestmark = pytest.mark.verl

ROUNDS = 12
PAUSE_S = "1.0"


def temps(directory: Path) -> list[Path]:
    return sorted(directory.glob(f".*{TEMP_SUFFIX}"))


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, SLOW_WRITE_ENV: PAUSE_S}
    return subprocess.Popen(
        [sys.executable, "-m", "mtpdiag", "apply", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def kill_at_random(proc: subprocess.Popen, directory: Path, backup: Path, aim: bool, rng: random.Random) -> bool:
    """SIGKILL the process; with ``aim``, once its temp file exists. True when it died inside the window."""
    try:
        if aim:
            while proc.poll() is None and not (temps(directory) and backup.exists()):
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            time.sleep(rng.uniform(0.0, 2.5))
        in_window = proc.poll() is None and bool(temps(directory))
        proc.kill()
        return in_window
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_killed_apply_never_leaves_a_partial_file(tmp_path):
    original = verl_engine_file("0.7.1").read_bytes()
    fixed = rewrite_engine(original).fixed
    assert fixed != original
    target = tmp_path / "transformer_impl.py"
    backup = tmp_path / "transformer_impl.py.mtpdiag.bak"
    rng = random.Random(5895)
    windows = 0
    outcomes = set()
    for round_ in range(ROUNDS):
        target.write_bytes(original)
        backup.unlink(missing_ok=True)
        windows += kill_at_random(start("--path", str(target)), tmp_path, backup, round_ % 2 == 0, rng)
        data = target.read_bytes()
        assert data in (original, fixed), f"round {round_}: the engine holds neither the original nor the fix"
        outcomes.add("fixed" if data == fixed else "original")
        if backup.exists():
            assert backup.read_bytes() == original
        elif data == fixed:
            pytest.fail(f"round {round_}: the file was fixed without a backup of the original")
    assert windows >= 1, "no SIGKILL landed between the temp file and the rename"
    assert "original" in outcomes

    # A run left alone finishes the job and sweeps up the temp files the killed runs left behind.
    target.write_bytes(original)
    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "apply", "--path", str(target)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == fixed
    assert backup.read_bytes() == original
    assert temps(tmp_path) == []


def test_killed_revert_never_loses_the_original(tmp_path):
    original = verl_engine_file("0.7.1").read_bytes()
    fixed = rewrite_engine(original).fixed
    target = tmp_path / "transformer_impl.py"
    backup = tmp_path / "transformer_impl.py.mtpdiag.bak"
    rng = random.Random(1)
    for round_ in range(ROUNDS // 2):
        target.write_bytes(fixed)
        backup.write_bytes(original)
        kill_at_random(start("--path", str(target), "--revert"), tmp_path, backup, round_ % 2 == 0, rng)
        data = target.read_bytes()
        assert data in (original, fixed)
        if data == fixed:  # not restored yet: the backup must still be there, whole
            assert backup.read_bytes() == original


def test_bad_slow_write_value_is_one_line(tmp_path):
    target = tmp_path / "transformer_impl.py"
    shutil.copyfile(verl_engine_file("0.7.1"), target)
    before = target.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "apply", "--path", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, SLOW_WRITE_ENV: "soon"},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and SLOW_WRITE_ENV in proc.stderr
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transformer_impl.py"]
