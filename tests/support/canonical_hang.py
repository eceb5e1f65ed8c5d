"""The canonical hang, started once per test session and shared by every test that only reads it.

It is verl #5895 on CPU (``examples/mtp_cp_deadlock --gate buggy --cp 2 --pp 2``: torchrun, gloo, megatron-core,
4 ranks), run through ``examples/flight_recorder`` (the reproducer unchanged, plus each rank's Flight Recorder dump
once its collectives stop: ``CanonicalHang.fr_prefix``), so that the Flight Recorder tests and the playbooks read it
too, with canary secrets where real jobs keep theirs, so the secrets tests read the same job as the rest:

* non-whitelisted environment variables (W&B, AWS, Hugging Face, a database URL) in every process;
* a ``--secret-flag=...`` on every worker's command line (the launcher drops it before the reproducer parses
  its arguments);
* a local variable of a function on every worker's stack (``py-spy dump --locals`` shows it);
* a node-level ``RANK``/``WORLD_SIZE`` in the torchrun agent's environment, as a Kubeflow PyTorchJob sets them:
  the agent is still a launcher, not a worker.

The tests that use it (the ``canonical_hang`` fixture of ``tests/conftest.py``) run in one xdist group, so one
worker starts it. A test that stops, kills or times a job starts its own. A 4-rank world costs ~15 CPU-s to start
on these 2-core machines, where CI is CPU-bound: this one job stands in for three.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mtpdiag.fix.verify.launch import Job, start_torchrun
from support.jobs_e2e import FR_WORKER
from support.recorder import record

STEM = "cnry-9d41"  # every canary starts with it: a truncated leak is a leak too
SECRET_ENV = {
    "WANDB_API_KEY": f"{STEM}-wandb-0c7e",
    "AWS_SECRET_ACCESS_KEY": f"{STEM}-aws-5b2f",
    "HF_TOKEN": f"{STEM}-hf-e81a",
    "DATABASE_URL": f"postgres://trainer:{STEM}-db-77d0@db.internal/runs",
}
SECRET_FLAG = f"{STEM}-flag-a3c9"
SECRET_LOCAL = f"{STEM}-local-4e10"
CANARIES = (STEM, *SECRET_ENV.values(), SECRET_FLAG, SECRET_LOCAL)
AGENT_ENV = {"RANK": "0", "WORLD_SIZE": "1"}  # the node's, as Kubeflow sets them on the launcher

LAUNCHER = f'''"""Drop --secret-flag=... from argv, then run the reproducer below a frame holding a secret local."""
import runpy, sys


def main(api_token={SECRET_LOCAL!r}):
    sys.argv = [{FR_WORKER!r}] + [a for a in sys.argv[1:] if not a.startswith("--secret-flag=")]
    runpy.run_path({FR_WORKER!r}, run_name="__main__")


main()
'''
ARGS = ("--gate", "buggy", "--cp", "2", "--pp", "2", f"--secret-flag={SECRET_FLAG}")

# rank -> (innermost function, first frame outside torch.distributed)
WAITS = {
    0: ("send", "send_forward"),
    1: ("all_gather", "ring_attention"),
    2: ("all_reduce", "MTPLossLoggingHelper.reduce_loss_in_tracker"),
    3: ("all_gather", "ring_attention"),
}


@dataclass(frozen=True)
class CanonicalHang:
    job: Job
    workers: list[int]  # pids, in rank order
    folder: Path  # the job's log and launcher; tests write their files in their own tmp_path

    @property
    def pid(self) -> int:
        return self.job.pid

    @property
    def fr_prefix(self) -> str:
        """``TORCH_FR_DUMP_TEMP_FILE``: each rank's Flight Recorder dump is ``<fr_prefix><rank>``."""
        return fr_prefix(self.folder)


def fr_prefix(folder: Path) -> str:
    return str(record.fr_dir(folder) / "rank_")  # where the recorded Flight Recorder scenarios dump theirs


def start(folder: Path) -> Job:
    launcher = folder / "launch_with_secrets.py"
    launcher.write_text(LAUNCHER)
    # the recorder on, and each rank's dump written 2 s after its collectives stop (examples/flight_recorder)
    env = {**SECRET_ENV, **AGENT_ENV, **record.recorder_env(folder)}
    return start_torchrun(str(launcher), list(ARGS), 4, env=env, log_path=str(folder / "job.log"))


def hung(job: Job, folder: Path) -> CanonicalHang:
    """The job once every worker's main thread has been quiet for 3 s and every rank has written its dump."""
    workers = job.wait_until_stuck(quiet_s=3.0, timeout=300.0)
    assert len(workers) == 4 and os.path.exists(folder / "job.log")
    record.wait_for_dumps(record.fr_dir(folder), 4, job, timeout=120.0)
    return CanonicalHang(job=job, workers=workers, folder=folder)
