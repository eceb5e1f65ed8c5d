"""What ``mtpdiag run`` costs a healthy job: its steps per second with and without ``run``, in one run.

Usage: python benchmarks/run_overhead.py [--repeat N] [--steps N] [--device-step-s S]

The job is ``examples/nccl_behaviour/worker.py --healthy``-like (the fixed gate, cp 2, pp 2, 4 ranks under
torchrun, ``--steps N``), started plainly and under ``mtpdiag run --out <tmp>``, alternately (plain, run, plain,
run, …), so both see the same machine. Its steps per second are read from rank 0's ``rank 0 step K`` lines as
they arrive on a pipe (the same pipe for both: ``run`` passes the job's stdout through), from step
``WARMUP`` to the last one, so start-up (imports, communicators) and ``run``'s arming are left out. Prints each
pair, the medians and the median of the per-pair ratios (run / plain; 1.0 = no cost).
No assertions: this measures, it does not judge. The job's ranks share this machine's cores with the watcher
(and its py-spy), as a GPU node's host cores are not: on 2 loaded cores this is the worst case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "examples", "nccl_behaviour", "worker.py")
WARMUP = 3  # steps left out at the start
FR_VARS = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)


def steps_per_s(under_run: bool, steps: int, device_step_s: float, scratch: str) -> float:
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", WORKER]
    job += ["--gate", "fixed", "--cp", "2", "--pp", "2", "--microbatches", "1"]
    job += ["--steps", str(steps), "--device-step-s", str(device_step_s)]
    cmd = job
    if under_run:
        out = tempfile.mkdtemp(prefix="run-", dir=scratch)
        os.rmdir(out)
        cmd = [sys.executable, "-m", "mtpdiag", "run", "--out", out, "--", *job]
    # Both variants get the Flight Recorder as run sets it, so only the watching differs.
    env = {**os.environ, "OMP_NUM_THREADS": "1", **{k: "" for k in FR_VARS}}
    if not under_run:
        fr = tempfile.mkdtemp(prefix="plain-", dir=scratch)
        env.update(
            TORCH_FR_BUFFER_SIZE="2000",
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_FR_DUMP_TEMP_FILE=os.path.join(fr, "rank_"),
            TORCH_NCCL_DEBUG_INFO_PIPE_FILE=os.path.join(fr, "rank_"),
        )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    seen: dict[int, float] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("rank 0 step "):
            seen[int(line.split()[3])] = time.monotonic()
    code = proc.wait()
    last = max(seen, default=0)
    if code != 0 or last <= WARMUP:
        raise RuntimeError(f"the job ended with {code} after {len(seen)} steps")
    return (last - WARMUP) / (seen[last] - seen[WARMUP])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device-step-s", type=float, default=0.1)
    args = parser.parse_args()
    plain, run, ratios = [], [], []
    with tempfile.TemporaryDirectory(prefix="mtpdiag-run-bench-") as scratch:
        for i in range(args.repeat):
            a = steps_per_s(False, args.steps, args.device_step_s, scratch)
            b = steps_per_s(True, args.steps, args.device_step_s, scratch)
            plain.append(a)
            run.append(b)
            ratios.append(b / a)
            print(f"pair {i + 1}: plain {a:.3f} steps/s, under run {b:.3f} steps/s, ratio {b / a:.3f}", flush=True)
    print(
        f"median: plain {statistics.median(plain):.3f} steps/s, under run {statistics.median(run):.3f} steps/s; "
        f"median ratio (run / plain) {statistics.median(ratios):.3f} over {args.repeat} pairs; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
