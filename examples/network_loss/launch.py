"""Hang a healthy 4-rank gloo job by cutting its network: a real ``all-waiting`` hang. Needs root.

The job (``examples/gated_collectives/worker.py --scenario healthy``: compute plus a gradient
all_reduce, forever) runs under torchrun in a private network namespace whose loopback is up. Once
every rank is training, this script takes that loopback down: established TCP connections stop
delivering (sends still succeed, receives block), so every rank blocks in the same all_reduce, below
Python. Then it prints the torchrun agent's pid and keeps the job hung until Ctrl-C or SIGTERM, when
it kills the agent and every worker.

    sudo python examples/network_loss/launch.py
    sudo mtpdiag inspect --pid <torchrun agent pid>     # from another shell
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mtpdiag.fix.verify.launch import Job, start_torchrun  # noqa: E402

WORKER = REPO / "examples" / "gated_collectives" / "worker.py"
# Prefix that runs a command in a new network namespace with its own loopback up: a job started so has a
# private network that ``cut_network`` can take away without touching the host's (``unshare`` and ``sh`` exec
# into torchrun, so the job's pid is still the agent's).
PRIVATE_NETWORK = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")
TRAINING = re.compile(r"^rank (\d+) step (\d+) ok$", re.MULTILINE)


class SetupError(Exception):
    """Why the reproducer cannot run here, in one line."""


def check_can_run() -> None:
    """Root, and a kernel that lets us make a network namespace (containers may refuse it)."""
    if os.geteuid() != 0:
        raise SetupError("needs root: it runs the job under `unshare --net` and cuts it with `nsenter` "
                         "(run it with sudo)")
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            raise SetupError(f"needs `{tool}` (util-linux / iproute2) on PATH")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SetupError(f"`unshare --net` was refused: {probe.stderr.strip() or probe.returncode}")


def wait_until_training(job: Job, log_path: str, steps: int, timeout: float = 120.0) -> None:
    """Until every rank has printed ``rank R step N ok`` with N >= ``steps``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.proc.poll() is not None:
            raise RuntimeError(f"the job exited ({job.proc.returncode}) before training{_tail(log_path)}")
        with open(log_path, errors="replace") as f:
            ranks = {int(m[1]) for m in TRAINING.finditer(f.read()) if int(m[2]) >= steps}
        if len(ranks) >= job.nproc:
            return
        time.sleep(0.2)
    raise TimeoutError(f"not every rank reached step {steps} within {timeout}s{_tail(log_path)}")


def start_and_cut(log_path: str, nproc: int = 4, steps: int = 20, on_start=None) -> Job:
    """Start the job in its own network namespace, let it train ``steps`` steps, cut its network and
    wait until every worker's main thread is quiet. ``on_start(job)`` is called once the job exists,
    so that a caller can kill it even if this raises."""
    job = start_torchrun(str(WORKER), ["--scenario", "healthy", "--steps", "0", "--log-every", str(steps)],
                         nproc, log_path=log_path, prefix=PRIVATE_NETWORK)
    if on_start:
        on_start(job)
    job.wait_for_workers(timeout=120)
    wait_until_training(job, log_path, steps)
    cut_network(job)
    job.wait_until_stuck(quiet_s=3.0, timeout=120.0)
    return job


def cut_network(job: Job) -> None:
    """Take down the loopback of the job's private network namespace (started with ``prefix=PRIVATE_NETWORK``):
    established connections then stop delivering while sends still succeed, so every rank blocks in its next
    collective below Python, as on a lost network."""
    own = os.readlink("/proc/self/ns/net")
    try:
        theirs = os.readlink(f"/proc/{job.pid}/ns/net")
    except OSError as exc:
        raise RuntimeError(f"cannot read the network namespace of pid {job.pid}: {exc}") from exc
    if theirs == own:
        raise RuntimeError(f"pid {job.pid} shares this process's network namespace; refusing to take "
                           "its loopback down (start the job with prefix=PRIVATE_NETWORK)")
    done = subprocess.run(["nsenter", f"--net=/proc/{job.pid}/ns/net", "ip", "link", "set", "lo", "down"],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"could not cut the job's network: {done.stderr.strip()}")


def _tail(log_path: str, lines: int = 5) -> str:
    try:
        with open(log_path, errors="replace") as f:
            return ": " + " | ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return ""


def _end_on_sigterm(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--steps", type=int, default=20, help="training steps every rank makes before the cut")
    parser.add_argument("--log", help="the job's output (default: a file in a temporary directory)")
    args = parser.parse_args(argv)
    try:
        check_can_run()
    except SetupError as exc:
        print(f"network_loss: {exc}", file=sys.stderr)
        return 2
    log_path = args.log or os.path.join(tempfile.mkdtemp(prefix="mtpdiag-network-loss-"), "job.log")
    signal.signal(signal.SIGTERM, _end_on_sigterm)
    started: list[Job] = []

    def on_start(job: Job) -> None:
        started.append(job)
        print(f"started: torchrun agent pid {job.pid}, {args.nproc} ranks, log {log_path}", flush=True)

    try:
        job = start_and_cut(log_path, args.nproc, args.steps, on_start)
        print(f"network cut; every rank hangs: torchrun agent pid {job.pid}", flush=True)
        print(f"inspect it from another shell: mtpdiag inspect --pid {job.pid}", flush=True)
        print("Ctrl-C ends the job", flush=True)
        job.proc.wait()
        print(f"the job ended by itself (exit {job.proc.returncode}){_tail(log_path)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"network_loss: {exc}", file=sys.stderr)
        return 1
    finally:
        for job in started:
            job.kill()


if __name__ == "__main__":
    sys.exit(main())
