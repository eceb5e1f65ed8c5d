"""End to end on a one-node Ray cluster: ``watch --ray`` sees a healthy NCCL-style job move through the Flight
Recorder, node by node; ``--ray ray://`` (Ray Client) captures it with no port opened here.

A one-node Ray cluster (``ray start --head``, with its job server) runs a torchrun job of
``examples/nccl_behaviour`` submitted with ``ray job submit``, so that its ranks are below the raylet (raylet,
job supervisor, torchrun agent, workers) as a Ray job's are. Every step each host waits about 3 s at one sync
line while the collectives complete on the (emulated) device: the stacks seen from one sample to the next are
the same, and the host's CPU is idle (it waits in a futex: for a false call the stricter case, and it leaves the
machine's cores to the tests beside it; a spinning host burns CPU whether it moves or not). Only the Flight
Recorder shows the progress:
the capture task on the node asks each rank for a dump through its debug-info pipe and reads it, with the
state between samples kept by the driver. The same job (two ranks, cp 2) is the local ``watch`` test of
``test_gpu_hang_e2e.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import unavailable
from support.jobs_e2e import (
    RAY_TEST_ENV,
    ROOT,
    end_sessions,
    free_ports,
    ray_client_server_log,
    run_cli,
    run_watching_ports,
    submit_ray_job,
    wait_for_listener,
)
from support.late_relay import LateRelay

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKER = os.path.join(ROOT, "examples", "nccl_behaviour", "worker.py")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
SUBMISSION = "mtpdiag-e2e-healthy-nccl"


def _job_log(ray_tmp: str) -> Path:
    return Path(ray_tmp) / "session_latest" / "logs" / f"job-driver-{SUBMISSION}.log"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(the GCS address, the Ray Client server's, the job's log): the healthy job below the head's raylet."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("aiohttp") is None:
        unavailable("ray[default] not installed (requirements-ci.txt pins it; bash scripts/test.sh installs it)")
    tmp = tmp_path_factory.mktemp("ray-watch")
    ray_tmp = tempfile.mkdtemp(prefix="mtpd-rw-", dir="/tmp")  # Ray's socket paths must stay short
    port, dashboard, client = free_ports(3)
    env = {
        **os.environ,
        **RAY_TEST_ENV,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    }
    with open(tmp / "head.log", "w") as out:
        head = subprocess.Popen(
            [
                *RAY,
                "start",
                "--head",
                f"--port={port}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--ray-client-server-port={client}",
                "--disable-usage-stats",
                f"--temp-dir={ray_tmp}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    sessions = {head.pid}
    try:
        assert head.wait(timeout=180) == 0, (tmp / "head.log").read_text(errors="replace")[-2000:]
        wait_for_listener(client, timeout=120, context=ray_client_server_log(ray_tmp))
        dumps, pipes = tmp / "fr", tmp / "pipes"
        dumps.mkdir()
        pipes.mkdir()
        runtime_env = {
            "env_vars": {
                "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_"),
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(pipes / "rank_"),
            }
        }
        submit = submit_ray_job(
            [
                *RAY,
                "job",
                "submit",
                "--address",
                f"http://127.0.0.1:{dashboard}",
                "--submission-id",
                SUBMISSION,
                "--no-wait",
                "--runtime-env-json",
                json.dumps(runtime_env),
                "--",
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                WORKER,
                "--healthy",
                "--cp",
                "2",
                "--pp",
                "1",
                "--device-step-s",
                "3",
                "--sync",
                "futex",
            ],
            env=env,
            cwd=ROOT,
            timeout=180,
        )
        assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
        log = _job_log(ray_tmp)
        deadline = time.monotonic() + 300
        while not (log.exists() and "rank 0 step 1 " in log.read_text(errors="replace")):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:] if log.exists() else "no log"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", f"ray://127.0.0.1:{client}", log
    finally:
        left = end_sessions(sessions)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not left, f"processes of the Ray cluster survived: {left}"


def test_watch_ray_makes_no_false_call_on_a_healthy_job_with_3s_device_steps(cluster, tmp_path):
    """Without the Flight Recorder's signal this watch calls a hang after about 5 s (checked: exit 1)."""
    address, _, log = cluster
    done = run_cli(
        "watch",
        "--ray",
        address,
        "--duration",
        "30",  # ten device steps, six of watch's 5 s stall windows (as the healthy watch of test_gpu_hang_e2e)
        "--ray-timeout",
        "240",
        "--out",
        str(tmp_path),
        "--json",
        timeout=600,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["progress"]["hang"] is False and report["verdict"] == "ok", report["progress"]
    assert report["progress"]["samples"] >= 3, report["progress"]
    assert "Traceback" not in log.read_text(errors="replace")  # the job ran on, untouched by the requests


def test_inspect_through_ray_client_captures_the_ranks_below_the_raylet_and_opens_no_port(cluster):
    """``ray://``: the driver runs in the head's client server; this process is a gRPC client only."""
    _, client, _ = cluster
    done, ports = run_watching_ports(
        [sys.executable, "-m", "mtpdiag", "inspect", "--ray", client, "--json"],
        env=dict(os.environ),
        cwd=ROOT,
        timeout=400,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert sorted(v["rank"] for v in report["ranks"]) == [0, 1], done.stderr[-2000:]
    assert all(v["stack"] is not None for v in report["ranks"])
    assert ports == set(), ports


def test_a_ray_client_server_that_answers_after_rays_30_s_is_tried_again(cluster):
    """A loaded head's client server accepted the connection and had not answered Ray's ping in Ray's 30 s
    (CI-23): ``ray.init`` gave up with "ray client connection timeout". mtpdiag tries again and captures."""
    _, client, _ = cluster
    host, _, port = client.removeprefix("ray://").rpartition(":")
    with LateRelay((host, int(port)), silent_s=36) as relay:  # past Ray's 30 s (5 + 10 + 15) and the retry
        done = run_cli("inspect", "--ray", f"ray://127.0.0.1:{relay.port}", "--json", timeout=400)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert relay.held >= 1, done.stderr[-2000:]
    assert "connection timeout): trying again (2 of 3)" in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert sorted(v["rank"] for v in report["ranks"]) == [0, 1], done.stderr[-2000:]
