"""Time reading an N-rank NCCL watchdog log (``parse_watchdog_log``, then ``fold_log``) against the parser of
another revision, in the same run.

Usage: python benchmarks/watchdog_log_bench.py [--sizes 1024,4096,16384] [--repeat 5] [--base REV]

The log is real lines tiled over N ranks: each rank gets BasicSR #737's watchdog line and its group's
``Exception … detected by watchdog`` line (tests/fixtures/watchdog_logs/basicsr_737_pg_guid_desc.log), with
the rank moved to the new rank, and every eighth rank also the exception's echo, a torch 2.5+ ``failure
detected`` line and a line hard-wrapped at 120 columns (sglang #3836's form); two lines of training output
per rank go between. ``--base`` (default: the merge base with main, else HEAD~) names the revision whose
``mtpdiag/inputs/watchdog_log.py`` is the baseline: it is loaded from git into this interpreter, so both
parsers read the same text in the same process, alternately, ``--repeat`` times; the median CPU time is printed with
the time per rank (flat across sizes means linear) and the ratio to the baseline (run only up to
``--base-max`` ranks: the parser before issue #20 was quadratic). No assertions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from types import ModuleType

from mtpdiag.analysis.log_evidence import fold_log
from mtpdiag.inputs.watchdog_log import parse_watchdog_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "watchdog_logs", "basicsr_737_pg_guid_desc.log")


def synthetic_log(ranks: int) -> str:
    lines = open(FIXTURE, encoding="utf-8").read().splitlines()
    timeout, status = lines[0], lines[1]  # rank 1's two lines
    out = []
    for rank in range(ranks):
        moved = [x.replace("[rank1]", f"[rank{rank}]").replace("Rank 1]", f"Rank {rank}]") for x in (timeout, status)]
        out += moved
        out += [
            f"step 1200 rank {rank}: loss 2.31 lr 3e-4",
            "  12%|█▏        | 1200/10000 [1:02:03<7:34:10,  3.10s/it]",
        ]
        if rank % 8 == 0:
            out.append(
                f"[rank{rank}]:[E626 06:24:45.1 ProcessGroupNCCL.cpp:1900] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
                f"Process group watchdog thread terminated with exception: {moved[0].split('] ', 1)[1]}"
            )
            out.append(
                f"[rank{rank}]:[E626 06:24:44.2 ProcessGroupNCCL.cpp:2268] [PG ID 3 PG GUID 7 Rank {rank % 8}]  "
                "failure detected by watchdog at work sequence id: 12 PG status: last enqueued work: 13, "
                "last completed work: 11"
            )
            wrapped = moved[0]
            out += [wrapped[i : i + 120] for i in range(0, len(wrapped), 120)]
    return "\n".join(out) + "\n"


def baseline_parser(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", REPO, "show", f"{rev}:mtpdiag/inputs/watchdog_log.py"], capture_output=True, text=True, check=True
    ).stdout
    spec = importlib.util.spec_from_loader("watchdog_log_base", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{rev}:watchdog_log.py", "exec"), module.__dict__)
    return module


def default_base() -> str:
    done = subprocess.run(["git", "-C", REPO, "merge-base", "HEAD", "main"], capture_output=True, text=True)
    return done.stdout.strip() or "HEAD~"


def timed(fn, *args) -> float:
    """CPU seconds of one call (steadier than wall time on a shared machine; the parsers use one thread)."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024,4096,16384")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", default=None)
    parser.add_argument("--base-max", type=int, default=4096, help="largest size the baseline runs at (it may be slow)")
    args = parser.parse_args()
    rev = args.base or default_base()
    base = baseline_parser(rev)
    print(f"baseline: mtpdiag/inputs/watchdog_log.py at {rev[:12]}; load {os.getloadavg()[0]:.1f}")
    print(
        f"{'ranks':>6} {'lines':>7} {'base parse':>11} {'parse':>9} {'ratio':>6} {'fold':>8} {'µs/rank parse+fold':>19}"
    )
    for size in map(int, args.sizes.split(",")):
        text = synthetic_log(size)
        olds, news, folds = [], [], []
        for _ in range(args.repeat):
            if size <= args.base_max:
                olds.append(timed(base.parse_watchdog_log, text))
            news.append(timed(parse_watchdog_log, text))
            log = parse_watchdog_log(text)
            folds.append(timed(fold_log, log, None, None))
        new, fold = statistics.median(news), statistics.median(folds)
        old = f"{statistics.median(olds):>10.3f}s" if olds else f"{'-':>11}"
        ratio = f"{new / statistics.median(olds):>5.2f}x" if olds else f"{'-':>6}"
        print(
            f"{size:>6} {text.count(chr(10)):>7} {old} {new:>8.3f}s {ratio} {fold:>7.3f}s "
            f"{(new + fold) / size * 1e6:>19.1f}"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
