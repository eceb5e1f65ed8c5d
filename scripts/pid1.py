"""PID 1 of a PID namespace of its own: ``scripts/test.sh`` runs the Ray tests in one
(``unshare --pid --fork --mount-proc``), so their ``inspect --all`` sees their own Ray job and no other job's
ranks on the host, and whatever a Ray cluster leaves behind ends with the namespace.

It starts the command, passes SIGTERM and SIGINT on to it, reaps every orphan the namespace hands to it (a
namespace's PID 1 must, or they stay zombies), and exits with the command's code once the command ends; the
kernel then kills what is left in the namespace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: pid1.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # nothing left to wait for (not expected while the command runs)
            return 1
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
