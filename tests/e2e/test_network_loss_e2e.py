"""A real ``all-waiting`` hang: a healthy job loses its network (examples/network_loss/launch.py).

The launcher runs the healthy training loop under torchrun in a private network namespace and takes
its loopback down once every rank trains; then the real CLI inspects the live job from the host's
namespace. Needs root (``unshare --net``): skipped without it, failed in CI.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtpdiag.capture import procfs
from mtpdiag.fix.verify.launch import Job
from support.jobs_e2e import ROOT, by_rank, require_private_network, run_cli

sys.path.insert(0, os.path.join(ROOT, "examples", "network_loss"))
from launch import cut_network  # noqa: E402  (the reproducer's own)

LAUNCHER = os.path.join(ROOT, "examples", "network_loss", "launch.py")
STARTED = re.compile(r"^started: torchrun agent pid (\d+)", re.MULTILINE)
HUNG = "network cut; every rank hangs"


@dataclass(frozen=True)
class LostNetwork:
    """The hung job: its torchrun agent, its workers and the network namespace they all live in."""

    agent: int
    workers: frozenset[int]
    netns: str


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _pids_in(netns: str) -> set[int]:
    """Every process in the network namespace ``netns``: the job's agent and workers, nothing else."""
    return {int(name) for name in os.listdir("/proc") if name.isdigit() and _netns(int(name)) == netns}


def _wait_for_output(
    out: Path, launcher: subprocess.Popen, pattern: re.Pattern | str, seen: set[int], agent: int | None, timeout: float
) -> str:
    """The launcher's output once it matches ``pattern``; meanwhile remember every pid of the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent is not None:
            seen.update(procfs.descendants(agent))
        text = out.read_text(errors="replace")
        if pattern.search(text) if isinstance(pattern, re.Pattern) else pattern in text:
            return text
        if launcher.poll() is not None:
            raise AssertionError(f"launch.py exited ({launcher.returncode}): {text[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"launch.py printed no {pattern!r} within {timeout}s: {out.read_text()[-2000:]}")


def _diagnosis(agent: int) -> tuple:
    """What ``inspect --json`` says about each rank and which findings it gives: the thing that must settle."""
    result = run_cli("inspect", "--pid", str(agent), "--json")
    if result.returncode not in (0, 1):
        return ("error", result.returncode, result.stderr[-500:])
    report = json.loads(result.stdout)
    ranks = tuple((r["rank"], r["op"], json.dumps(r["site"], sort_keys=True)) for r in report["ranks"])
    return tuple(f["id"] for f in report["findings"]), ranks


def _wait_until_diagnosis_settles(agent: int, nproc: int, timeout: float = 120.0) -> None:
    """Until two inspections in a row agree and every rank is in a collective."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        now = _diagnosis(agent)
        in_collective = now[0] != "error" and len(now[1]) == nproc and all(op for _, op, _ in now[1])
        if in_collective and now == last:
            return
        last = now
        time.sleep(1.0)
    raise AssertionError(f"the diagnosis did not settle within {timeout}s; last: {last}")


def _end(launcher: subprocess.Popen, agent: int | None, netns: str | None, seen: set[int]) -> None:
    """SIGTERM the launcher (it kills its job); then SIGKILL whatever of the job is left, by pid."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait(timeout=10)
    if agent is not None:
        seen.update(procfs.descendants(agent))
    # Every process of the job is in its namespace: kill by pid only what is still there.
    leftovers = {p for p in seen if netns and _netns(p) == netns} | (_pids_in(netns) if netns else set())
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    # Killed workers stay zombies until their new parent reaps them: wait until they are gone from /proc.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in seen):
        time.sleep(0.1)


@pytest.fixture
def lost_network(tmp_path):
    require_private_network()
    out = tmp_path / "launch.out"
    with open(out, "w") as sink:
        launcher = subprocess.Popen(
            [sys.executable, LAUNCHER, "--log", str(tmp_path / "job.log")],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    seen: set[int] = set()
    agent = netns = None
    try:
        text = _wait_for_output(out, launcher, STARTED, seen, None, timeout=60)
        agent = int(STARTED.search(text)[1])
        seen.add(agent)
        netns = _netns(agent)
        assert netns and netns != _netns(os.getpid()), "the job does not run in a network namespace of its own"
        _wait_for_output(out, launcher, HUNG, seen, agent, timeout=180)
        _wait_until_diagnosis_settles(agent, nproc=4)
        workers = frozenset(p for p in procfs.descendants(agent) if "RANK" in (procfs.read_env(p) or {}))
        seen.update(workers)
        yield LostNetwork(agent=agent, workers=workers, netns=netns)
    finally:
        _end(launcher, agent, netns, seen)
        ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        alive = {int(line.split(None, 1)[0]) for line in ps.splitlines() if line.strip()}
        left = [line for line in ps.splitlines() if line.strip() and int(line.split(None, 1)[0]) in seen]
        assert not (seen & alive), f"processes of the job are still running: {left}"
        assert not (netns and _pids_in(netns)), "a process is still in the job's network namespace"


@pytest.mark.e2e
def test_a_job_that_loses_its_network_is_all_waiting(lost_network):
    result = run_cli("inspect", "--pid", str(lost_network.agent), "--json")
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    report = json.loads(result.stdout)
    assert report["verdict"] == "problem"
    assert [f["id"] for f in report["findings"]] == ["all-waiting"]
    assert report["mismatches"] == []
    ranks = by_rank(report)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r["pid"] for r in ranks.values()} == set(lost_network.workers)
    assert {r["state"] for r in ranks.values()} == {"collective"}
    assert {r["op"] for r in ranks.values()} == {"all_reduce"}
    sites = {(r["site"]["file"], r["site"]["line"], r["site"]["function"]) for r in ranks.values()}
    assert len(sites) == 1, sites
    ((file, line, function),) = sites
    assert (os.path.basename(file), function) == ("worker.py", "reduce_gradients")
    assert [s["ranks"] for s in report["sites"]] == [[0, 1, 2, 3]]
    finding = report["findings"][0]
    assert finding["ranks"] == [0, 1, 2, 3]
    assert "flight recorder" in finding["remedy"].lower() and "TORCH_FR_BUFFER_SIZE" in finding["remedy"]

    console = run_cli("inspect", "--pid", str(lost_network.agent))
    assert console.returncode == 1, (console.returncode, console.stderr[-2000:])
    headline = (
        f"every rank (4) waits in all_reduce at reduce_gradients (worker.py:{line}) and no group is "
        "split: the cause is below Python"
    )
    assert console.stdout.splitlines()[0] == f"PROBLEM: {headline}"
    assert f"[all-waiting] {headline}" in console.stdout
    assert "flight recorder" in " ".join(console.stdout.split()).lower()  # rich may wrap it over two lines


def test_cutting_the_network_refuses_a_process_in_our_own_namespace():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(RuntimeError, match="refusing"):
            cut_network(Job(proc=sleeper, nproc=0))
    finally:
        sleeper.kill()
        sleeper.wait()
