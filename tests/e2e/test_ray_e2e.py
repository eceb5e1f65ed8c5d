"""End to end on a real Ray cluster: verl-style Megatron workers hang as Ray actors; the real CLI finds them.

The driver (``examples/ray_verl/driver.py``, standing in for ``python -m verl.trainer.main_ppo``, with its
Hydra overrides) has a TaskRunner actor create two ``WorkerDict`` actors with verl's ``runtime_env`` env_vars
(RANK, WORLD_SIZE, WG_PREFIX, ...) and a secret; they run real megatron-core MTP loss code on gloo and hang
(verl #5895 at cp=2, its smallest world; ``test_ray_cluster_e2e`` runs cp=2 pp=2 on four). Four deployments, one
job each:

* ``ray start``: verl's cluster guide on one node: ``ray start --head``, then the driver joins the cluster
  from the same shell (same session). The raylet is no descendant of the driver and the actors' command
  lines carry no sizes, so the layout can only come from the driver among the session's Python processes.
* ``ray.init``: the driver starts a local cluster of its own; the raylet is its child.
* ``cluster_utils``: the driver starts the cluster with Ray's ``cluster_utils.Cluster`` (on the loopback, its
  temp dir as ``RAY_TMPDIR``); the raylet is its child too.
* ``ray job submit``: verl's documented launch on a cluster: ``ray start --head``, then the driver is
  submitted as a Ray job. Ray runs it below the raylet's ``ray::JobSupervisor``, in a session of its own,
  so the layout can only come from the drivers of the jobs submitted to the workers' raylet.

In every deployment ``inspect --ray`` names the hang through the cluster at the address the driver prints. Where
the driver started the cluster, the driver is an ancestor of the capture task's worker and must still be read
for the layout (#20); the head listens on the loopback only, which Ray's own address handling would replace
with the host's address.
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
    RAY_AGENT_NOT_READY,
    RAY_TEST_ENV,
    RAY_VERL_CP2,
    ROOT,
    check_ray_verl_hang,
    end_sessions,
    free_port,
    run_cli,
    session_members,
    wait_until_quiet,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

DRIVER = os.path.join(ROOT, "examples", "ray_verl", "driver.py")
HANG = RAY_VERL_CP2
WORLD = HANG.world
# A Kubeflow PyTorchJob gives each pod (node) a RANK and WORLD_SIZE: in the "ray start" job, the shell, the
# driver and every Ray process inherit them; only the actors get their own from verl's runtime_env.
NODE_ENV = {"RANK": "0", "WORLD_SIZE": "1"}
# The deployments whose driver starts the cluster itself, so that the raylet is its child (#20).
OWN_CLUSTER = ("ray.init", "cluster_utils")
SUBMISSION = "mtpdiag-e2e-verl"  # the `ray job submit --submission-id` of the third deployment
CANARY = "cnry-ray-6b0e-wandb"  # in every actor's environment and on the driver's command line
OVERRIDES = HANG.overrides()


@dataclass(frozen=True)
class RayJob:
    mode: str  # "ray start", "ray job submit" (the driver joins a running cluster), or one of OWN_CLUSTER
    session: int  # the session id of the shell that ran `ray start` and the driver
    driver: int
    raylet: int
    actors: dict[int, int]  # rank -> pid
    log: Path
    gcs: str  # the cluster's address, as the driver's Ray connection gives it


def _require_ray(mode: str) -> None:
    # `ray job submit` needs Ray's job server, which ray[default] brings (aiohttp among others).
    needed = ("ray", "aiohttp") if mode == "ray job submit" else ("ray",)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        unavailable(
            f"{', '.join(missing)} not installed (requirements-ci.txt pins ray[default]; bash scripts/test.sh "
            "installs it)"
        )


def _session_members(session: int) -> list[int]:
    return session_members({session})


def _wait_for_line(proc: subprocess.Popen, log: Path, prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line
        if proc.poll() is not None:
            raise AssertionError(f"the Ray job exited ({proc.returncode}) before {prefix!r}: {_tail(log)}")
        time.sleep(0.25)
    raise AssertionError(f"no {prefix!r} within {timeout}s: {_tail(log)}")


def _tail(log: Path) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-8:])


def _launch(mode: str, ray_tmp: str, log: Path) -> subprocess.Popen:
    """The job in a session of its own, as a user starts it from a terminal."""
    py = sys.executable
    driver = [py, DRIVER, *OVERRIDES, "--gate", "buggy", "--worker-env", f"WANDB_API_KEY={CANARY}"]
    ray = f'"{py}" -m ray.scripts.scripts'
    port = free_port()
    start = (
        f"{ray} start --head --port={port} --node-ip-address=127.0.0.1 --num-cpus={WORLD + 1} "
        f"--disable-usage-stats --temp-dir={ray_tmp}"
    )
    if mode == "ray start":  # the cluster first, then the driver joins it from the same shell
        script = f'set -e\n{start} --include-dashboard=false\nexec "$@" --address 127.0.0.1:{port}\n'
        cmd = ["bash", "-c", script, "bash", *driver]
    elif mode == "ray job submit":  # the driver runs as a Ray job; its output is followed into the log
        jobs = f"http://127.0.0.1:{free_port()}"
        script = (
            f"set -e\n{start} --include-dashboard=true --dashboard-port={jobs.rsplit(':', 1)[1]}\n"
            # tried again while the head's job agent is still starting, as Ray's answer asks
            f"for try in $(seq 60); do\n"
            f'  if out=$({ray} job submit --address {jobs} --submission-id {SUBMISSION} --no-wait -- "$@" 2>&1)'
            f'; then echo "$out"; break; fi\n'
            f'  case "$out" in *"{RAY_AGENT_NOT_READY}"*) sleep 2 ;; *) echo "$out"; exit 1 ;; esac\n'
            f"done\n"
            f"exec {ray} job logs --address {jobs} --follow {SUBMISSION}\n"
        )
        cmd = ["bash", "-c", script, "bash", *driver]
    elif mode == "cluster_utils":  # Ray's test harness in the driver: the head node is its child too
        cmd = [*driver, "--temp-dir", ray_tmp, "--cluster-utils"]
    else:  # the driver's ray.init starts a local cluster of its own
        cmd = [*driver, "--temp-dir", ray_tmp]
    env = {**os.environ, **RAY_TEST_ENV, "OMP_NUM_THREADS": "1"}
    env.update(NODE_ENV if mode not in OWN_CLUSTER else {})
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )


@pytest.fixture(scope="module", params=["ray start", "ray.init", "cluster_utils", "ray job submit"])
def job(request, tmp_path_factory):
    """The hung job: ``ray start`` + a driver that joins (verl's cluster guide), a driver's own ray.init or
    cluster_utils.Cluster, or ``ray start`` + ``ray job submit`` (verl's documented launch)."""
    mode = request.param
    _require_ray(mode)
    tmp = tmp_path_factory.mktemp("ray")
    log = tmp / "job.log"
    # Ray's unix socket paths live under its temp dir and must stay under 108 bytes: pytest's is too long.
    ray_tmp = tempfile.mkdtemp(prefix="mtpd-ray-", dir="/tmp")
    proc = _launch(mode, ray_tmp, log)
    session = proc.pid  # start_new_session: the launcher leads a new session, which Ray's processes keep
    seen: set[int] = set()
    try:
        ready = _wait_for_line(proc, log, "ready pids=", timeout=300)
        actors = {
            int(r): int(p) for r, p in (item.split(":") for item in ready.split()[1].removeprefix("pids=").split(","))
        }
        seen.update(actors.values())
        raylets = [p for p in _session_members(session) if procfs.read_stat(p).comm == "raylet"]
        assert len(raylets) == 1, raylets
        seen.update(procfs.descendants(raylets[0]))
        driver = proc.pid
        if mode == "ray job submit":  # the driver Ray's job supervisor started, below the raylet
            (driver,) = [
                p
                for p in procfs.descendants(raylets[0])
                if procfs.is_python(p) and DRIVER in (procfs.read_cmdline(p) or [])
            ]
        wait_until_quiet(list(actors.values()))
        gcs = dict(item.split("=", 1) for item in ready.split() if "=" in item)["gcs"]
        yield RayJob(mode=mode, session=session, driver=driver, raylet=raylets[0], actors=actors, log=log, gcs=gcs)
    finally:
        proc.send_signal(signal.SIGTERM)  # the driver shuts Ray down (ray start: only its connection)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        left = end_sessions({session}, seen)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not left, f"processes of the Ray job survived: {left}"


def _raw(pid: int, what: str) -> bytes:
    with open(f"/proc/{pid}/{what}", "rb") as f:
        return f.read()


def _python_descendants(pid: int) -> set[int]:
    return {p for p in procfs.descendants(pid) if procfs.is_python(p)}


def test_the_actors_are_deployed_as_verl_deploys_them(job):
    """What the other tests rely on, checked on the live processes, so they cannot pass vacuously."""
    assert sorted(job.actors) == list(range(WORLD))
    driver_argv = procfs.read_cmdline(job.driver)
    assert all(o in driver_argv for o in OVERRIDES[:2])
    assert any(CANARY in a for a in driver_argv)
    if job.mode == "ray start":  # the layout can only come from the session's driver
        assert job.raylet not in procfs.ancestors(job.driver) and job.driver not in procfs.ancestors(job.raylet)
    elif job.mode == "ray job submit":  # ... or from the drivers of the jobs submitted to the raylet
        assert procfs.read_stat(job.driver).session != job.session
        assert any(procfs.is_ray_job_supervisor(p) for p in procfs.ancestors(job.driver))
        assert job.raylet in procfs.ancestors(job.driver)
    else:
        assert procfs.read_stat(job.raylet).ppid == job.driver
    for rank, pid in job.actors.items():
        stat = procfs.read_stat(pid)
        argv = procfs.read_cmdline(pid)
        assert stat.comm == "ray::WorkerDict" and argv[0] == "ray::WorkerDict.update_actor", (stat.comm, argv)
        assert stat.ppid == job.raylet and stat.session == job.session
        assert (job.driver in procfs.ancestors(pid)) == (job.mode in OWN_CLUSTER)
        assert not any("parallel" in a or a in ("--cp", "--pp") for a in argv), argv
        environ = dict(e.partition(b"=")[::2] for e in _raw(pid, "environ").split(b"\0") if e)
        assert environ[b"RANK"] == str(rank).encode() and environ[b"WORLD_SIZE"] == str(WORLD).encode()
        assert environ[b"WG_BACKEND"] == b"ray" and environ[b"WG_PREFIX"] and environ[b"MASTER_PORT"]
        assert environ[b"WANDB_API_KEY"] == CANARY.encode()
    # Beside the actors, the raylet runs Python processes that are no workers (TaskRunner, Ray's agents);
    # in the "ray start" job they and the driver carry the node's RANK, which a worker must not be taken for.
    others = _python_descendants(job.raylet) - set(job.actors.values())
    assert len(others) >= 2, others
    node_env = NODE_ENV if job.mode not in OWN_CLUSTER else {}
    for pid in [*others, job.driver]:
        assert {k: v for k, v in (procfs.read_env(pid) or {}).items() if k in ("RANK", "WORLD_SIZE")} == node_env


def _check_diagnosis(report: dict, job: RayJob) -> None:
    assert sorted((v["rank"], v["pid"]) for v in report["ranks"]) == sorted(job.actors.items())
    check_ray_verl_hang(report, HANG)


def _foreign_ranked(job: RayJob) -> list[int]:
    """Ranked Python processes of other jobs on this host (a shared machine may run some)."""
    ours = set(_session_members(job.session)) | set(procfs.descendants(job.raylet))  # a submitted driver too
    return [
        p
        for p in procfs.all_pids()
        if p not in ours
        and p != os.getpid()
        and {"RANK", "WORLD_SIZE"} <= set(procfs.read_env(p) or {})
        and procfs.is_python(p)
    ]


def _no_canary(done: subprocess.CompletedProcess, name: str) -> None:
    assert CANARY not in done.stdout and CANARY not in done.stderr, name
    assert "Traceback" not in done.stderr, (name, done.stderr[-2000:])


def _cli_json(name: str, *args: str) -> dict:
    done = run_cli(*args, "--json", timeout=300)
    _no_canary(done, name)
    assert done.returncode == 1, (name, done.returncode, done.stderr[-2000:])
    return json.loads(done.stdout)


def test_inspect_all_finds_exactly_the_actors_and_reads_the_layout_from_the_driver(job):
    deadline = time.monotonic() + 120
    while (foreign := _foreign_ranked(job)) and time.monotonic() < deadline:
        time.sleep(1)  # another job's ranks would join the report; wait for them to finish
    assert not foreign, f"other ranked processes run on this host: {foreign}"
    report = _cli_json("inspect --all", "inspect", "--all")
    _check_diagnosis(report, job)


def test_inspect_raylet_pid_expands_to_the_actors(job):
    report = _cli_json("inspect --pid raylet", "inspect", "--pid", str(job.raylet))
    _check_diagnosis(report, job)
    if job.mode in OWN_CLUSTER:  # the driver is the raylet's parent: its pid expands the same way
        _check_diagnosis(_cli_json("inspect --pid driver", "inspect", "--pid", str(job.driver)), job)


def test_collect_from_the_raylet_then_analyze(job, tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()  # a directory: one bundle file per host goes in it
    done = run_cli("collect", "--pid", str(job.raylet), "--out", str(out), timeout=300)
    _no_canary(done, "collect")
    assert done.returncode == 0, done.stderr[-2000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert CANARY.encode() not in path.read_bytes(), path
    _check_diagnosis(_cli_json("analyze", "analyze", str(out)), job)
    console = run_cli("analyze", str(out))
    _no_canary(console, "analyze (console)")
    assert console.returncode == 1 and "verl #5895" in console.stdout, console.stdout[-2000:]


def test_inspect_ray_names_the_hang_with_the_layout_from_the_driver(job):
    """Through the cluster, at the address the driver prints: where the driver started the cluster it is an
    ancestor of the capture task's worker, and its sizes are still the layout (#20)."""
    done = run_cli("inspect", "--ray", job.gcs, "--json", "--ray-timeout", "240", timeout=600)
    _no_canary(done, "inspect --ray")
    assert done.returncode == 1, (job.gcs, done.returncode, done.stderr[-3000:])
    _check_diagnosis(json.loads(done.stdout), job)
