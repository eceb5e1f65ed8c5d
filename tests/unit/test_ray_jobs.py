"""Ray's job table read into drivers and sizes (``capture.ray_jobs``): rows as Ray 2.49's ``ray._private.state.jobs()``
returns them, entrypoints as Ray writes them (``subprocess.list2cmdline`` of the driver's argv), and command lines
read from a real process."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from mtpdiag.capture import procfs
from mtpdiag.capture.ray_jobs import (
    JobDriver,
    alive_drivers,
    drivers_by_ip,
    drivers_on_cluster,
    entrypoint_hints,
    job_drivers,
    merged_entrypoint_hints,
    node_driver_hints,
    read_job_table,
)

SECRET = "cnry-jobtable-unit"
VERL_ARGV = [
    "/usr/bin/python3",
    "-m",
    "verl.trainer.main_ppo",
    "actor_rollout_ref.actor.megatron.context_parallel_size=2",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",  # the inference engine's: never the layout
    f"trainer.experiment_name=run with spaces {SECRET}",
]
OWN = "03000000"


def _row(job_id: str, pid: int, ip: str = "10.0.0.5", *, dead: bool = False, start_ms: int = 1_700_000_000_000,
         entrypoint: str = "") -> dict:  # fmt: skip
    """A row as ``ray._private.state.jobs()`` gives it (Ray 2.49)."""
    return {
        "JobID": job_id,
        "DriverIPAddress": ip,
        "DriverPid": pid,
        "Timestamp": start_ms,
        "StartTime": start_ms,
        "EndTime": 0 if not dead else start_ms + 1,
        "IsDead": dead,
        "Entrypoint": entrypoint,
    }


def test_alive_drivers_keep_running_jobs_but_mtpdiags_own_and_reduce_entrypoints_to_sizes():
    rows = [
        _row("02000000", 4321, start_ms=1_700_000_005_000, entrypoint=subprocess.list2cmdline(VERL_ARGV)),
        _row("01000000", 1111, dead=True, entrypoint="python train.py --context-parallel-size 8"),
        _row(OWN, os.getpid(), entrypoint="python -m mtpdiag inspect --ray auto"),
        _row("04000000", 0, entrypoint="python -m x --cp 8"),  # no driver pid: nothing to read on a node
        _row("05000000", 999, "10.0.0.6", start_ms=1_700_000_001_000, entrypoint="python pretrain_gpt.py --tp 2"),
    ]
    drivers = alive_drivers(rows, own_job=OWN)
    assert [(d.job_id, d.pid, d.ip) for d in drivers] == [("05000000", 999, "10.0.0.6"), ("02000000", 4321, "10.0.0.5")]
    assert drivers[0].started_s == 1_700_000_001.0
    assert drivers[0].entrypoint_hints == {"tp": 2}
    assert drivers[1].entrypoint_hints == {"cp": 2, "pp": 2}
    # only the sizes are kept: nothing of the entrypoint's text
    assert SECRET not in repr(drivers) and not any(
        isinstance(v, str) and "main_ppo" in v for d in drivers for v in dataclasses.astuple(d)
    )


def test_rows_with_missing_or_odd_fields_are_skipped_not_raised():
    rows = [{}, {"JobID": "06000000"}, {"JobID": "07000000", "IsDead": False, "DriverPid": "x"},
            {"JobID": "08000000", "IsDead": False, "DriverPid": True},
            {"JobID": "09000000", "IsDead": False, "DriverPid": "77", "StartTime": None}]  # fmt: skip
    (driver,) = alive_drivers(rows, own_job="")
    assert (driver.job_id, driver.pid, driver.ip, driver.started_s, driver.entrypoint_hints) == (
        "09000000",
        77,
        "",
        0,
        {},
    )


@pytest.mark.parametrize(
    ("entrypoint", "sizes"),
    [
        (subprocess.list2cmdline(VERL_ARGV), {"cp": 2, "pp": 2}),
        (
            subprocess.list2cmdline(
                [
                    "torchrun",
                    "--nproc-per-node",
                    "8",
                    "pretrain_gpt.py",
                    "--tensor-model-parallel-size",
                    "2",
                    "--context-parallel-size=4",
                ]
            ),
            {"tp": 2, "cp": 4},
        ),  # fmt: skip
        ("(interactive_shell) python -i train.py --pipeline-model-parallel-size 3", {"pp": 3}),  # Ray's prefix
        ('python train.py "--tensor-model-parallel-size 2 --cp 2', {"cp": 2}),  # an unbalanced quote: words
        ("unknown", {}),  # psutil could not read the driver's command line
        ("", {}),
    ],
)
def test_entrypoint_hints_read_ray_s_joined_argv(entrypoint, sizes):
    assert entrypoint_hints(entrypoint) == sizes


def test_drivers_by_ip_groups_pids_and_job_starts_per_node_address():
    drivers = [
        JobDriver("01000000", "10.0.0.5", 11, 100.0, {}),
        JobDriver("02000000", "10.0.0.6", 22, 200.0, {}),
        JobDriver("03000000", "10.0.0.5", 33, 300.0, {}),
        JobDriver("04000000", "", 44, 400.0, {}),  # no address: on no node
    ]
    assert drivers_by_ip(drivers) == {"10.0.0.5": [[11, 100.0], [33, 300.0]], "10.0.0.6": [[22, 200.0]]}


def test_the_earliest_job_s_entrypoint_wins_a_size_both_name():
    drivers = [JobDriver("01000000", "a", 1, 1.0, {"cp": 2}), JobDriver("02000000", "a", 2, 2.0, {"cp": 4, "tp": 2})]
    assert merged_entrypoint_hints(drivers) == {"cp": 2, "tp": 2}


@pytest.fixture
def driver_process():
    """A real process whose command line names sizes (and a secret), as a job driver's does."""
    argv = [sys.executable, "-c", "import sys; sys.stdin.read()", *VERL_ARGV[3:]]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while (procfs.read_cmdline(proc.pid) or [])[-1:] != argv[-1:] and time.monotonic() < deadline:
            time.sleep(0.05)  # until the exec is done
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_node_driver_hints_read_the_listed_drivers_command_lines_and_keep_only_sizes(driver_process):
    job_started = procfs.start_time(driver_process) + 0.5  # the job registers after its driver started
    assert node_driver_hints([[driver_process, job_started]]) == {"cp": 2, "pp": 2}
    assert node_driver_hints([[driver_process, 0]]) == {"cp": 2, "pp": 2}  # the GCS gave no start time


def test_node_driver_hints_skip_mtpdiags_own_a_pid_reused_after_the_job_started_and_a_gone_pid(driver_process):
    started = procfs.start_time(driver_process)
    assert node_driver_hints([[driver_process, started]], exclude={driver_process}) == {}
    # the job started long before this process did: the pid belongs to another process now
    assert node_driver_hints([[driver_process, started - 3600]]) == {}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert node_driver_hints([[gone.pid, 0]]) == {}


def test_a_ray_without_the_job_table_call_is_a_note_not_an_error():
    without_state = SimpleNamespace(_private=SimpleNamespace(), get_runtime_context=lambda: None)
    rows, note = read_job_table(without_state)
    assert rows == [] and note is not None and "job table could not be read (AttributeError)" in note
    drivers, notes = job_drivers(without_state)
    assert drivers == [] and notes == [note]


def test_job_drivers_leave_out_the_connection_s_own_job():
    rows = [_row(OWN, os.getpid()), _row("05000000", 999, entrypoint="python x.py --cp 2")]
    context = SimpleNamespace(get_job_id=lambda: OWN)
    ray = SimpleNamespace(
        _private=SimpleNamespace(state=SimpleNamespace(jobs=lambda: rows)), get_runtime_context=lambda: context
    )
    drivers, notes = job_drivers(ray)
    assert [d.job_id for d in drivers] == ["05000000"] and notes == []
    assert drivers[0].entrypoint_hints == {"cp": 2}


def test_drivers_on_cluster_hand_back_plain_tuples_without_entrypoints(monkeypatch):
    """Through Ray Client a task on the cluster reads the table; what it returns crosses as plain data."""
    rows = [_row(OWN, 10), _row("05000000", 999, entrypoint=subprocess.list2cmdline(VERL_ARGV))]
    monkeypatch.setitem(
        sys.modules, "ray", SimpleNamespace(_private=SimpleNamespace(state=SimpleNamespace(jobs=lambda: rows)))
    )
    found, note = drivers_on_cluster(OWN)
    assert note is None and all(type(fields) is tuple for fields in found)
    assert SECRET not in repr(found)
    assert [JobDriver(*fields) for fields in found] == [
        JobDriver("05000000", "10.0.0.5", 999, 1_700_000_000.0, {"cp": 2, "pp": 2})
    ]
