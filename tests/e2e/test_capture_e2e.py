"""Live capture of a real hung torchrun job (gloo, megatron-core, 4 ranks, cp=2 pp=2) with real py-spy.

The job is the session's canonical hang (``support/canonical_hang.py``): the MTP-CP reproducer run through a
tiny launcher that drops a canary ``--secret-flag=...`` before the worker parses its arguments, with canary
secrets (``WANDB_API_KEY``, ...) in its environment: none may reach a bundle or the tool's output. The agent
also carries a node-level ``RANK``/``WORLD_SIZE`` as a Kubeflow PyTorchJob sets them: it is still a
launcher, not a worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpdiag.capture import capture, find_targets, procfs, pyspy
from mtpdiag.inputs import load_paths, parse_text_dump
from mtpdiag.inputs.bundle import bundle_text, load_bundle
from support.canonical_hang import CANARIES, SECRET_FLAG, WAITS

REPO = Path(__file__).resolve().parents[2]
EXPECTED = WAITS  # rank -> (innermost function, first user frame below torch.distributed)


@pytest.fixture
def job(canonical_hang):
    return canonical_hang.job, canonical_hang.workers


def _leaks(text: str) -> list[str]:
    return [c for c in CANARIES if c in text]


def _user_frame(frames):
    return next(f for f in frames if "torch/distributed/" not in f.file)


def test_agent_pid_expands_to_four_ranked_workers(job):
    agent, workers = job
    assert find_targets([agent.pid], scan_all=False) == sorted(workers)
    assert find_targets([workers[2]], scan_all=False) == [workers[2]]
    everywhere = set(find_targets([], scan_all=True))
    assert set(workers) <= everywhere  # other jobs on the host may add more
    assert agent.pid not in everywhere


def test_capture_of_the_hang(job):
    agent, workers = job
    snapshot = capture([agent.pid], timeout=30.0)
    assert [c.rank for c in snapshot.captures] == [0, 1, 2, 3]
    assert sorted(c.pid for c in snapshot.captures) == sorted(workers)
    assert snapshot.host and snapshot.created.endswith("+00:00") and snapshot.tool_version
    for c in snapshot.captures:
        assert c.world_size == 4 and c.env.as_dict()["RANK"] == str(c.rank)
        assert dict(c.layout_hints) == {"cp": 2, "pp": 2}
        assert c.state in ("S", "R") and not c.nonblocking and c.error is None
        assert c.main_cpu_ticks is not None
        frames = c.main_thread.frames
        op, site = EXPECTED[c.rank]
        assert frames[0].function == op and frames[0].file == "torch/distributed/distributed_c10d.py"
        assert _user_frame(frames).function == site
    send = snapshot.captures[0].main_thread.frames[0]
    assert send.arg("dst") == 2  # rank 0 (pp stage 0) sends to rank 2 (pp stage 1)
    mtp = _user_frame(snapshot.captures[2].main_thread.frames)
    assert mtp.file == "megatron/core/transformer/multi_token_prediction.py"


def test_collect_cli_writes_a_bundle_that_round_trips(job, tmp_path):
    agent, _ = job
    out = tmp_path / "bundle.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtpdiag",
            "collect",
            "--pid",
            str(agent.pid),
            "--out",
            str(out),
            "--host",
            "node-07",
            "--timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    # the canonical hang has dumped its Flight Recorder (support/canonical_hang.py): collect takes the dumps too
    assert done.stderr.strip() == f"wrote {out} (4 ranks, 0 unreadable, Flight Recorder dumps of 4 ranks)"
    raw = out.read_text()
    snapshot = load_bundle(str(out))
    assert json.loads(bundle_text(snapshot)) == json.loads(raw)
    assert snapshot.host == "node-07" and {c.host for c in snapshot.captures} == {"node-07"}
    assert [c.rank for c in snapshot.captures] == [0, 1, 2, 3]
    assert [c.main_thread.frames[0].function for c in snapshot.captures] == [EXPECTED[r][0] for r in range(4)]
    assert [c.source for c in load_paths([str(out)]).captures] == [str(out)] * 4
    for text in (raw, done.stdout, done.stderr):
        assert not _leaks(text) and "secret-flag" not in text


def test_no_secret_in_a_capture(job):
    agent, _ = job
    stored = bundle_text(capture([agent.pid], timeout=30.0))
    assert not _leaks(stored) and "WANDB" not in stored
    assert "--gate" not in stored  # no command line at all


def test_text_dump_with_locals_parses_like_json(job):
    """Plain ``py-spy dump --locals`` text of a live rank: same frames, same kept peer argument."""
    _, workers = job
    rank0 = workers[0]
    text = subprocess.run(
        [pyspy.find_pyspy(), "dump", "--locals", "--pid", str(rank0)], capture_output=True, text=True, timeout=60
    ).stdout
    (process,) = parse_text_dump(text)
    from_json = pyspy.dump(rank0, timeout=30.0)
    assert process.pid == rank0 and process.hints == {"cp": 2, "pp": 2}
    # the main thread by name: beside it runs the Flight Recorder's dump thread (examples/flight_recorder)
    (main,) = [t for t in process.threads if t.name == "MainThread"]
    (main_json,) = [t for t in from_json if t.name == "MainThread"]
    assert [(f.function, f.line, f.args) for f in main.frames] == [
        (f.function, f.line, f.args) for f in main_json.frames
    ]
    assert main.frames[0].arg("dst") == 2


def test_stopped_rank_is_captured_nonblocking(job):
    """Stops rank 3 of the shared job for the capture, and gives it back as it was: asleep in its all_gather."""
    _, workers = job
    frozen = workers[3]
    os.kill(frozen, signal.SIGSTOP)
    try:
        assert _state_becomes(frozen, "T"), procfs.read_stat(frozen)
        snapshot = capture([frozen], timeout=30.0)
    finally:
        os.kill(frozen, signal.SIGCONT)
        assert _state_becomes(frozen, "S"), procfs.read_stat(frozen)
    (c,) = snapshot.captures
    assert c.rank == 3 and c.state == "T" and c.nonblocking
    assert c.main_thread.frames and c.main_thread.frames[0].function == "all_gather"


def test_pasted_subprocess_dump_of_the_agent_loads_the_workers_only(job, tmp_path):
    """``py-spy dump --subprocesses --pid <agent>`` text, as pasted into a ticket: the agent is no rank."""
    agent, workers = job
    text = subprocess.run(
        [pyspy.find_pyspy(), "dump", "--subprocesses", "--pid", str(agent.pid)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert f"Process {agent.pid}:" in text  # the agent's own section is there ...
    pasted = tmp_path / "ticket.txt"
    pasted.write_text(text)
    snapshot = load_paths([str(pasted)])
    assert sorted(c.pid for c in snapshot.captures) == sorted(workers)  # ... but it is not a rank
    innermost = sorted(c.main_thread.frames[0].function for c in snapshot.captures)
    assert innermost == sorted(op for op, _ in EXPECTED.values())
    assert all(dict(c.layout_hints) == {"cp": 2, "pp": 2} for c in snapshot.captures)
    assert SECRET_FLAG not in bundle_text(snapshot)


def _state_becomes(pid: int, state: str, within_s: float = 60.0) -> bool:
    """Whether the process's state settles at ``state`` (twice in a row, 0.1 s apart) within ``within_s``."""
    deadline, seen = time.monotonic() + within_s, 0
    while time.monotonic() < deadline:
        stat = procfs.read_stat(pid)
        seen = seen + 1 if stat is not None and stat.state == state else 0
        if seen >= 2:
            return True
        time.sleep(0.1)
    return False
