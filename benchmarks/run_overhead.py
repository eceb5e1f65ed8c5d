"""What ``mtpdiag run`` costs a healthy job: its steps per second with and without ``run``, in one run.

Usage: python benchmarks/run_overhead.py [--pairs N] [--steps N] [--device-step-s S] [--sync futex|spin|poll]

The job is ``examples/nccl_behaviour/worker.py`` with the fixed gate (cp 2, pp 2, 4 ranks under torchrun,
``--steps N``), started plainly and under ``mtpdiag run --out <tmp>``. The two alternate in pairs whose order
flips (plain, run; run, plain; plain, run; ...: A/B/B/A), so both see the same machine and a load that drifts
during the run favours neither. Steps per second are read from rank 0's ``rank 0 step K`` lines as they arrive
on a pipe (the same pipe for both: ``run`` passes the job's stdout through), from step ``WARMUP`` to the last
one, so start-up (imports, communicators) and ``run``'s arming are left out. Both get the Flight Recorder as
``run`` sets it, so only the watching differs (including the dumps ``run`` asks the job for).

Prints each pair (with the load average when it ended), then the median ratio run / plain (1.0 = no cost; the
issue's bound is 0.99) with its spread (lowest, highest, and the interquartile range), the CPU the watcher used
(``mtpdiag run`` and the py-spy processes it started, per second of the measured steps) and how its samples
read stacks (``events.log``'s ``sampling:`` line). No assertions: this measures, it does not judge. The ranks
share this machine's cores with the watcher, as a GPU node's host cores mostly are not: on 2 loaded cores this
is the worst case, and the ratios of single pairs are as noisy as the load.

A loaded machine makes steps/s noise, so the CPU is measured too: the ranks' CPU per step (their own work, and
what ``run`` adds to it: the Flight Recorder dumps it asks for), and that plus the watcher's. On a CPU-bound
machine steps/s goes as the inverse of the CPU a step needs, and CPU time hardly depends on the load. The ranks
wait at their host syncs blocked (``--sync futex``, the default here), so that waiting is not counted as work:
spinning ranks (CUDA's default, ``--sync spin``) burn CPU for as long as they wait, which the load decides.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "examples", "nccl_behaviour", "worker.py")
WARMUP = 3  # steps left out at the start
FR_VARS = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)
TICK = os.sysconf("SC_CLK_TCK")


class Measured(NamedTuple):
    steps_per_s: float
    watcher_cpu_s: float | None  # run only: CPU of mtpdiag run and its reaped py-spy processes, in the window
    window_s: float
    sampling: str  # run only: events.log's "sampling:" line
    ranks_cpu_per_step: float  # the ranks' CPU (s) per step, in the window


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _ranks_cpu(root: int) -> dict[int, float]:
    """CPU (s) of every process below ``root`` that carries RANK (the ranks: not torchrun, not py-spy)."""
    out, todo = {}, _children(root)
    while todo:
        pid = todo.pop()
        todo += _children(pid)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                ranked = any(entry.startswith(b"RANK=") for entry in f.read().split(b"\0"))
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if ranked:
            out[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def _cpu_of_run(pid: int) -> float | None:
    """``mtpdiag run``'s own CPU plus that of the children it reaped: its py-spy processes (the job, its other
    child, is reaped only when it ends, after the last reading)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(v) for v in fields[11:15]) / TICK


def _job(steps: int, device_step_s: float, sync: str) -> list[str]:
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", WORKER]
    job += ["--gate", "fixed", "--cp", "2", "--pp", "2", "--microbatches", "1", "--sync", sync]
    return job + ["--steps", str(steps), "--device-step-s", str(device_step_s)]


def measure(under_run: bool, steps: int, device_step_s: float, sync: str, scratch: str) -> Measured:
    cmd = _job(steps, device_step_s, sync)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **{k: "" for k in FR_VARS}}
    out = tempfile.mkdtemp(prefix="run-" if under_run else "plain-", dir=scratch)
    if under_run:
        os.rmdir(out)
        cmd = [sys.executable, "-m", "mtpdiag", "run", "--out", out, "--", *cmd]
    else:
        env.update(
            TORCH_FR_BUFFER_SIZE="2000",
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_FR_DUMP_TEMP_FILE=os.path.join(out, "rank_"),
            TORCH_NCCL_DEBUG_INFO_PIPE_FILE=os.path.join(out, "rank_"),
        )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    seen: dict[int, tuple[float, float | None, dict[int, float]]] = {}  # step -> (when, run's CPU, the ranks')
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("rank 0 step "):
            run_cpu = _cpu_of_run(proc.pid) if under_run else None
            seen[int(line.split()[3])] = (time.monotonic(), run_cpu, _ranks_cpu(proc.pid))
    code = proc.wait()
    last = max(seen, default=0)
    # The first step line at or after the warm-up (a line the ranks' interleaved output garbled is missing).
    first = min((s for s in seen if s >= WARMUP), default=last)
    if code != 0 or last <= first:
        raise RuntimeError(f"the job ended with {code} after {len(seen)} steps")
    (t0, c0, r0), (t1, c1, r1) = seen[first], seen[last]
    cpu = c1 - c0 if c0 is not None and c1 is not None else None
    ranks = sum(r1[p] - r0[p] for p in r1 if p in r0) / (last - first)
    return Measured((last - first) / (t1 - t0), cpu, t1 - t0, _sampling(out) if under_run else "", ranks)


def _sampling(out: str) -> str:
    try:
        with open(os.path.join(out, "events.log"), encoding="utf-8") as f:
            lines = [line.split(" ", 1)[1].strip() for line in f if " sampling: " in line]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _spread(values: list[float]) -> str:
    if len(values) < 4:
        return f"lowest {min(values):.3f}, highest {max(values):.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"lowest {min(values):.3f}, highest {max(values):.3f}, interquartile {q1:.3f}-{q3:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device-step-s", type=float, default=0.1)
    parser.add_argument("--sync", default="futex", help="how a rank waits at a host sync (the worker's --sync)")
    args = parser.parse_args()
    ratios: list[float] = []
    cpu_ratios: list[float] = []  # plain's ranks' CPU per step / run's: 1.0 = run adds nothing to the ranks' work
    all_ratios: list[float] = []  # the same with the watcher's CPU per step added to run's
    plain: list[float] = []
    runs: list[Measured] = []
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mtpdiag-run-bench-") as scratch:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {kind: measure(kind, args.steps, args.device_step_s, args.sync, scratch) for kind in order}
            a, b = got[False], got[True]
            plain.append(a.steps_per_s)
            runs.append(b)
            ratios.append(b.steps_per_s / a.steps_per_s)
            watcher = b.watcher_cpu_s / (b.steps_per_s * b.window_s) if b.watcher_cpu_s is not None else 0.0
            cpu_ratios.append(a.ranks_cpu_per_step / b.ranks_cpu_per_step)
            all_ratios.append(a.ranks_cpu_per_step / (b.ranks_cpu_per_step + watcher))
            used = f"{b.watcher_cpu_s / b.window_s:.3f}" if b.watcher_cpu_s is not None else "?"
            print(
                f"pair {i + 1} ({'plain, run' if i % 2 == 0 else 'run, plain'}): plain {a.steps_per_s:.3f} steps/s, "
                f"under run {b.steps_per_s:.3f} steps/s, ratio {ratios[-1]:.3f}; ranks' CPU per step plain "
                f"{a.ranks_cpu_per_step * 1000:.1f} ms, under run {b.ranks_cpu_per_step * 1000:.1f} ms + watcher "
                f"{watcher * 1000:.1f} ms (ratios {cpu_ratios[-1]:.3f}, {all_ratios[-1]:.3f}); watcher CPU {used} s/s; "
                f"load average {os.getloadavg()[0]:.1f}; {b.sampling}",
                flush=True,
            )
    cpu = [r.watcher_cpu_s / r.window_s for r in runs if r.watcher_cpu_s is not None]
    print(
        f"median: plain {statistics.median(plain):.3f} steps/s, under run "
        f"{statistics.median(r.steps_per_s for r in runs):.3f} steps/s; median ratio (run / plain) "
        f"{statistics.median(ratios):.3f} over {args.pairs} pairs ({_spread(ratios)}); CPU per step ratio "
        f"(plain / run) {statistics.median(cpu_ratios):.3f} ({_spread(cpu_ratios)}), with the watcher's "
        f"{statistics.median(all_ratios):.3f} ({_spread(all_ratios)}); watcher CPU "
        f"{statistics.median(cpu) if cpu else float('nan'):.3f} s per s (median); load average at the end "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
