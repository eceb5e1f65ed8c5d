"""The verl MTP + context-parallel deadlock (verl PR #5895) with NCCL's CPU-side behaviour, on CPU.

Run under torchrun. Each rank initialises real megatron-core model parallelism on the ``ncclcpu``
backend (``process_group.py``: ProcessGroupNCCL's behaviour over gloo) and runs the steps of verl's
Megatron engine: pipeline p2p (``batch_isend_irecv``) and context-parallel attention (an all_gather on
the CP group) for each microbatch, the MTP loss saved into megatron's real ``MTPLossLoggingHelper`` on
the last stage and collected behind a gate, then megatron's distributed-optimizer step. Collectives
only queue work on the rank's device stream (``device.py``); the host blocks at host syncs, which are
C calls: ``.cpu().item()`` after the MTP reduce, ``found_inf.item()`` in the optimizer, ``.item()`` in
the grad-norm.

* ``--gate buggy`` (verl 0.7.1, ``is_mp_src_rank_with_outputs()``): with cp > 1 only cp == 0 ranks
  reduce the MTP loss; the cp > 0 ranks go on into the optimizer. Within the DP x CP group, sequence
  number k is the MTP all_reduce on one rank and the gradient reduce-scatter on the other. The device
  streams stall, every host waits at its next sync, the watchdog times out after ``--timeout-s``,
  every rank writes its Flight Recorder dump and aborts (``--no-abort`` keeps it hung).
* ``--gate fixed`` (verl 0.8.0) or ``--healthy`` (fixed gate, endless): no hang. Each step keeps the
  device busy for ``--device-step-s`` while the host waits at its first sync and the collectives keep
  completing, so the Flight Recorder's sequence numbers move while the main thread stays on one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from mtpdiag.fix.verify.cpu_rank import prepare_cpu_rank

prepare_cpu_rank()  # before megatron-core: torch.compile at first call, one gloo device (cpu_rank.py)

from megatron.core import parallel_state as mpu  # noqa: E402
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper  # noqa: E402

import process_group
import watchdog
from device import SYNC_MODES, Stream, current_stream, report_step

HERE = Path(__file__).resolve().parent
HIDDEN = 8


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The gate and the tracker use of the gloo reproducer, unchanged.
MTP = _load("mtp_cp_deadlock_worker", HERE.parent / "mtp_cp_deadlock" / "worker.py")
is_mp_src_rank_with_outputs = MTP.is_mp_src_rank_with_outputs


def _sync_modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(","))
    bad = [m for m in modes if m not in SYNC_MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"{bad[0] if bad else text!r} is not one of {', '.join(SYNC_MODES)}")
    return modes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--cp", type=int, default=2, help="context-parallel size")
    parser.add_argument("--pp", type=int, default=2, help="pipeline-parallel size")
    parser.add_argument("--tensor-model-parallel-size", dest="tp", type=int, help="Megatron-LM spelling of --tp")
    parser.add_argument("--context-parallel-size", dest="cp", type=int, help="Megatron-LM spelling of --cp")
    parser.add_argument("--pipeline-model-parallel-size", dest="pp", type=int, help="Megatron-LM spelling of --pp")
    parser.add_argument("--gate", choices=["buggy", "fixed"], default="buggy")
    parser.add_argument("--healthy", action="store_true", help="the fixed gate, forever (same as --gate fixed --steps 0)")
    parser.add_argument("--steps", type=int, default=3, help="training steps; 0 runs forever")
    parser.add_argument("--sync", type=_sync_modes, default=("spin",),
                        help="how a host sync waits: spin (CUDA's default), poll (1 ms sleeps) or futex (blocking); "
                             "a comma-separated list gives rank i the i-th mode (the last one for the rest)")
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="the process groups' timeout, after which the watchdog dumps and aborts (NCCL: 10 min)")
    parser.add_argument("--no-abort", action="store_true", help="after the watchdog's dump, stay hung instead of aborting")
    parser.add_argument("--lazy-init", action="store_true", help="create each communicator on its group's first op, blocking the CPU until every member gets there (NCCL's default); by default they are created with the groups")
    parser.add_argument("--device-step-s", type=float, default=3.0, help="device compute per training step")
    parser.add_argument("--pause-at-step", type=int, default=None, help="after this step, every rank pauses as for a checkpoint write (--pause-s)")
    parser.add_argument("--pause-s", type=float, default=40.0, help="how long the --pause-at-step pause lasts")
    parser.add_argument("--microbatches", type=int, default=3, help="microbatches per step")
    args = parser.parse_args(argv)
    if args.healthy:
        args.gate, args.steps = "fixed", 0
    return args


# ---------------------------------------------------------------- the forward/backward schedule


def _batched_p2p_ops(*, send_prev=None, recv_prev=None, send_next=None, recv_next=None) -> list:
    """megatron's p2p_communication._batched_p2p_ops: one batch_isend_irecv on the pipeline group."""
    group = mpu.get_pipeline_model_parallel_group()
    ops = []
    if send_prev is not None:
        ops.append(dist.P2POp(dist.isend, send_prev, mpu.get_pipeline_model_parallel_prev_rank(), group))
    if recv_prev is not None:
        ops.append(dist.P2POp(dist.irecv, recv_prev, mpu.get_pipeline_model_parallel_prev_rank(), group))
    if send_next is not None:
        ops.append(dist.P2POp(dist.isend, send_next, mpu.get_pipeline_model_parallel_next_rank(), group))
    if recv_next is not None:
        ops.append(dist.P2POp(dist.irecv, recv_next, mpu.get_pipeline_model_parallel_next_rank(), group))
    return dist.batch_isend_irecv(ops) if ops else []


def recv_forward(like: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_like(like)
    for req in _batched_p2p_ops(recv_prev=buf):
        req.wait()  # orders the stream after the recv; the host goes on (NCCL)
    return buf


def send_forward(hidden: torch.Tensor) -> None:
    for req in _batched_p2p_ops(send_next=hidden):
        req.wait()


def recv_backward(like: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_like(like)
    for req in _batched_p2p_ops(recv_next=buf):
        req.wait()
    return buf


def send_backward(grad: torch.Tensor) -> None:
    for req in _batched_p2p_ops(send_prev=grad):
        req.wait()


def ring_attention(hidden: torch.Tensor, stream: Stream) -> torch.Tensor:
    """Context-parallel attention: all_gather the other cp ranks' key/value shards, then attend (a kernel)."""
    shards = [torch.empty_like(hidden) for _ in range(mpu.get_context_parallel_world_size())]
    handle = dist.all_gather(shards, hidden, group=mpu.get_context_parallel_group(), async_op=True)
    handle.wait()
    out = torch.empty_like(hidden)
    stream.launch(lambda: torch.mean(torch.stack(shards), dim=0, out=out))
    return out


def forward_backward_batch(step: int, args: argparse.Namespace, stream: Stream) -> None:
    """megatron's forward_backward_no_pipelining/pipelining, as verl's engine calls it: all forward
    passes, then all backward passes, each a compute kernel plus its communication."""
    kernel_s = args.device_step_s / (2 * args.microbatches)
    for mb in range(args.microbatches):
        hidden = torch.full((HIDDEN,), float(dist.get_rank() + step + mb))
        if not mpu.is_pipeline_first_stage():
            hidden = recv_forward(hidden)
        stream.kernel(kernel_s)
        hidden = ring_attention(hidden, stream)
        if not mpu.is_pipeline_last_stage():
            send_forward(hidden)
        elif mb == 0:
            save_mtp_loss(hidden, stream)
    for _ in range(args.microbatches):
        grad = torch.ones(HIDDEN) if mpu.is_pipeline_last_stage() else recv_backward(torch.ones(HIDDEN))
        stream.kernel(kernel_s)
        if not mpu.is_pipeline_first_stage():
            send_backward(grad)


def save_mtp_loss(hidden: torch.Tensor, stream: Stream) -> None:
    """GPTModel's MTP loss into megatron's tracker; its values tensor lives "on the device"."""
    tracker = MTPLossLoggingHelper.tracker
    if "values" not in tracker:
        tracker["values"] = stream.on_device(torch.zeros(1))
    MTP.save_mtp_loss(hidden)


def collect_mtp_loss(metrics: dict, gate: str) -> None:
    """verl's forward_backward_batch tail: reduce the MTP loss (gated as the chosen engine does) and read it."""
    if gate == "buggy":
        if is_mp_src_rank_with_outputs():
            MTPLossLoggingHelper.reduce_loss_in_tracker()
            metrics["mtp_1_loss"] = MTPLossLoggingHelper.tracker["values"].cpu().item()
    else:
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            MTPLossLoggingHelper.reduce_loss_in_tracker()
            if is_mp_src_rank_with_outputs():
                metrics["mtp_1_loss"] = MTPLossLoggingHelper.tracker["values"].cpu().item()
    if "values" in MTPLossLoggingHelper.tracker:
        MTPLossLoggingHelper.clean_loss_in_tracker()


# ---------------------------------------------------------------- megatron's distributed optimizer


def get_grad_norm_fp32(grads: list[torch.Tensor], grad_stats_parallel_group, stream: Stream, norm_type: float = 2.0):
    """megatron/core/optimizer/clip_grads.py get_grad_norm_fp32, for the L2 norm."""
    total_norm = stream.on_device(sum(torch.norm(g, norm_type) ** norm_type for g in grads).reshape(1))
    torch.distributed.all_reduce(total_norm, op=torch.distributed.ReduceOp.SUM, group=grad_stats_parallel_group)
    total_norm = total_norm.item() ** (1.0 / norm_type)
    return total_norm


class DistributedOptimizer:
    """What megatron-core's DDP and DistributedOptimizer communicate per step, on their groups:
    the gradient reduce-scatter and parameter all-gather over the DDP's intra-instance group (DP x CP),
    and the grad-stats all_reduces over ``get_intra_distributed_optimizer_instance_group()`` (the whole
    world with one optimizer instance)."""

    def __init__(self, stream: Stream, shard_numel: int = 16):
        self.stream = stream
        self.dp_cp = mpu.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
        self.grad_stats_parallel_group = mpu.get_intra_distributed_optimizer_instance_group()
        size = dist.get_world_size(self.dp_cp)
        self.grad_buffer = torch.ones(shard_numel * size)
        self.main_grad = torch.zeros(shard_numel)
        self.param_buffer = torch.zeros(shard_numel * size)
        self.main_param = torch.zeros(shard_numel)
        self.found_inf = stream.on_device(torch.zeros(1))

    def finish_grad_sync(self) -> None:
        """param_and_grad_buffer.start_grad_sync: reduce-scatter the grads (NCCL: _reduce_scatter_base)."""
        handle = dist.reduce_scatter_tensor(self.main_grad, self.grad_buffer, group=self.dp_cp, async_op=True)
        handle.wait()

    def _unscale_main_grads_and_check_for_nan(self) -> bool:
        """megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer."""
        self.found_inf.fill_(0.0)
        torch.distributed.all_reduce(
            self.found_inf, op=torch.distributed.ReduceOp.MAX, group=self.grad_stats_parallel_group
        )
        found_inf_flag = self.found_inf.item() > 0
        return found_inf_flag

    def start_param_sync(self) -> None:
        """param_and_grad_buffer.start_param_sync: all-gather the updated params (NCCL: _all_gather_base)."""
        handle = dist.all_gather_into_tensor(self.param_buffer, self.main_param, group=self.dp_cp, async_op=True)
        handle.wait()

    def step(self) -> tuple[bool, float]:
        self.finish_grad_sync()
        found_inf_flag = self._unscale_main_grads_and_check_for_nan()
        grad_norm = get_grad_norm_fp32([self.main_grad], self.grad_stats_parallel_group, self.stream)
        self.main_param -= 0.01 * self.main_grad
        self.start_param_sync()
        return found_inf_flag, grad_norm


# ---------------------------------------------------------------- the job


def train_step(step: int, args: argparse.Namespace, stream: Stream, optimizer: DistributedOptimizer) -> dict:
    metrics: dict = {}
    forward_backward_batch(step, args, stream)
    collect_mtp_loss(metrics, args.gate)
    found_inf, grad_norm = optimizer.step()
    metrics["grad_norm"] = round(grad_norm, 4)
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    watchdog.ABORT = not args.no_abort
    process_group.EAGER_INIT = not args.lazy_init
    rank_env = int(os.environ.get("RANK", "0"))
    sync = args.sync[min(rank_env, len(args.sync) - 1)]
    stream = current_stream(sync)
    process_group.register()
    dist.init_process_group(process_group.BACKEND, timeout=timedelta(seconds=args.timeout_s))
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        context_parallel_size=args.cp,
        distributed_timeout_minutes=args.timeout_s / 60.0,
    )
    dist.barrier()  # the world communicator is created here (NCCL creates it on a group's first op)
    rank = dist.get_rank()
    coords = (f"tp{mpu.get_tensor_model_parallel_rank()} cp{mpu.get_context_parallel_rank()} "
              f"dp{mpu.get_data_parallel_rank()} pp{mpu.get_pipeline_model_parallel_rank()}")
    print(f"rank {rank} ({coords}) ready, gate={args.gate} sync={sync}", flush=True)
    optimizer = DistributedOptimizer(stream)
    step = 0
    while args.steps == 0 or step < args.steps:
        metrics = train_step(step, args, stream, optimizer)
        report_step(rank, step, metrics, args.pause_at_step, args.pause_s)  # its line, then a checkpoint's pause
        step += 1
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    mpu.destroy_model_parallel()
    process_group.destroy()  # the emulated watchdog and stream end first
    return 0


if __name__ == "__main__":
    sys.exit(main())
