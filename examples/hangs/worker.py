"""CPU reproducers of hangs that are not a plain "some ranks skipped a collective", one per ``--scenario``.

Run under torchrun on gloo with 4 ranks. Each rank prints ``rank R hung: <where>`` just before it
starts to wait for good, and stays hung.

* ``side-thread``: ZeRO-3 style. Each rank's main thread waits, in C, for its "autograd" side thread
  (``results.get()`` on a ``queue.SimpleQueue``, like ``loss.backward()``); the side threads all-gather
  a parameter, except on rank 0, whose cache says it is already gathered: it goes on to the gradient
  reduce-scatter. The side threads of ranks 1-3 wait in ``all_gather_into_tensor``, rank 0's in
  ``reduce_scatter_tensor``.
* ``lock-wait``: rank 1's checkpoint thread holds the metrics lock while it waits for storage that
  never answers; rank 1's main thread blocks in ``with METRICS_LOCK:`` (``Lock.acquire``, a C call),
  the other ranks in the step's ``all_reduce``.
* ``data-loader``: a real ``DataLoader`` with worker processes; on rank 2, sample 5 never loads (the
  worker stalls), so rank 2's main thread waits for its batch while the others wait in the
  gradient ``all_reduce``.
* ``unreadable``: rank 3 is traced by a helper process of its own (``PTRACE_SEIZE``), so py-spy cannot
  attach to it; it stalls in its data wait while the others wait for it in the ``all_reduce``.
* ``comm-init``: ranks 0-2 create a new process group (gloo connects its members in ``new_group``);
  rank 3 never gets there: it waits in a world ``barrier`` first.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

SCENARIOS = ("side-thread", "lock-wait", "data-loader", "unreadable", "comm-init")
FOREVER = 10**6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--steps", type=int, default=3, help="healthy steps before the hang")
    return parser.parse_args(argv)


def hung(where: str) -> None:
    print(f"rank {dist.get_rank()} hung: {where}", flush=True)


def reduce_gradients(grad: torch.Tensor) -> None:
    """Average gradients over the data-parallel replicas."""
    dist.all_reduce(grad)
    grad /= dist.get_world_size()


# ---------------------------------------------------------------- side-thread (ZeRO-3 prefetch)


def fetch_params(shard: torch.Tensor, gathered_cache: bool) -> torch.Tensor:
    """ZeRO-3's pre-forward/backward hook: all-gather the partitioned parameter unless cached."""
    full = torch.empty(shard.numel() * dist.get_world_size())
    if not gathered_cache:  # BUG: the cache is per rank; the all-gather is collective
        dist.all_gather_into_tensor(full, shard)
    return full


def reduce_scatter_grads(grad: torch.Tensor) -> torch.Tensor:
    """ZeRO's gradient partitioning: reduce-scatter the gradient."""
    out = torch.empty(grad.numel() // dist.get_world_size())
    dist.reduce_scatter_tensor(out, grad)
    return out


def autograd_thread(results: queue.SimpleQueue, step: int) -> None:
    """The backward pass on an engine thread: fetch the layer's params, compute, partition the grads."""
    full = fetch_params(torch.ones(4), gathered_cache=(step >= 1 and dist.get_rank() == 0))
    results.put(reduce_scatter_grads(full * 2))


def backward(step: int) -> torch.Tensor:
    """Like loss.backward(): hand the work to the engine's thread and wait for it in C."""
    results: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=autograd_thread, args=(results, step), name="autograd-engine", daemon=True).start()
    if step >= 1:
        hung("main thread in results.get() (C), side thread in a collective")
    grads = results.get()
    return grads


def side_thread(args: argparse.Namespace) -> None:
    for step in range(args.steps):
        backward(step)


# ---------------------------------------------------------------- lock-wait


METRICS_LOCK = threading.Lock()


def storage_ready() -> bool:
    """Stands in for a checkpoint storage that stopped answering on rank 1."""
    return dist.get_rank() != 1


def checkpoint_thread(started: threading.Event) -> None:
    """Writes a checkpoint while holding the metrics lock (so no metrics interleave with it)."""
    with METRICS_LOCK:
        started.set()
        while not storage_ready():
            time.sleep(1)


def log_metrics(step: int, loss: float) -> None:
    with METRICS_LOCK:
        print(f"rank {dist.get_rank()} step {step} loss {loss:.3f}", flush=True)


def lock_wait(args: argparse.Namespace) -> None:
    grad = torch.ones(8)
    for step in range(args.steps):
        reduce_gradients(grad)
        log_metrics(step, float(grad.sum()))
    started = threading.Event()
    threading.Thread(target=checkpoint_thread, args=(started,), name="checkpoint-writer", daemon=True).start()
    started.wait()
    hung("rank 1: main thread in Lock.acquire (with METRICS_LOCK); others: all_reduce")
    for step in range(args.steps, args.steps + 2):
        log_metrics(step, float(grad.sum()))
        reduce_gradients(grad)


# ---------------------------------------------------------------- data-loader


class TokenDataset(Dataset):
    """Each sample is read from storage; on rank 2, sample 5 never arrives (its read blocks)."""

    def __init__(self, rank: int):
        self.rank = rank

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == 2 and index == 5:
            time.sleep(FOREVER)
        return torch.full((8,), float(index))


def data_loader(args: argparse.Namespace) -> None:  # noqa: ARG001 - every scenario takes the args
    loader = DataLoader(TokenDataset(dist.get_rank()), batch_size=2, num_workers=1, timeout=0)
    grad = torch.zeros(8)
    for step, batch in enumerate(loader):
        grad += batch.sum(dim=0)
        if step == 1:
            hung("rank 2: waiting for its DataLoader batch; others: all_reduce")
        reduce_gradients(grad)


# ---------------------------------------------------------------- unreadable


PTRACE_SEIZE = 0x4206


def trace_me() -> int:
    """Fork a helper that PTRACE_SEIZEs this process and stays: any other tracer, py-spy's attach
    included, is then refused (one tracer per process). SEIZE does not stop the tracee."""
    parent = os.getpid()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.ptrace(PTRACE_SEIZE, parent, None, None) == 0
        os.write(ready_w, b"1" if ok else b"0")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(FOREVER)
    os.close(ready_w)
    if os.read(ready_r, 1) != b"1":
        print(f"rank {dist.get_rank()}: the tracer could not attach", file=sys.stderr, flush=True)
    os.close(ready_r)
    return pid


def shard_ready(step: int) -> bool:
    return not (step == 1 and dist.get_rank() == 3)


def unreadable(args: argparse.Namespace) -> None:
    if dist.get_rank() == 3:
        trace_me()
    grad = torch.ones(8)
    for step in range(args.steps):
        if step == 1:
            hung("rank 3: traced by its own helper, waiting for its shard; others: all_reduce")
        while not shard_ready(step):
            time.sleep(1)
        reduce_gradients(grad)


# ---------------------------------------------------------------- comm-init


def comm_init(args: argparse.Namespace) -> None:  # noqa: ARG001 - every scenario takes the args
    grad = torch.ones(8)
    reduce_gradients(grad)
    if dist.get_rank() == 3:
        hung("rank 3: world barrier before it creates the group")
        dist.barrier()  # BUG: rank 3 syncs before new_group, the others create the group first
    else:
        hung("ranks 0-2: new_group connecting its members")
    group = dist.new_group(list(range(dist.get_world_size())), group_desc="EXPERT_GROUP")
    dist.all_reduce(grad, group=group)
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} ready, scenario={args.scenario}", flush=True)
    {"side-thread": side_thread, "lock-wait": lock_wait, "data-loader": data_loader,
     "unreadable": unreadable, "comm-init": comm_init}[args.scenario](args)
    dist.barrier()
    print(f"rank {dist.get_rank()} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
