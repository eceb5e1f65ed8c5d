"""End to end on a real one-node Ray cluster: ``mtpdiag run`` gives a Ray job's actors the Flight Recorder's
variables, watches the job through ``--ray``'s capture, and calls its hang.

The cluster is started as verl's cluster guide starts it (``ray start --head``); the drivers join it from this
test's own session, so the actors (children of the raylet) get nothing of a driver's environment: the probe
(``tests/support/ray_env_probe.py``) shows it, and shows that what ``run`` applies (the job's runtime_env in
``RAY_JOB_CONFIG_JSON_ENV_VAR``) reaches a nested actor that has env_vars of its own, as verl's WorkerDict has.
Then ``examples/ray_verl/driver.py`` (verl's deployment, with the buggy MTP gate at cp 2, on two actors) is launched as
``mtpdiag run --on-hang exit --ray ADDRESS -- python driver.py ...``. Its actors write Flight Recorder dumps
into the run directory only if they were given ``TORCH_FR_DUMP_TEMP_FILE`` and ``TORCH_FR_BUFFER_SIZE``.

Run it alone, under ``flock /tmp/mtpdiag-ray.lock``: Ray tests need a host without other Ray clusters.
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
from pathlib import Path

import pytest

from conftest import unavailable
from mtpdiag.capture import procfs
from support.jobs_e2e import RAY_TEST_ENV, RAY_VERL_CP2, ROOT, end_sessions, free_ports, submit_ray_job

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

DRIVER = os.path.join(ROOT, "examples", "ray_verl", "driver.py")
PROBE = os.path.join(ROOT, "tests", "support", "ray_env_probe.py")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
HANG = RAY_VERL_CP2  # two actors: the smallest world with the bug (cp 2)
OVERRIDES = HANG.overrides()
FR_KEYS = ["TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(the GCS address, the job server's or None when it could not start) of a one-node cluster with room for
    the driver's TaskRunner and its actors."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("aiohttp") is None:
        unavailable("ray[default] not installed (requirements-ci.txt pins it; bash scripts/test.sh installs it)")
    tmp = tmp_path_factory.mktemp("run-ray")
    ray_tmp = tempfile.mkdtemp(prefix="mtpd-rr-", dir="/tmp")  # Ray's socket paths must stay short
    sessions: set[int] = set()
    try:
        # `ray start` gives the dashboard (the job server) a fixed 20 s to come up, which a loaded 2-core host was
        # seen to miss by milliseconds ("Failed to start the dashboard"): the start is tried again, and at last
        # without the job server, so that only the test that needs it fails, with why.
        jobs, why = None, ""
        for attempt in range(4):
            port, dashboard = free_ports(2)
            head = _start_head(port, dashboard, ray_tmp, tmp / f"head-{attempt}.log", job_server=attempt < 3)
            sessions.add(head.pid)
            if head.wait(timeout=600) == 0:
                jobs = f"http://127.0.0.1:{dashboard}" if attempt < 3 else None
                break
            why = (tmp / f"head-{attempt}.log").read_text(errors="replace")
            assert not end_sessions({head.pid})
        else:
            raise AssertionError(why[-3000:])
        yield f"127.0.0.1:{port}", jobs
    finally:
        left = end_sessions(sessions)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not left, f"processes of the Ray cluster survived: {left}"


def _start_head(port: int, dashboard: int, ray_tmp: str, log: Path, job_server: bool) -> subprocess.Popen:
    env = {**os.environ, **RAY_TEST_ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath()}
    server = ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}"]
    with open(log, "w") as out:
        return subprocess.Popen(
            [
                *RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=5",
                *(server if job_server else ["--include-dashboard=false"]),
                "--disable-usage-stats", f"--temp-dir={ray_tmp}",
            ],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip


def _pythonpath() -> str:
    # mtpdiag for the capture tasks on the node, as `pip install mtpdiag` would give it
    return os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


def _job_env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "RAY_JOB_CONFIG"))}
    return {**env, **RAY_TEST_ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath(), **more}


def _probe(done: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("PROBE "))


def test_a_joining_drivers_environment_reaches_no_actor_and_runs_runtime_env_does(cluster, tmp_path):
    cluster, _ = cluster
    keys = [*FR_KEYS, "DRIVER_RT", "OWN"]
    # Without run: the variables in the driver's environment stay there.
    alone = subprocess.run(
        [sys.executable, PROBE, cluster, *keys],
        env=_job_env(TORCH_FR_BUFFER_SIZE="2000", TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "x")),
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert _probe(alone) == {**dict.fromkeys(FR_KEYS), "DRIVER_RT": "driver", "OWN": "own"}
    # With run: the nested actor has them, beside the driver's own runtime_env and its own env_vars; a key the
    # driver's code sets itself (TORCH_FR_BUFFER_SIZE here) keeps the driver's value, and ray.init does not fail.
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "mtpdiag", "run", "--out", str(out), "--ray", cluster, "--ray-timeout", "240", "--",
            sys.executable, PROBE, cluster, *keys,
        ],
        env=_job_env(PROBE_DRIVER_SETS="TORCH_FR_BUFFER_SIZE=77"),
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert _probe(done) == {
        "TORCH_FR_BUFFER_SIZE": "77",
        "TORCH_FR_DUMP_TEMP_FILE": str(out / "fr" / "rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(out / "fr-pipe" / "rank_"),
        "DRIVER_RT": "driver",
        "OWN": "own",
    }
    assert "its actors get TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE" in done.stderr, done.stderr[-2000:]
    assert json.loads((out / "run.json").read_text())["ray"]["route"] == "RAY_JOB_CONFIG_JSON_ENV_VAR"
    assert "Traceback" not in done.stderr


def test_run_calls_the_hang_of_a_ray_job_from_its_actors_flight_recorder_and_exits_1(cluster, tmp_path):
    cluster, _ = cluster
    out = tmp_path / "run"
    stdout, stderr = tmp_path / "run.out", tmp_path / "run.err"
    driver_pid = None
    try:
        with open(stdout, "w") as o, open(stderr, "w") as e:
            done = subprocess.run(
                [
                    sys.executable, "-m", "mtpdiag", "run", "--on-hang", "exit", "--out", str(out),
                    "--ray", cluster, "--ray-timeout", "240", "--",
                    sys.executable, DRIVER, *OVERRIDES, "--gate", "buggy", "--address", cluster,
                ],
                env=_job_env(), stdout=o, stderr=e, timeout=1500, cwd=ROOT,
            )  # fmt: skip
        driver_pid = json.loads((out / "run.json").read_text())["pid"]
        said = stderr.read_text(errors="replace")
        assert done.returncode == 1, said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        assert "ready pids=" in stdout.read_text()  # the driver's output passed through
        report = json.loads((out / "report.json").read_text())
        finding = report["findings"][0]
        assert (finding["id"], finding["ranks"]) == ("mtp-cp-gated-reduce", [HANG.entered, HANG.absent])
        layout = report["layout"]
        assert (layout["tp"], layout["cp"], layout["dp"], layout["pp"]) == HANG.layout, report["layout_source"]
        # The actors were given the variables: each wrote its dump where run pointed TORCH_FR_DUMP_TEMP_FILE.
        assert sorted(p.name for p in (out / "fr").iterdir()) == [f"rank_{r}" for r in range(HANG.world)]
        (root,) = [m for m in report["mismatches"] if m["role"] == "root"]
        assert (root["group"], root["entered"], root["absent"]) == ("dp_cp", [HANG.entered], [HANG.absent]), root
        print(f"\nthe root mismatch's source: {root['source']}")
        timing = json.loads((out / "hang.json").read_text())
        print(f"run called the Ray job's hang {timing['stalled_for_s']} s after the last progress it saw; "
              f"the report was written {timing['seconds_from_last_progress_to_report']} s after it")  # fmt: skip
        events = (out / "events.log").read_text()
        assert "joined the Ray cluster at " + cluster in events and "hang called" in events, events
        assert "through RAY_JOB_CONFIG_JSON_ENV_VAR" in said
    finally:
        if driver_pid is not None:  # --on-hang exit left the job running: its driver's end ends its actors
            try:
                os.killpg(driver_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print(Path(stderr).read_text(errors="replace")[-3000:] if Path(stderr).exists() else "")


def test_ray_job_submit_is_found_and_its_runtime_env_json_carries_them_merged_into_the_users(cluster, tmp_path):
    """No --ray: run finds the Ray job in its command, adds the variables to the user's --runtime-env-json (their
    own key kept), and watches the cluster that runs on this node (auto)."""
    gcs, jobs = cluster
    assert jobs is not None, "the head's job server did not start in 3 tries (Ray gives it a fixed 20 s)"
    ready = submit_ray_job([*RAY, "job", "submit", "--address", jobs, "--", sys.executable, "-c", "pass"],
                           env=_job_env(), cwd=ROOT, timeout=600)  # fmt: skip
    assert ready.returncode == 0, ready.stdout[-2000:] + ready.stderr[-2000:]  # the job server is up
    out = tmp_path / "run"
    theirs = json.dumps({"env_vars": {"TORCH_FR_BUFFER_SIZE": "55"}})
    done = subprocess.run(
        [
            sys.executable, "-m", "mtpdiag", "run", "--out", str(out), "--ray-timeout", "240", "--",
            *RAY, "job", "submit", "--address", jobs, "--runtime-env-json", theirs, "--",
            sys.executable, PROBE, gcs, *FR_KEYS, "DRIVER_RT", "OWN",
        ],
        env=_job_env(), capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert _probe(done) == {
        "TORCH_FR_BUFFER_SIZE": "55",
        "TORCH_FR_DUMP_TEMP_FILE": str(out / "fr" / "rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(out / "fr-pipe" / "rank_"),
        "DRIVER_RT": "driver",
        "OWN": "own",
    }
    record = json.loads((out / "run.json").read_text())["ray"]
    assert (record["detected"], record["route"], record["address"]) == (
        "ray job submit",
        "ray job submit --runtime-env-json",
        "auto",
    )
    assert record["kept"] == ["TORCH_FR_BUFFER_SIZE"], record
    assert "keeping the job's own runtime_env value of TORCH_FR_BUFFER_SIZE" in done.stderr
    assert "Traceback" not in done.stderr
    print("\n" + (out / "events.log").read_text())


def test_on_hang_kill_of_a_submitted_job_stops_it_through_its_job_server(cluster, tmp_path):
    """``ray job submit`` only reads the job's log: killing it leaves the job and its actors running. run gives
    the job a submission id and, after the call, stops it through the job server: no actor is left."""
    gcs, jobs = cluster
    assert jobs is not None, "the head's job server did not start in 3 tries (Ray gives it a fixed 20 s)"
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "mtpdiag", "run", "--on-hang", "kill", "--out", str(out),
            "--ray", gcs, "--ray-timeout", "240", "--",
            *RAY, "job", "submit", "--address", jobs, "--",
            sys.executable, DRIVER, *OVERRIDES, "--gate", "buggy", "--address", gcs,
        ],
        env=_job_env(), capture_output=True, text=True, timeout=1500, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["findings"][0]["id"] == "mtp-cp-gated-reduce"
    submission = json.loads((out / "run.json").read_text())["ray"]["submission_id"]
    assert submission.startswith("mtpdiag-run-")
    events = (out / "events.log").read_text()
    assert f"stopped the Ray job {submission} through its job server" in events, events
    status = subprocess.run(
        [*RAY, "job", "status", "--address", jobs, submission],
        env=_job_env(), capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert f"Job '{submission}' was stopped" in status.stdout + status.stderr, status.stdout + status.stderr
    actors = {c["pid"] for c in json.loads((out / "bundle.json").read_text())["captures"]}
    assert len(actors) == HANG.world
    deadline = time.monotonic() + 60  # Ray ends a stopped job's actors by itself, within seconds
    while (left := {p for p in actors if procfs.is_running(p)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"actors of the stopped job still run: {left}"
