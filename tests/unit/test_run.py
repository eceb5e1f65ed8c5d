"""``mtpdiag run`` around commands that are no distributed job (a shell, a plain Python process): what it
launches, passes through and refuses. Nothing here is a rank, so the watcher never samples (no py-spy); the
live torchrun jobs are tests/e2e/test_run_e2e.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from mtpdiag.analysis import diagnose
from mtpdiag.analysis.stall import is_pause
from mtpdiag.commands.run import job_exit_code
from mtpdiag.model import replace
from mtpdiag.model.report import WaitState
from mtpdiag.pipeline.run_dir import flight_recorder_env
from mtpdiag.vocabulary.states import RankState
from mtpdiag.vocabulary.waits import Confidence, WaitKind
from support.captures import load_scenario
from support.jobs_e2e import ROOT, run_cli

FR_VARS = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)


def _clean_env() -> dict:
    return {k: "" for k in FR_VARS}


def test_no_command_after_the_dashes_is_one_line_and_exit_2(tmp_path):
    for args in (["run"], ["run", "--"], ["run", "--out", str(tmp_path / "r"), "--"]):
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip().splitlines() == [
            "mtpdiag: error: give the job's command after --: mtpdiag run [OPTIONS] -- torchrun ... train.py"
        ]
    assert not (tmp_path / "r").exists()  # refused before anything was made


def test_an_unwritable_out_is_refused_before_the_job_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    marker = tmp_path / "started"
    for out in (blocker, blocker / "sub"):
        result = run_cli("run", "--out", str(out), "--", "sh", "-c", f"touch {marker}")
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and str(blocker) in result.stderr
    assert not marker.exists()


def test_a_second_run_in_the_same_directory_is_refused(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "second"
    assert run_cli("run", "--out", str(out), "--", "true").returncode == 0
    result = run_cli("run", "--out", str(out), "--", "sh", "-c", f"touch {marker}")
    assert result.returncode == 2
    assert "already holds a run" in result.stderr and not marker.exists()
    assert json.loads((out / "run.json").read_text())["launcher"] == "true"  # the first run's record stands


def test_a_command_that_cannot_start_is_an_input_error_and_frees_the_directory(tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", "--out", str(out), "--", str(tmp_path / "no-such-program"))
    assert result.returncode == 2 and "cannot run" in result.stderr
    assert run_cli("run", "--out", str(out), "--", "true").returncode == 0


def test_the_jobs_output_and_exit_code_pass_through_untouched(tmp_path):
    script = "import sys; sys.stdout.buffer.write(b'out\\x00\\xff\\r\\nline'); sys.stderr.write('err\\n'); sys.exit(7)"
    result = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", script],
        capture_output=True,
        env={**os.environ, **_clean_env()},
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 7
    assert result.stdout == b"out\x00\xff\r\nline"
    assert result.stderr == b"err\n"  # mtpdiag said nothing: nothing of the user's was kept
    assert "job exited with code 7" in (tmp_path / "run" / "events.log").read_text()


def test_a_job_ended_by_a_signal_exits_as_a_shell_says(tmp_path):
    result = run_cli("run", "--out", str(tmp_path / "run"), "--", "sh", "-c", "kill -9 $$")
    assert result.returncode == 137
    assert job_exit_code(-15) == 143 and job_exit_code(3) == 3


def test_the_flight_recorder_is_set_up_in_the_run_directory(tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", "--out", str(out), "--", "env", env=_clean_env())
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert seen["TORCH_FR_BUFFER_SIZE"] == "2000" and seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert seen["TORCH_FR_DUMP_TEMP_FILE"] == str(out / "fr" / "rank_")
    assert seen["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(out / "fr-pipe" / "rank_")
    assert (out / "fr").is_dir() and (out / "fr-pipe").is_dir()
    assert set(json.loads((out / "run.json").read_text())["set"]) == set(FR_VARS)


def test_the_users_own_settings_are_kept_and_said(tmp_path):
    env = {**_clean_env(), "TORCH_FR_DUMP_TEMP_FILE": "/shared/fr/rank_", "TORCH_FR_BUFFER_SIZE": "50"}
    result = run_cli("run", "--out", str(tmp_path / "run"), "--", "env", env=env)
    assert result.returncode == 0
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert seen["TORCH_FR_DUMP_TEMP_FILE"] == "/shared/fr/rank_" and seen["TORCH_FR_BUFFER_SIZE"] == "50"
    said = result.stderr.strip().splitlines()
    assert said == [
        "mtpdiag run: keeping your TORCH_FR_BUFFER_SIZE=50 (mtpdiag's would be 2000)",
        f"mtpdiag run: keeping your TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_ (mtpdiag's would be "
        f"{tmp_path / 'run' / 'fr' / 'rank_'})",
    ]
    added, kept = flight_recorder_env({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, "/r")
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in added and kept["TORCH_NCCL_DUMP_ON_TIMEOUT"] == ("0", "1")


def test_sigterm_and_sigint_reach_the_job_and_its_exit_code_comes_back(tmp_path):
    for signum, code in ((signal.SIGTERM, 42), (signal.SIGINT, 43)):
        ready = tmp_path / f"ready-{signum}"
        script = (
            "import signal, sys, time\n"
            f"signal.signal({int(signum)}, lambda *a: sys.exit({code}))\n"
            f"open({str(ready)!r}, 'w').close()\n"
            "time.sleep(60)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "mtpdiag", "run", "--out", str(tmp_path / f"run-{signum}"), "--", sys.executable]
            + ["-c", script],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ready.exists()
            proc.send_signal(signum)
            assert proc.wait(timeout=30) == code
        finally:
            proc.kill()
            proc.wait()


def test_a_quiet_job_is_a_pause_only_when_every_rank_is_in_a_phase_of_its_own():
    snapshot, layout, _ = load_scenario("nccl_mtp_cp_pp_spin")
    report = diagnose(snapshot, layout, "flags")
    assert not is_pause(report)  # every rank at a host sync: a hang
    sleeping = WaitState(kind=WaitKind.SLEEP, confidence=Confidence.LIKELY)
    everyone = replace(report, ranks=tuple(replace(v, state=RankState.WAITING, wait=sleeping) for v in report.ranks))
    assert is_pause(everyone)  # every rank writes its checkpoint shard, or sleeps
    one = replace(report, ranks=(everyone.ranks[0], *report.ranks[1:]))
    assert not is_pause(one)  # a straggler: the others wait on it
    assert not is_pause(replace(report, ranks=()))
