"""The README's demo: start a real CPU-only deadlocked job, inspect it, print the diagnosis, stop it.

It launches examples/mtp_cp_deadlock/worker.py under torchrun (4 ranks on gloo, CP=2, PP=2, the buggy
verl 0.7.1 gate), waits until every rank's main thread has stopped using CPU, runs the real
``mtpdiag inspect --pid <torchrun agent pid>`` and then kills the whole job.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from mtpdiag.fix.verify.launch import start_torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mtp_cp_deadlock", "worker.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", choices=["buggy", "fixed"], default="buggy")
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("inspect_args", nargs="*", help="extra arguments for mtpdiag inspect (after --)")
    args = parser.parse_args()

    log = os.path.join(tempfile.mkdtemp(prefix="mtpdiag-demo-"), "job.log")
    worker_args = ["--gate", args.gate, "--tp", str(args.tp), "--cp", str(args.cp), "--pp", str(args.pp)]
    print(f"demo: starting {args.nproc} ranks: torchrun {os.path.relpath(WORKER)} {' '.join(worker_args)}",
          flush=True)
    start = time.monotonic()
    with start_torchrun(WORKER, worker_args, args.nproc, log_path=log) as job:
        if args.gate == "fixed":
            code = job.wait(timeout=120)
            print(f"demo: the fixed gate completed (exit {code}) in {time.monotonic() - start:.1f} s; log: {log}")
            return 0 if code == 0 else 1
        job.wait_until_stuck(quiet_s=2.0, timeout=120)
        print(f"demo: the job stopped making progress after {time.monotonic() - start:.1f} s; "
              f"running: mtpdiag inspect --pid {job.pid}", flush=True)
        result = subprocess.run([sys.executable, "-m", "mtpdiag", "inspect", "--pid", str(job.pid),
                                 *args.inspect_args])
    print(f"demo: job stopped (all {args.nproc} ranks killed); mtpdiag exit code {result.returncode} "
          f"(1 = a problem was found)", flush=True)
    return 0 if result.returncode in (0, 1) else result.returncode


if __name__ == "__main__":
    sys.exit(main())
