"""Inputs that hold no stack, or no rank, and what the diagnosis says of them (benchmarks/accuracy held-out cases).

* every rank's capture failed (py-spy missing, ptrace refused, a py-spy too old for the Python): ``incomplete``,
  the ranks unreadable, and what makes the next capture work, never exit 3;
* a log whose lines name ranks but hold no stack (sglang's scheduler debug info): those ranks, unreadable;
* a text that names no rank and holds no stack is still no capture (exit 2);
* an NCCL watchdog log given as a dump is read as ``--log`` would read it;
* torch's "Stack trace of the failed collective" block names the call site of the failed collective;
* a paste of processes by pid (no rank anywhere): the process the others wait for, by pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.errors import InputError
from mtpdiag.inputs import load_paths, read_inputs
from mtpdiag.inputs.watchdog_log import parse_watchdog_log
from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot

REPO = Path(__file__).resolve().parents[2]


def _report(*paths: Path, **layout: int):
    return diagnose_snapshot(load_paths([str(p) for p in paths]), LayoutOptions(**layout))


def _mtpdiag(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


# ---------------------------------------------------------------- every capture failed


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        ("Error: /bin/dash: 1: py-spy: not found", "install py-spy"),
        ("Error: Permission denied (os error 13)", "CAP_SYS_PTRACE"),
        ("Error: Failed to copy Py_Version symbol", "pip install -U py-spy"),
        ("Error: something py-spy never said before", "dump every rank"),
    ],
)
def test_a_paste_whose_only_capture_failed_is_incomplete_with_how_to_capture(tmp_path, error, fix):
    failed = tmp_path / "rank2.txt"
    failed.write_text(f"$ py-spy dump --pid 171\n{error}\n")
    report = _report(failed)
    assert report.verdict == "incomplete"
    (finding,) = report.findings
    assert finding.id == "unexplained-wait" and finding.ranks == (2,)
    assert finding.summary.startswith("no stack in the input: rank 2 could not be read (py-spy:")
    assert fix in finding.remedy and "dump every rank" in finding.remedy and "Flight Recorder" in finding.remedy


def test_the_cli_says_incomplete_not_nothing_captured_when_py_spy_is_missing(tmp_path):
    """sglang's watchdog could not dump its scheduler (sglang #7783, #7553): exit 4 with the next step, not exit 3."""
    log = tmp_path / "server.log"
    log.write_text(
        "[2025-06-26 07:25:31 DP4 TP4] Pyspy failed to dump PID 113688. Error: /bin/bash: line 1: py-spy: "
        "command not found\n\n[2025-06-26 07:25:31 DP4 TP4] Watchdog timeout (self.watchdog_timeout=300)\n"
    )
    done = _mtpdiag("analyze", str(log))
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert done.stdout.startswith("INCOMPLETE: no stack in the input: pid 113688 could not be read")
    assert "install py-spy" in done.stdout
    assert done.stderr.strip().endswith("no rank's stack could be read")


# ---------------------------------------------------------------- log lines with ranks and no stack


def test_log_lines_that_name_ranks_but_hold_no_stack_are_those_ranks_unreadable(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-08-04 11:58:42 TP1] Scheduler debug info:\nscheduler.cur_batch_for_debug.batch_size()=1\n\n"
        "[2026-08-04 11:58:42 TP7] Scheduler debug info:\nscheduler.cur_batch_for_debug.batch_size()=1\n"
    )
    snapshot = load_paths([str(log)])
    assert [(c.rank, c.state) for c in snapshot.captures] == [(1, "unreadable"), (7, "unreadable")]
    assert all(c.error and c.error.startswith("no stack: only log lines") for c in snapshot.captures)
    report = diagnose_snapshot(snapshot, LayoutOptions())
    assert report.verdict == "incomplete" and report.findings[0].summary.startswith(
        "no stack in the input: none of ranks 1, 7 could be read"
    )


def test_a_text_that_names_no_rank_and_holds_no_stack_is_still_no_capture(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("the job hangs after step 300\nGPU util 100% on every card\n")
    with pytest.raises(InputError):
        load_paths([str(notes)])


# ---------------------------------------------------------------- watchdog logs given as dumps

_TIMEOUTS = "".join(
    f"[rank{r}]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
    f"timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600061 "
    "milliseconds before timing out.\n"
    for r in (0, 1)
)


def test_a_watchdog_log_given_as_a_dump_is_read_as_its_log(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(_TIMEOUTS)
    inputs = read_inputs([str(log)])
    assert inputs.logs == (str(log),) and not inputs.snapshot.captures
    assert any("read as --log" in note for note in inputs.notes)
    done = _mtpdiag("analyze", str(log))
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert done.stdout.startswith("INCOMPLETE: the NCCL watchdog log shows timeouts")
    assert "no watchdog line" not in done.stdout.casefold() and "Traceback" not in done.stderr


def test_a_log_with_no_rank_and_no_watchdog_line_is_still_refused_as_a_dump(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("epoch 3 step 120 loss 2.31\n")
    done = _mtpdiag("analyze", str(log))
    assert done.returncode == 2 and "not a py-spy dump" in done.stderr


# ---------------------------------------------------------------- the failed collective's stack

_STACK = (
    "[rank3]:[E508 07:35:59.440171617 ProcessGroupNCCL.cpp:733] Stack trace of the failed collective: \n"
    "#0 broadcast from /usr/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:2968\n"
    "#1 wrapper from /usr/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83\n"
    "#2 _receive_tokens from /usr/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py:4484\n"
    "#3 sample_tokens from /usr/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py:4215\n"
)


def test_the_failed_collectives_stack_alone_names_its_op_and_call_site():
    (t,) = parse_watchdog_log(_STACK).timeouts
    assert (t.rank, t.op, t.seq) == (3, "broadcast", None)
    assert t.site == "_receive_tokens (vllm/v1/worker/gpu_model_runner.py:4484)"


def test_the_failed_collectives_stack_goes_on_the_ranks_failure_line():
    status = (
        "[rank3]:[E508 07:35:59.44 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 5(PIPELINE_MODEL_PARALLEL_GROUP) "
        "Rank 1]  failure detected by watchdog at work sequence id: 42 PG status: last enqueued work: 42, last "
        "completed work: 41\n"
    )
    (t,) = parse_watchdog_log(status + _STACK).timeouts
    assert (t.rank, t.seq, t.op) == (3, 42, "broadcast") and t.site is not None and "_receive_tokens" in t.site


def test_the_report_names_the_failed_collectives_call_site(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(_STACK)
    done = _mtpdiag("analyze", "--log", str(log))
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "called from _receive_tokens (vllm/v1/worker/gpu_model_runner.py:4484)" in done.stdout
    assert "torch before 1.10" not in done.stdout  # no SeqNum here is the block's, not an old torch's


# ---------------------------------------------------------------- processes by pid, no rank anywhere


def _pyspy(pid: int, frames: list[str]) -> str:
    body = "\n".join(f"    {f}" for f in frames)
    header = f"Process {pid}: python pretrain_gpt.py\nPython v3.8.12 (/usr/bin/python3.8)\n\n"
    return f'{header}Thread {pid} (idle): "MainThread"\n{body}\n\n'


_BCAST = [
    "broadcast (torch/distributed/distributed_c10d.py:1191)",
    "_build_key_size_numel_dictionaries (megatron/mpu/data.py:50)",
    "broadcast_data (megatron/mpu/data.py:88)",
    "get_batch_pipe (pretrain_gpt.py:136)",
    "train (megatron/training.py:904)",
]
_LOADER = [
    "wait (threading.py:306)",
    "get (queue.py:179)",
    "_try_get_data (torch/utils/data/dataloader.py:1011)",
    "_get_data (torch/utils/data/dataloader.py:1163)",
    "_next_data (torch/utils/data/dataloader.py:1207)",
    "__next__ (torch/utils/data/dataloader.py:530)",
    "get_batch_pipe (pretrain_gpt.py:130)",
    "train (megatron/training.py:904)",
]
_BUSY = ["forward (megatron/model/gpt_model.py:77)", "train (megatron/training.py:904)"]


def test_a_process_by_pid_that_the_others_wait_for_is_the_straggler(tmp_path):
    paste = tmp_path / "node.txt"
    paste.write_text("".join(_pyspy(p, _BCAST) for p in (11, 12, 13)) + _pyspy(14, _LOADER))
    report = _report(paste, world_size=4)
    assert report.verdict == "problem"
    (finding,) = report.findings
    assert finding.id == "straggler" and finding.ranks == ()
    assert finding.summary.startswith("pid 14 is waiting for a DataLoader batch")
    assert "the 3 other processes wait in collectives" in finding.summary and "py-spy dump --pid 14" in finding.remedy
    assert not any(f.id == "missing-rank" for f in report.findings)  # 4 processes of a world of 4: none missing


def test_a_process_by_pid_on_the_cpu_is_not_called_a_straggler(tmp_path):
    """On the CPU may be a spinning host sync: from a rankless paste, not enough to blame it."""
    paste = tmp_path / "node.txt"
    paste.write_text("".join(_pyspy(p, _BCAST) for p in (11, 12, 13)) + _pyspy(14, _BUSY).replace("(idle)", "(active)"))
    report = _report(paste)
    assert report.verdict == "incomplete" and all(f.id != "straggler" for f in report.findings)


def test_one_process_in_a_collective_asks_for_every_ranks_stack(tmp_path):
    paste = tmp_path / "worker.txt"
    paste.write_text(_pyspy(11, _BCAST))
    report = _report(paste)
    assert report.verdict == "incomplete"
    (finding,) = report.findings
    assert finding.summary.startswith("one process's stack cannot say who the collective waits for: pid 11")
    assert "dump every rank's stack" in finding.remedy


# ---------------------------------------------------------------- the heartbeat monitor's "watchdog got stuck"


def test_a_log_of_the_heartbeat_monitor_alone_says_whose_watchdog_was_stuck_and_what_to_collect(tmp_path):
    """LlamaFactory #8549: the only line says rank 2's watchdog thread got stuck; it was read as an empty status."""
    log = tmp_path / "job.log"
    log.write_text(
        "[rank2]:[E704 13:48:58.260494728 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog.\n"
    )
    (status,) = parse_watchdog_log(log.read_text()).statuses
    assert (status.rank, status.stuck_s, status.last_enqueued) == (2, 480, None)
    done = _mtpdiag("analyze", "--log", str(log), "--json")
    assert done.returncode == 4, (done.stdout, done.stderr)
    (finding,) = json.loads(done.stdout)["findings"]
    assert finding["ranks"] == [2] and finding["summary"].startswith(
        "the NCCL watchdog log names no collective: the NCCL watchdog thread of rank 2 was stuck for up to 480 s"
    )
    assert "mtpdiag inspect --native" in finding["remedy"] and "Flight Recorder" in finding["remedy"]


def test_one_process_in_a_collective_beside_others_is_not_called_alone(tmp_path):
    """Only a paste of that one process says one stack cannot tell: beside others on the CPU, it is not alone."""
    paste = tmp_path / "node.txt"
    busy = "".join(_pyspy(p, _BUSY).replace("(idle)", "(active)") for p in (12, 13))
    paste.write_text(_pyspy(11, _BCAST) + busy)
    report = _report(paste)
    assert report.verdict == "incomplete"
    assert not any(f.summary.startswith("one process's stack") for f in report.findings)
