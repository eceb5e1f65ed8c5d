"""``share_gloo_device``: the CPU worlds we start make every gloo group on one transport device, so each rank
runs one of gloo's 10 ms polling threads instead of one a group, and every group still carries its collectives.
Each case runs in a process of its own (one gloo world of one rank), as a rank of those worlds does."""

from __future__ import annotations

import subprocess
import sys

_WORLD = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
{before}
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
groups = [dist.new_group([0]) for _ in range(3)]
sums = []
for group in [None, *groups]:
    tensor = torch.ones(2)
    dist.all_reduce(tensor, group=group)
    sums.append(tensor.tolist())
{after}
names = [open(f"/proc/self/task/{{t}}/comm").read().strip() for t in os.listdir("/proc/self/task")]
loops = names.count("gloo_tcp_loop")
print(loops, sums)
"""


_SHARED = "from mtpdiag.fix.verify.gloo_device import share_gloo_device; share_gloo_device()"


def _world(tmp_path, before: str = "", after: str = "") -> str:
    result = subprocess.run(
        [sys.executable, "-c", _WORLD.format(before=before, after=after), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_torch_gives_each_gloo_group_a_polling_thread_and_shared_they_have_one(tmp_path):
    ones = "[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]"
    assert _world(tmp_path) == f"4 {ones}"  # the premise: the world's group and three more, a device each
    assert _world(tmp_path, before=_SHARED) == f"1 {ones}"


def test_a_group_built_directly_joins_the_same_device_and_reduces(tmp_path):
    direct = (
        "from mtpdiag.fix.verify.gloo_device import gloo_group\n"
        "direct = gloo_group(dist.PrefixStore('direct', dist.distributed_c10d._get_default_store()), 0, 1, "
        "timedelta(seconds=60))\n"
        "tensor = torch.full((2,), 3.0); direct.allreduce([tensor]).wait(); assert tensor.tolist() == [3.0, 3.0]"
    )
    assert _world(tmp_path, before=_SHARED, after=direct).startswith("1 ")
