"""``mtpdiag.jobs`` on real processes (the helpers that the demo, ``verify`` and the e2e tests start jobs with)."""

from __future__ import annotations

import os
import subprocess
import sys

from mtpdiag.jobs import Job


def test_workers_come_back_in_rank_order_whatever_the_pid_order():
    """A CI run got ranks 0, 3, 1, 2: the ranks were read between fork and exec, from the agent's env."""
    ranks = [2, 0, 3, 1]  # started in this order, so the pids do not follow the ranks
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 env={**os.environ, "RANK": str(r), "WORLD_SIZE": "4"}) for r in ranks]
    try:
        pids = [c.pid for c in children]
        in_order = Job._in_rank_order(pids)
        assert in_order == [children[ranks.index(r)].pid for r in range(4)]
    finally:
        for child in children:
            child.kill()
            child.wait()
