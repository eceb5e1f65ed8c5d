"""Where a test run's CPU goes: each process's CPU, sampled from /proc, summed by the pytest test whose
``PYTEST_CURRENT_TEST`` it inherited (a test's jobs, py-spy and CLI runs carry it; the xdist workers themselves
and Ray's workers started by a raylet do not, and are listed by command line).

    python scripts/cpu_by_test.py OUT.json STOPFILE &      # then run the tests; `touch STOPFILE` when they end

Writes ``{"total_cpu": <the machine's CPU-s over the run>, "by_test": {test: CPU-s}}``. A process that lives
less than a sample (0.5 s) is missed, and one that dies loses its CPU since its last sample: a lower bound. It
found what bounds the e2e tier on 2 cores (docs/design.md, "The e2e tier runs in parallel").
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
PREFIX = b"PYTEST_CURRENT_TEST="


def machine_cpu() -> float:
    """CPU-seconds the machine has spent busy since boot (all cores)."""
    with open("/proc/stat") as f:
        v = list(map(int, f.readline().split()[1:]))
    return (sum(v) - v[3] - v[4]) / TICK


def owner(pid: str) -> str:
    """The test a process belongs to, or ``(none) <its command line>``."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        for entry in f.read().split(b"\0"):
            if entry.startswith(PREFIX):
                return entry[len(PREFIX) :].decode(errors="replace").rsplit(" (", 1)[0]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return "(none) " + f.read().replace(b"\0", b" ")[:80].decode(errors="replace")


def main(out: str, stop: str) -> None:
    seen: dict[str, list] = {}  # pid -> [test, highest CPU-s seen, start time (tells a reused pid)]
    started = machine_cpu()
    while not os.path.exists(stop):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu, start = (int(fields[11]) + int(fields[12])) / TICK, fields[19]
                known = seen.get(pid)
                if known is None or known[2] != start:
                    seen[pid] = [owner(pid), cpu, start]
                else:
                    known[1] = max(known[1], cpu)
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
        time.sleep(0.5)
    by_test: collections.Counter[str] = collections.Counter()
    for test, cpu, _ in seen.values():
        by_test[test] += cpu
    with open(out, "w") as f:
        json.dump({"total_cpu": machine_cpu() - started, "by_test": dict(by_test.most_common())}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: cpu_by_test.py OUT.json STOPFILE")
    main(sys.argv[1], sys.argv[2])
