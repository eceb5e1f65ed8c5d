"""Time ``mtpdiag inspect --json`` on a real hung 4-rank job against a minimal py-spy program.

Usage: python benchmarks/inspect_bench.py [--repeat 7] [--with-locals-baseline]

Starts the MTP-CP reproducer (examples/mtp_cp_deadlock/worker.py --gate buggy --cp 2 --pp 2, torchrun,
gloo, real megatron-core), waits until it hangs, then alternates ``--repeat`` times:

* baseline: a fresh interpreter running a tiny program that runs ``py-spy dump --json --pid P`` for the
  4 workers in parallel threads and ``json.loads`` each output;
* inspect:  ``python -m mtpdiag inspect --pid AGENT --json`` (finds the workers itself).

Both are subprocesses, so both pay interpreter start-up. The goal is inspect <= 2x the baseline. It also
prints a split of one inspect (start-up and CLI imports as subprocesses; capture and diagnose + render
in-process) in wall and CPU seconds (wall is noisy on a shared machine), the top imports of
``python -X importtime -m mtpdiag inspect --help``, and whether inspect, capture or analysis import torch
or megatron. The job is killed at the end. No assertions.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from mtpdiag.fix.verify.launch import start_torchrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "examples", "mtp_cp_deadlock", "worker.py")
WORKER_ARGS = ["--gate", "buggy", "--cp", "2", "--pp", "2"]
GOAL_RATIO = 2.0

BASELINE_PROGRAM = """
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
pyspy, extra, pids = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def dump(pid):
    out = subprocess.run([pyspy, "dump", "--json", *extra, "--pid", pid], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)
with ThreadPoolExecutor(len(pids)) as pool:
    stacks = list(pool.map(dump, pids))
print(sum(len(s) for s in stacks))
"""

# Modules that inspect, capture and analysis load; none of them may pull in torch or megatron.
INSPECT_MODULES = (
    "mtpdiag.cli",
    "mtpdiag.commands.inspect",
    "mtpdiag.commands.options",
    "mtpdiag.pipeline",
    "mtpdiag.capture",
    "mtpdiag.analysis",
    "mtpdiag.layout.sources",
    "mtpdiag.inputs",
    "mtpdiag.report.json_report",
    "mtpdiag.report.console",
)


CHILD_ENV = dict(os.environ)


def use_bytecode_cache(directory: str) -> None:
    """Let the children cache bytecode (in ``directory``), as an installed package has its .pyc files.

    Without this, a shell with PYTHONDONTWRITEBYTECODE set makes every ``inspect`` compile the mtpdiag modules
    whose .pyc in the tree is stale, which the baseline, one small program, hardly pays (seen: 2.2x instead of
    1.9x after a merge).
    """
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = directory


def run_child(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (the child and its waited-for children) and exit status."""
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=CHILD_ENV
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - began
    err = proc.stderr.read().decode(errors="replace").strip()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        print(f"  ! {' '.join(argv[1:5])} exited {proc.returncode}: {err.splitlines()[-1:] if err else ''}")
    return seconds, usage.ru_utime + usage.ru_stime, proc.returncode


def _cpu_now() -> float:
    """CPU seconds of this process and of its waited-for children (py-spy runs as a child)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def split_of_one_inspect(agent: int) -> dict[str, tuple[float, float]]:
    """Where one inspect goes, as (wall, cpu) seconds: fixed CLI cost (subprocesses), capture, analysis."""
    from mtpdiag.capture import capture
    from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot
    from mtpdiag.report import json_report

    def child_median(argv: list[str]) -> tuple[float, float]:
        rows = [run_child(argv) for _ in range(3)]
        return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)

    def here(fn):
        wall, cpu = time.monotonic(), _cpu_now()
        result = fn()
        return result, (time.monotonic() - wall, _cpu_now() - cpu)

    out: dict[str, tuple[float, float]] = {}
    out["python -c pass (interpreter start-up)"] = child_median([sys.executable, "-c", "pass"])
    out["python -m mtpdiag --version (start-up + CLI imports)"] = child_median(
        [sys.executable, "-m", "mtpdiag", "--version"]
    )
    snapshot, out["capture(): discover, /proc, 4x py-spy --locals"] = here(lambda: capture([agent], timeout=30.0))
    _, out["layout + diagnose + JSON render"] = here(
        lambda: json_report.render(diagnose_snapshot(snapshot, LayoutOptions()))
    )
    return out


def import_offenders(top: int = 12) -> tuple[list[tuple[int, int, str]], bool]:
    """Top imports of ``mtpdiag inspect --help`` by cumulative time, and whether torch/megatron was one."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mtpdiag", "inspect", "--help"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
        env=CHILD_ENV,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|", 2)
        if len(name) - len(name.lstrip()) <= 3:  # top-level imports and their direct children
            rows.append((int(cumulative_us), int(self_us), name.rstrip()))
    names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    heavy = any(n == p or n.startswith(p + ".") for n in names for p in ("torch", "megatron"))
    return sorted(rows, reverse=True)[:top], heavy


def heavy_modules_after_import() -> str:
    """torch/megatron modules present after importing what inspect, capture and analysis use."""
    program = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in INSPECT_MODULES)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False, env=CHILD_ENV)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--with-locals-baseline",
        action="store_true",
        help="also time the baseline with --locals, which inspect passes to py-spy",
    )
    args = parser.parse_args()
    from mtpdiag.capture.pyspy import find_pyspy

    pyspy = find_pyspy()
    scratch = tempfile.mkdtemp(prefix="mtpdiag-inspect-bench-")
    use_bytecode_cache(os.path.join(scratch, "pycache"))
    log = os.path.join(scratch, "job.log")
    job = start_torchrun(WORKER, WORKER_ARGS, nproc=4, log_path=log)
    try:
        began = time.monotonic()
        workers = job.wait_until_stuck(quiet_s=3.0, timeout=240.0)
        print(f"job hung after {time.monotonic() - began:.0f} s: agent {job.pid}, workers {workers}", flush=True)
        variants = {
            "baseline": [sys.executable, "-c", BASELINE_PROGRAM, pyspy, "", *map(str, workers)],
            "inspect": [sys.executable, "-m", "mtpdiag", "inspect", "--pid", str(job.pid), "--json"],
        }
        if args.with_locals_baseline:
            variants["baseline --locals"] = [
                sys.executable,
                "-c",
                BASELINE_PROGRAM,
                pyspy,
                "--locals",
                *map(str, workers),
            ]
        for argv in variants.values():  # untimed: the bytecode cache is written
            run_child(argv)
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
        for i in range(args.repeat):
            for name, argv in variants.items():
                runs[name].append(run_child(argv))
            print(f"run {i + 1}: " + ", ".join(f"{n} {r[-1][0]:.2f} s" for n, r in runs.items()), flush=True)
        print()
        for name, rows in runs.items():
            walls = [r[0] for r in rows]
            print(
                f"{name:>18}: median {statistics.median(walls):.2f} s wall (min {min(walls):.2f}, "
                f"max {max(walls):.2f}), median {statistics.median(r[1] for r in rows):.2f} s cpu, "
                f"exit {rows[-1][2]}"
            )
        ratios = [i[0] / b[0] for i, b in zip(runs["inspect"], runs["baseline"], strict=True)]
        ratio = statistics.median(ratios)
        cpu_ratio = statistics.median(i[1] / b[1] for i, b in zip(runs["inspect"], runs["baseline"], strict=True))
        verdict = "within" if ratio <= GOAL_RATIO else "ABOVE"
        print(
            f"inspect / baseline: median ratio {ratio:.2f} over {len(ratios)} alternated pairs "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}; {verdict} the goal of {GOAL_RATIO}); "
            f"cpu ratio {cpu_ratio:.2f}"
        )
        print("\nsplit of one inspect (wall / cpu seconds; cpu includes py-spy children):")
        for name, (wall, cpu) in split_of_one_inspect(job.pid).items():
            print(f"  {wall:6.2f} / {cpu:5.2f}  {name}")
    finally:
        job.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    rows, heavy = import_offenders()
    print("\ntop imports of `python -X importtime -m mtpdiag inspect --help` (cumulative / self, ms):")
    for cumulative, own, name in rows:
        print(f"  {cumulative / 1000:7.1f} {own / 1000:7.1f}  {name}")
    print(f"torch or megatron imported by `mtpdiag inspect --help`: {'YES' if heavy else 'no'}")
    print(f"torch/megatron modules after importing {', '.join(INSPECT_MODULES)}: {heavy_modules_after_import()}")


if __name__ == "__main__":
    main()
