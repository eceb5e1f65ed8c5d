"""Time ``mtpdiag verify --cp 2 --engine both --json`` a few times and print the total and its split.

Usage: python benchmarks/verify_bench.py [--repeat N] [--cp N] [--pp N]

The split comes from each run's ``phases`` in the JSON: startup (launch until every rank finished
initialize_model_parallel: torch + megatron-core import dominates), hang_detection (last progress
until the hang is called), capture (the second stack sample) and diagnosis (analysis), collect and
teardown (completed run).
No assertions: this measures, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

PHASES = ("startup", "hang_detection", "capture", "diagnosis", "cleanup", "collect", "teardown")


def one(cp: int, pp: int) -> tuple[float, dict]:
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "verify", "--cp", str(cp), "--pp", str(pp), "--engine", "both", "--json"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    total = time.monotonic() - began
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {"runs": [], "error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    doc["exit"] = proc.returncode
    return total, doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=1)
    args = parser.parse_args()
    totals: list[float] = []
    for i in range(args.repeat):
        total, doc = one(args.cp, args.pp)
        totals.append(total)
        print(f"run {i + 1}: {total:.1f} s total, exit {doc['exit']}" + (f", {doc['error']}" if "error" in doc else ""))
        for run in doc["runs"]:
            split = ", ".join(f"{k} {run['phases'][k]:.1f}" for k in PHASES if k in run["phases"])
            print(f"  {run['engine']:>6}: {run['outcome']} after {run['seconds']:.1f} s ({split})")
    if totals:
        print(
            f"total: median {statistics.median(totals):.1f} s, min {min(totals):.1f} s, "
            f"max {max(totals):.1f} s over {len(totals)} run(s)"
        )


if __name__ == "__main__":
    main()
