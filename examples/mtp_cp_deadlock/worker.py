"""A CPU reproducer of the verl MTP-loss deadlock with context parallelism (verl PR #5895).

Run under torchrun on the gloo backend. Each rank initialises real megatron-core model parallelism,
runs a toy training step (context-parallel attention, pipeline send/recv), saves an MTP loss into the
real ``MTPLossLoggingHelper`` tracker on the last pipeline stage (``avg_group`` = DP x CP, as
``GPTModel`` does), and then collects it behind a gate:

* ``--gate buggy``: verl 0.7.1's ``is_mp_src_rank_with_outputs()`` (tp == 0, last pp stage, cp == 0).
  With cp > 1 the cp > 0 ranks never join the all_reduce and the job hangs.
* ``--gate fixed``: verl 0.8.0's ``is_pipeline_last_stage()``; only the src rank writes the metric.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from mtpdiag.fix.verify.cpu_rank import prepare_cpu_rank

prepare_cpu_rank()  # before megatron-core: torch.compile at first call, one gloo device (cpu_rank.py)

from megatron.core import parallel_state as mpu  # noqa: E402
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--cp", type=int, default=2, help="context-parallel size")
    parser.add_argument("--pp", type=int, default=2, help="pipeline-parallel size")
    parser.add_argument("--gate", choices=["buggy", "fixed"], default="buggy")
    parser.add_argument("--steps", type=int, default=3, help="training steps before a clean exit")
    parser.add_argument(
        "--context-parallel-size", dest="cp", type=int, help="Megatron-LM spelling of --cp"
    )
    parser.add_argument(
        "--pipeline-model-parallel-size", dest="pp", type=int, help="Megatron-LM spelling of --pp"
    )
    parser.add_argument(
        "--tensor-model-parallel-size", dest="tp", type=int, help="Megatron-LM spelling of --tp"
    )
    return parser.parse_args(argv)


def is_mp_src_rank_with_outputs() -> bool:
    """verl's condition for the rank that owns the model outputs (tp 0, last stage, cp 0)."""
    return (
        mpu.get_tensor_model_parallel_rank() == 0
        and mpu.get_pipeline_model_parallel_rank() == mpu.get_pipeline_model_parallel_world_size() - 1
        and mpu.get_context_parallel_rank() == 0
    )


def ring_attention(hidden: torch.Tensor) -> torch.Tensor:
    """Context-parallel attention: every cp rank needs the other ranks' key/value shards."""
    shards = [torch.empty_like(hidden) for _ in range(mpu.get_context_parallel_world_size())]
    dist.all_gather(shards, hidden, group=mpu.get_context_parallel_group())
    return torch.stack(shards).mean(dim=0)


def recv_forward(like: torch.Tensor) -> torch.Tensor:
    """Pipeline p2p: receive activations from the previous stage."""
    buf = torch.empty_like(like)
    dist.recv(buf, src=mpu.get_pipeline_model_parallel_prev_rank())
    return buf


def send_forward(hidden: torch.Tensor) -> None:
    """Pipeline p2p: send activations to the next stage."""
    dist.send(hidden, dst=mpu.get_pipeline_model_parallel_next_rank())


def forward_step(step: int) -> torch.Tensor:
    """One forward pass through this rank's pipeline stage."""
    hidden = torch.full((4,), float(dist.get_rank() + step))
    if not mpu.is_pipeline_first_stage():
        hidden = recv_forward(hidden)
    hidden = ring_attention(hidden)
    if not mpu.is_pipeline_last_stage():
        send_forward(hidden)
    return hidden


def save_mtp_loss(hidden: torch.Tensor) -> None:  # noqa: ARG001 - GPTModel's call, as verl makes it
    """What GPTModel does on the last stage: add this rank's MTP loss to the tracker."""
    tracker = MTPLossLoggingHelper.tracker
    if "values" not in tracker:
        # save_loss_to_tracker would allocate on torch.cuda.current_device(); seed it on CPU.
        tracker["values"] = torch.zeros(1)
    loss = torch.tensor(float(dist.get_rank() + 1))
    MTPLossLoggingHelper.save_loss_to_tracker(
        loss,
        layer_number=0,
        num_layers=1,
        avg_group=mpu.get_data_parallel_group(with_context_parallel=True),
    )


def collect_mtp_loss(metrics: dict, gate: str) -> None:
    """verl's forward_backward_batch tail: collect the MTP loss, gated as the chosen engine does."""
    if gate == "buggy":
        if is_mp_src_rank_with_outputs():
            MTPLossLoggingHelper.reduce_loss_in_tracker()
            metrics["mtp_1_loss"] = MTPLossLoggingHelper.tracker["values"][0].item()
    else:
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            MTPLossLoggingHelper.reduce_loss_in_tracker()
            if is_mp_src_rank_with_outputs():
                metrics["mtp_1_loss"] = MTPLossLoggingHelper.tracker["values"][0].item()
    if "values" in MTPLossLoggingHelper.tracker:
        MTPLossLoggingHelper.clean_loss_in_tracker()


def train_step(step: int, gate: str) -> dict:
    metrics: dict = {}
    hidden = forward_step(step)
    if mpu.is_pipeline_last_stage():
        save_mtp_loss(hidden)
    collect_mtp_loss(metrics, gate)
    return metrics


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
    print(f"rank {rank} ({coords}) ready, gate={args.gate}", flush=True)
    for step in range(args.steps):
        metrics = train_step(step, args.gate)
        if metrics:
            print(f"rank {rank} step {step} {metrics}", flush=True)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    mpu.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
