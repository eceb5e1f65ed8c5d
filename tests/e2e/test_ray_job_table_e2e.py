"""End to end on a real Ray cluster: a driver that no process relationship leads to, found in Ray's job table.

``ray start --head`` runs in one session (a terminal), and the verl-style driver (``examples/ray_verl/driver.py``)
joins the cluster from another session (a second terminal, a tmux pane, a Slurm step). The driver is neither an
ancestor nor a descendant of the raylet, shares no session with the actors, and was not submitted as a Ray job:
the layout is only where Ray records the driver, in its job table (its pid and node, and its entrypoint). The
actors' command lines carry no sizes, so without the job table ``inspect --ray`` knows no layout (#20). Through
Ray Client (``ray://``) mtpdiag's process has no GCS connection of its own: a task reads the table on the cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import unavailable
from mtpdiag.capture import procfs
from support.jobs_e2e import (
    RAY_TEST_ENV,
    RAY_VERL_CP2,
    ROOT,
    check_ray_verl_hang,
    end_sessions,
    free_ports,
    ray_client_server_log,
    run_cli,
    session_members,
    wait_for_listener,
    wait_until_quiet,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

DRIVER = os.path.join(ROOT, "examples", "ray_verl", "driver.py")
HANG = RAY_VERL_CP2  # two actors: the smallest world with the bug (cp 2)
WORLD = HANG.world
CANARY = "cnry-ray-jobtable-7c1d"  # on the driver's command line (so in its job table entrypoint) and in every actor
OVERRIDES = HANG.overrides()


@dataclass(frozen=True)
class DetachedDriverJob:
    head_session: int  # the session `ray start` ran in: the raylet's and the actors'
    driver: int  # the driver, leader of a session of its own
    raylet: int
    actors: dict[int, int]  # rank -> pid
    gcs: str
    client: str  # the head's Ray Client address (ray://)


def _tail(log: Path) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-8:])


def _ready_line(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("ready pids="):
                return line
        if proc.poll() is not None:
            raise AssertionError(f"the driver exited ({proc.returncode}) before it was ready: {_tail(log)}")
        time.sleep(0.25)
    raise AssertionError(f"the driver was not ready within {timeout}s: {_tail(log)}")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """``ray start --head`` in one session, then the driver joins it from a session of its own."""
    if importlib.util.find_spec("ray") is None:
        unavailable("ray not installed (requirements-ci.txt pins ray[default]; bash scripts/test.sh installs it)")
    tmp = tmp_path_factory.mktemp("ray-job-table")
    ray_tmp = tempfile.mkdtemp(prefix="mtpd-rayjt-", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, **RAY_TEST_ENV, "OMP_NUM_THREADS": "1"}
    py = sys.executable
    port, client = free_ports(2)
    head_log, driver_log = tmp / "head.log", tmp / "driver.log"
    with open(head_log, "w") as out:
        head = subprocess.Popen(
            [py, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
             f"--num-cpus={WORLD + 1}", "--disable-usage-stats", f"--temp-dir={ray_tmp}", "--include-dashboard=false",
             f"--ray-client-server-port={client}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
    sessions = {head.pid}
    seen: set[int] = set()
    driver = None
    try:
        assert head.wait(timeout=300) == 0, _tail(head_log)
        wait_for_listener(client, timeout=120, context=ray_client_server_log(ray_tmp))
        with open(driver_log, "w") as out:
            driver = subprocess.Popen(
                [py, DRIVER, *OVERRIDES, "--gate", "buggy", "--address", f"127.0.0.1:{port}",
                 "--worker-env", f"WANDB_API_KEY={CANARY}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                start_new_session=True,
            )  # fmt: skip
        sessions.add(driver.pid)
        ready = _ready_line(driver, driver_log, timeout=300)
        actors = {
            int(r): int(p) for r, p in (item.split(":") for item in ready.split()[1].removeprefix("pids=").split(","))
        }
        seen.update(actors.values())
        raylets = [p for p in session_members({head.pid}) if procfs.read_stat(p).comm == "raylet"]
        assert len(raylets) == 1, raylets
        seen.update(procfs.descendants(raylets[0]))
        wait_until_quiet(list(actors.values()))
        gcs = dict(item.split("=", 1) for item in ready.split() if "=" in item)["gcs"]
        yield DetachedDriverJob(head_session=head.pid, driver=driver.pid, raylet=raylets[0], actors=actors, gcs=gcs,
                                client=f"ray://127.0.0.1:{client}")  # fmt: skip
    finally:
        if driver is not None:
            driver.send_signal(signal.SIGTERM)  # the driver's connection and its actors end
            try:
                driver.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        left = end_sessions(sessions, seen)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not left, f"processes of the Ray job survived: {left}"


def test_inspect_ray_reads_the_layout_of_a_driver_in_another_session(job):
    """The premise first (no process relationship leads to the driver), then the diagnosis through the cluster."""
    driver_stat = procfs.read_stat(job.driver)
    assert driver_stat.session == job.driver != job.head_session
    assert job.raylet not in procfs.ancestors(job.driver) and job.driver not in procfs.ancestors(job.raylet)
    assert job.driver not in session_members({job.head_session})
    assert all(o in procfs.read_cmdline(job.driver) for o in OVERRIDES[:2])
    for pid in job.actors.values():
        assert procfs.read_stat(pid).session == job.head_session
        assert not any("parallel" in a for a in procfs.read_cmdline(pid) or [])

    _check_inspect_ray(job, job.gcs)


def test_inspect_through_ray_client_reads_the_job_table_on_the_cluster(job):
    _check_inspect_ray(job, job.client)


def _check_inspect_ray(job: DetachedDriverJob, address: str) -> None:
    done = run_cli("inspect", "--ray", address, "--json", "--ray-timeout", "240", timeout=600)
    assert "job table could not be read" not in done.stderr, done.stderr[-2000:]
    assert CANARY not in done.stdout and CANARY not in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 1, (address, done.returncode, done.stdout[-1500:], done.stderr[-3000:])
    report = json.loads(done.stdout)
    assert sorted((v["rank"], v["pid"]) for v in report["ranks"]) == sorted(job.actors.items())
    check_ray_verl_hang(report, HANG)
