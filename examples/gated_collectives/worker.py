"""CPU reproducers of common distributed-training hangs, one per ``--scenario``.

Run under torchrun on the gloo backend (4 ranks). Each rank initialises real megatron-core model
parallelism and runs a small training loop with one bug in it:

* ``tp-broadcast`` (tp 2, dp 2): ``broadcast_vocab_stats`` broadcasts only on tp rank 0; the other
  tp ranks skip it and wait in ``end_of_step_sync``'s world barrier.
* ``p2p-count`` (pp 2, dp 2): the first stage sends 3 microbatches forward, the last stage counts 2
  (it drops the incomplete one) and starts its backward sends: both stages block in ``send``.
* ``straggler`` (cp 2, dp 2): one rank never gets its data shard and sleeps in ``load_batch``; the
  others wait in the gradient all_reduce.
* ``healthy`` (dp 4): compute plus a gradient all_reduce, with no bug. SIGSTOP one rank to freeze it.
* ``tracker-loop`` (cp 2, pp 2): the job's own metric trackers, reduced over the pipeline group in a loop
  that first agrees a job-wide sample count over the world group; a tracker that only the last stage fills
  returns early on the first stage, which goes round the loop into the next count while the last stage
  waits in the tracker's all_reduce.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.distributed as dist

from mtpdiag.fix.verify.cpu_rank import prepare_cpu_rank

prepare_cpu_rank()  # before megatron-core: torch.compile at first call, one gloo device (cpu_rank.py)

from megatron.core import parallel_state as mpu  # noqa: E402

SCENARIOS = ("tp-broadcast", "p2p-count", "straggler", "healthy", "tracker-loop")
# Parallel sizes each scenario needs when none are given; dp is what remains of the world.
DEFAULT_SIZES = {
    "tp-broadcast": {"tp": 2, "cp": 1, "pp": 1},
    "p2p-count": {"tp": 1, "cp": 1, "pp": 2},
    "straggler": {"tp": 1, "cp": 2, "pp": 1},
    "healthy": {"tp": 1, "cp": 1, "pp": 1},
    "tracker-loop": {"tp": 1, "cp": 2, "pp": 2},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--tp", type=int, help="tensor-parallel size (default: the scenario's)")
    parser.add_argument("--cp", type=int, help="context-parallel size (default: the scenario's)")
    parser.add_argument("--pp", type=int, help="pipeline-parallel size (default: the scenario's)")
    parser.add_argument("--steps", type=int, default=3, help="training steps; 0 runs healthy forever")
    parser.add_argument("--log-every", type=int, default=50, help="healthy: print progress every N steps")
    parser.add_argument("--straggler-rank", type=int, default=3, help="straggler: the rank whose data stalls")
    args = parser.parse_args(argv)
    for name, size in DEFAULT_SIZES[args.scenario].items():
        if getattr(args, name) is None:
            setattr(args, name, size)
    return args


# ---------------------------------------------------------------- tp-broadcast


def broadcast_vocab_stats(stats: torch.Tensor) -> torch.Tensor:
    """Share the vocab statistics that tp rank 0 computed with the rest of its tensor-parallel group."""
    if mpu.get_tensor_model_parallel_rank() == 0:  # BUG: the receiving tp ranks must join the broadcast too
        dist.broadcast(stats, src=mpu.get_tensor_model_parallel_src_rank(),
                       group=mpu.get_tensor_model_parallel_group())
    return stats


def end_of_step_sync() -> None:
    """Every rank lines up before the next step (checkpointing, logging)."""
    dist.barrier()


def tp_broadcast_step(step: int) -> None:
    stats = torch.full((8,), float(step)) if mpu.get_tensor_model_parallel_rank() == 0 else torch.zeros(8)
    broadcast_vocab_stats(stats)
    end_of_step_sync()


# ---------------------------------------------------------------- p2p-count


def num_microbatches(samples: int, micro_batch_size: int, drop_last: bool) -> int:
    return samples // micro_batch_size if drop_last else math.ceil(samples / micro_batch_size)


def send_forward(activation: torch.Tensor) -> None:
    dist.send(activation, dst=mpu.get_pipeline_model_parallel_next_rank())


def recv_forward(like: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_like(like)
    dist.recv(buf, src=mpu.get_pipeline_model_parallel_prev_rank())
    return buf


def send_backward(grad: torch.Tensor) -> None:
    dist.send(grad, dst=mpu.get_pipeline_model_parallel_prev_rank())


def recv_backward(like: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_like(like)
    dist.recv(buf, src=mpu.get_pipeline_model_parallel_next_rank())
    return buf


def forward_backward_pipelining(samples: int = 5, micro_batch_size: int = 2) -> None:
    """All-forward then all-backward over two stages. The first stage reads tokens (keeps the short last
    microbatch); the last stage reads labels with drop_last (BUG): the stages disagree on the count."""
    activation = torch.ones(4)
    if mpu.is_pipeline_first_stage():
        count = num_microbatches(samples, micro_batch_size, drop_last=False)  # 3
        for _ in range(count):
            send_forward(activation)
        for _ in range(count):
            recv_backward(activation)
    else:
        count = num_microbatches(samples, micro_batch_size, drop_last=True)  # 2
        for _ in range(count):
            recv_forward(activation)
        for _ in range(count):
            send_backward(activation)


# ---------------------------------------------------------------- straggler and healthy


def shard_arrived(step: int, straggler_rank: int) -> bool:
    """Stands in for a data-loader read; the straggler's shard for step 1 never arrives."""
    return not (step == 1 and dist.get_rank() == straggler_rank)


def load_batch(step: int, straggler_rank: int) -> torch.Tensor:
    """Wait for this rank's data shard, then build the batch."""
    while not shard_arrived(step, straggler_rank):
        time.sleep(0.5)
    return torch.randn(64, 64)


def forward_backward(batch: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A few milliseconds of matmul standing in for the model; returns the weight's gradient."""
    hidden = batch
    for _ in range(4):
        hidden = torch.tanh(hidden @ weight)
    return hidden.T @ batch / batch.shape[0]


def reduce_gradients(grad: torch.Tensor) -> None:
    """Average gradients over the data-parallel (x context-parallel) replicas, as Megatron's DDP does."""
    dist.all_reduce(grad, group=mpu.get_data_parallel_group(with_context_parallel=True))
    grad /= mpu.get_data_parallel_world_size(with_context_parallel=True)


def train(args: argparse.Namespace) -> None:
    """straggler and healthy: load a batch, compute, reduce gradients; ``--steps 0`` runs forever."""
    weight = torch.randn(64, 64) / 8
    step = 0
    while args.steps == 0 or step < args.steps:
        straggler = args.straggler_rank if args.scenario == "straggler" else -1
        batch = load_batch(step, straggler)
        grad = forward_backward(batch, weight)
        reduce_gradients(grad)
        weight -= 0.01 * grad
        step += 1
        if step % args.log_every == 0:
            print(f"rank {dist.get_rank()} step {step} ok", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        context_parallel_size=args.cp,
    )
    rank = dist.get_rank()
    coords = (
        f"tp{mpu.get_tensor_model_parallel_rank()} cp{mpu.get_context_parallel_rank()} "
        f"dp{mpu.get_data_parallel_rank()} pp{mpu.get_pipeline_model_parallel_rank()}"
    )
    print(f"rank {rank} ({coords}) ready, scenario={args.scenario}", flush=True)
    if args.scenario in ("straggler", "healthy"):
        train(args)
    elif args.scenario == "tracker-loop":
        for step in range(args.steps):
            tracker_loop_step(step)
    else:
        for step in range(args.steps):
            if args.scenario == "tp-broadcast":
                tp_broadcast_step(step)
            else:
                forward_backward_pipelining()
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    mpu.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- tracker-loop


class MetricTracker:
    """A metric the layers of a stage add to, summed over the pipeline group when it is logged. A layer adds
    only to the trackers it knows, so a stage without such layers holds an empty one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.values: list[float] = []

    def reduce(self) -> torch.Tensor | None:
        if not self.values:  # BUG: a stage with nothing to report returns before its group's all_reduce
            return None
        total = torch.tensor([sum(self.values)])
        dist.all_reduce(total, group=mpu.get_pipeline_model_parallel_group())
        self.values.clear()
        return total


def sync_counts(samples: int) -> int:
    """The job-wide number of samples a metric is normalised by: an all_reduce over the world group."""
    total = torch.tensor([samples])
    dist.all_reduce(total)
    return int(total.item())


def log_metrics(trackers: list[MetricTracker], samples: int) -> None:
    """For each metric: the job-wide sample count, then the metric summed over the pipeline."""
    for tracker in trackers:
        seen = sync_counts(samples)
        total = tracker.reduce()
        if total is not None and dist.get_rank() == 0:
            print(f"{tracker.name}: {float(total) / seen:.4f}", flush=True)


TRACKERS = ("loss", "expert_load", "grad_norm")  # expert_load: only the last stage's (MoE) layers add to it


def tracker_loop_step(step: int) -> None:
    """A step's layers fill this stage's trackers; then the metrics are logged."""
    trackers = [MetricTracker(name) for name in TRACKERS]
    last = mpu.is_pipeline_last_stage()
    for tracker in trackers:
        if tracker.name != "expert_load" or last:
            tracker.values.append(0.1 * (step + 1))
    log_metrics(trackers, samples=8)


if __name__ == "__main__":
    sys.exit(main())
