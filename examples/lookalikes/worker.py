"""Hangs that look like the verl MTP/CP deadlock but are not it, one per ``--scenario``, on CPU.

Run under torchrun with 4 ranks (tp 1, cp 2, pp 2 by default: the layout of the verl MTP/CP hang).
Each rank initialises real megatron-core model parallelism and runs Megatron-LM's iteration: a
``train_step`` (pipeline p2p and context-parallel attention per microbatch, the per-layer losses saved
into megatron-core's own trackers by the layers the stage holds, then the distributed optimizer) and a
``training_log`` that reduces those trackers with megatron-core 0.16.1's own functions. In every
scenario a metric tracker's collective on the *pipeline* group hangs, never one on DP x CP:

* ``dsa-indexer`` (Megatron-LM #4745): only the last stage holds sparse-attention (DSA) layers, so only
  its ranks save an indexer loss. ``DSAIndexerLossLoggingHelper.reduce_loss_in_tracker`` returns early
  on an empty tracker: the first stage skips its pipeline all_reduce, the last stage waits in it.
* ``moe-lazy-tracker`` (Megatron-LM #1444/#2418, NeMo-RL #3419): only the last stage holds MoE layers;
  the aux-loss tracker is created lazily by the router, and ``track_moe_metrics`` without
  ``force_initialize`` reduces only the names a rank's own tracker holds: the first stage issues no
  pipeline all_reduce, the last stage waits in ``reduce_aux_losses_tracker_across_ranks``.
* ``aux-loss-sizes`` (Megatron-LM #3400/#3401; NCCL-behaviour mode only): MTP + MoE + PP. The router
  sizes the tracker ``num_layers + mtp_num_layers`` (15) on the stage with MoE layers;
  ``track_moe_metrics(force_initialize=True)`` sizes it ``num_layers`` (14) on the stage without.
  Every rank enters the pipeline all_reduce, with 14 elements on one stage and 15 on the other.

``--mode gloo``: collectives block where they are called, so the ranks end inside them.
``--mode nccl``: the ``ncclcpu`` backend of ``examples/nccl_behaviour`` (imported, not copied): the
collectives only queue work, the hosts run on to their next host sync, and after ``--timeout-s`` the
watchdog logs, every rank writes its Flight Recorder dump, and the job aborts (``--no-abort`` keeps it).

``--step-sync`` adds the job's own end-of-step check after ``training_log``: an all_reduce over the world
group at a call site of the job (Megatron-LM's ``--exit-duration-in-mins`` check). With ``dsa-indexer``
and ``--log-interval 10``, the first stage returns early from the indexer's reduce and waits there, a
later line of ``main``, while the last stage waits in the indexer's pipeline all_reduce.

``--fixed`` runs the same job with the tracker made the same on every stage (what the upstream fixes
do), to show that the bug, not the harness, hangs it: it finishes ``--steps`` iterations and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from mtpdiag.fix.verify.cpu_rank import prepare_cpu_rank

prepare_cpu_rank()  # before megatron-core: torch.compile at first call, one gloo device (cpu_rank.py)

from megatron.core import parallel_state as mpu  # noqa: E402
from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper  # noqa: E402
from megatron.core.transformer.moe import moe_utils  # noqa: E402
from megatron.core.transformer.moe.moe_utils import (  # noqa: E402
    get_moe_layer_wise_logging_tracker,
    save_to_aux_losses_tracker,
    track_moe_metrics,
)
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper  # noqa: E402

HERE = Path(__file__).resolve().parent
NCCL_BEHAVIOUR = HERE.parent / "nccl_behaviour"
sys.path.insert(0, str(NCCL_BEHAVIOUR))

import process_group  # noqa: E402 - examples/nccl_behaviour: the ncclcpu backend
import watchdog  # noqa: E402
from device import SYNC_MODES, current_stream  # noqa: E402

SCENARIOS = ("dsa-indexer", "moe-lazy-tracker", "aux-loss-sizes")
MODES = ("gloo", "nccl")
AUX_LOSS = "load_balancing_loss"  # the router's tracker name for moe_router_load_balancing_type=aux_loss


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The NCCL-behaviour reproducer's engine pieces: pipeline p2p (megatron's _batched_p2p_ops), ring
# attention on the CP group, and megatron's distributed optimizer (reduce-scatter on DP x CP, found_inf
# and grad-norm all_reduces with their host reads).
ENGINE = _load("nccl_behaviour_worker", NCCL_BEHAVIOUR / "worker.py")


@dataclass(frozen=True)
class Model:
    """What each layer of the model is. Layer numbers are 1-based, as megatron's ``layer_number``."""

    num_layers: int
    moe_layer_freq: tuple[int, ...] = ()  # 1 = MoE layer (megatron's --moe-layer-freq as a list)
    dsa_layers: tuple[int, ...] = ()      # layers with DeepSeek sparse attention (an indexer)
    mtp_num_layers: int | None = None     # MTP layers after the last decoder layer (an MoE layer each)

    def stage_layers(self, stage: int, stages: int) -> range:
        """The decoder layers of a pipeline stage: megatron's even split."""
        per_stage = self.num_layers // stages
        return range(stage * per_stage + 1, (stage + 1) * per_stage + 1)

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layer_freq) and (layer > self.num_layers or bool(self.moe_layer_freq[layer - 1]))


MODELS = {
    # a hybrid model whose first stage has dense attention only; the indexers are on the last stage
    "dsa-indexer": Model(num_layers=4, dsa_layers=(3, 4)),
    # #1444's shape: the first stage holds only dense layers
    "moe-lazy-tracker": Model(num_layers=4, moe_layer_freq=(0, 0, 1, 1)),
    # #3400's numbers: 14 layers, the first 7 (stage 0) dense, and one MTP layer
    "aux-loss-sizes": Model(num_layers=14, moe_layer_freq=(0,) * 7 + (1,) * 7, mtp_num_layers=1),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--mode", choices=MODES, default="gloo",
                        help="gloo (collectives block) or nccl (the ncclcpu backend: NCCL's CPU-side behaviour)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--cp", type=int, default=2, help="context-parallel size")
    parser.add_argument("--pp", type=int, default=2, help="pipeline-parallel size")
    parser.add_argument("--tensor-model-parallel-size", dest="tp", type=int, help="Megatron-LM spelling of --tp")
    parser.add_argument("--context-parallel-size", dest="cp", type=int, help="Megatron-LM spelling of --cp")
    parser.add_argument("--pipeline-model-parallel-size", dest="pp", type=int, help="Megatron-LM spelling of --pp")
    parser.add_argument("--fixed", action="store_true", help="every stage holds the same tracker: no hang")
    parser.add_argument("--steps", type=int, default=3, help="iterations (the bug hangs the first)")
    parser.add_argument("--log-interval", type=int, default=1,
                        help="Megatron-LM's --log-interval: on a logging iteration training_log waits in the "
                             "world barrier of timers('interval-time').elapsed(barrier=True)")
    parser.add_argument("--microbatches", type=int, default=2, help="microbatches per iteration")
    parser.add_argument("--device-step-s", type=float, default=0.4, help="device compute per iteration")
    parser.add_argument("--sync", choices=SYNC_MODES, default="spin", help="nccl mode: how a host sync waits")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="nccl mode: the groups' watchdog timeout")
    parser.add_argument("--no-abort", action="store_true", help="nccl mode: stay hung after the watchdog's dumps")
    parser.add_argument("--step-sync", action="store_true",
                        help="after training_log, the job's own step_sync: an all_reduce over the world group")
    args = parser.parse_args(argv)
    if args.scenario == "aux-loss-sizes" and args.mode == "gloo":
        parser.error("aux-loss-sizes needs --mode nccl: gloo itself fails on unequal all_reduce sizes "
                     "(gloo::EnforceNotMet on the smaller rank) instead of hanging")
    if args.step_sync and args.mode != "gloo":
        parser.error("--step-sync is a gloo-mode option: its flag is a host tensor")
    return args


# ---------------------------------------------------------------- the device


class HostDevice:
    """gloo mode: the host is the device. Collectives block where they are called; reads return at once."""

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def kernel(self, seconds: float) -> None:
        time.sleep(seconds)

    def launch(self, run, on_done=None) -> None:
        run()
        if on_done is not None:
            on_done()


class TorchOnDevice:
    """Stands for ``torch`` inside one megatron-core module for the length of a call: ``torch.zeros(...,
    device="cuda")`` (``track_moe_metrics``' ``force_initialize``) makes the tensor, with the size megatron
    chose, on the emulated device; every other name is torch's own, so no frame of ours is on a stack."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def zeros(self, *args, device=None, **kwargs) -> torch.Tensor:
        if device is not None and torch.device(device).type == "cuda":
            return self._device.on_device(torch.zeros(*args, **kwargs))
        return torch.zeros(*args, device=device, **kwargs)


@contextlib.contextmanager
def cuda_on_device(module, device) -> Iterator[None]:
    """``module``'s ``torch`` is a ``TorchOnDevice`` inside the block."""
    saved = module.torch
    module.torch = TorchOnDevice(device)
    try:
        yield
    finally:
        module.torch = saved


# ---------------------------------------------------------------- the layers' losses


def save_layer_losses(model: Model, layer: int, device) -> None:
    """What a layer's forward saves into megatron-core's trackers (megatron-core 0.16.1 call sites)."""
    if layer in model.dsa_layers:
        # dsa.py: DSAIndexerLossLoggingHelper.save_loss_to_tracker(loss=indexer_loss,
        # layer_number=self.layer_number, num_layers=self.config.num_layers); the tracker is seeded on the
        # device first, as save_loss_to_tracker would allocate on torch.cuda.current_device()
        tracker = DSAIndexerLossLoggingHelper.tracker
        if "values" not in tracker:
            tracker["values"] = device.on_device(torch.zeros(model.num_layers))
        DSAIndexerLossLoggingHelper.save_loss_to_tracker(loss=torch.tensor(0.01 * layer), layer_number=layer,
                                                         num_layers=model.num_layers)
    if model.is_moe(layer):
        # router.py, attach_and_log_load_balancing_loss: num_layers = config.num_layers (+ mtp_num_layers),
        # reduce_group = the router's tp_cp_group; save_to_aux_losses_tracker allocates on loss.device
        num_layers = model.num_layers + (model.mtp_num_layers or 0)
        tracker = get_moe_layer_wise_logging_tracker()
        created = AUX_LOSS not in tracker
        save_to_aux_losses_tracker(AUX_LOSS, torch.tensor(0.1 * layer), layer, num_layers,
                                   reduce_group=mpu.get_tensor_and_context_parallel_group())
        if created:
            device.on_device(tracker[AUX_LOSS]["values"])


def save_mtp_loss(model: Model, device) -> None:
    """The MTP layer on the last stage: its MTP loss (DP x CP avg_group, as GPTModel passes it) and its
    router's aux loss (the MTP layer is an MoE layer, numbered after the decoder layers)."""
    tracker = MTPLossLoggingHelper.tracker
    if "values" not in tracker:
        tracker["values"] = device.on_device(torch.zeros(model.mtp_num_layers))
    MTPLossLoggingHelper.save_loss_to_tracker(torch.tensor(0.5), layer_number=0, num_layers=model.mtp_num_layers,
                                              avg_group=mpu.get_data_parallel_group(with_context_parallel=True))
    save_layer_losses(model, model.num_layers + 1, device)


# ---------------------------------------------------------------- Megatron-LM's iteration


def forward_backward(iteration: int, model: Model, args: argparse.Namespace, device) -> None:
    """forward_backward_pipelining_without_interleaving, reduced to its communication: every forward
    (receive from the previous stage, attention over the CP group, the stage's layers, send on), then
    every backward."""
    stage, stages = mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()
    kernel_s = args.device_step_s / (2 * args.microbatches)
    for mb in range(args.microbatches):
        hidden = torch.full((ENGINE.HIDDEN,), float(dist.get_rank() + iteration + mb))
        if not mpu.is_pipeline_first_stage():
            hidden = ENGINE.recv_forward(hidden)
        device.kernel(kernel_s)
        hidden = ENGINE.ring_attention(hidden, device)
        for layer in model.stage_layers(stage, stages):
            save_layer_losses(model, layer, device)
        if not mpu.is_pipeline_last_stage():
            ENGINE.send_forward(hidden)
        elif model.mtp_num_layers:
            save_mtp_loss(model, device)
    for _ in range(args.microbatches):
        grad = torch.ones(ENGINE.HIDDEN)
        if not mpu.is_pipeline_last_stage():
            grad = ENGINE.recv_backward(grad)
        device.kernel(kernel_s)
        if not mpu.is_pipeline_first_stage():
            ENGINE.send_backward(grad)


def train_step(iteration: int, model: Model, args: argparse.Namespace, device, optimizer) -> float:
    forward_backward(iteration, model, args, device)
    _found_inf, grad_norm = optimizer.step()
    return grad_norm


def fix_trackers(scenario: str, model: Model, device) -> None:
    """--fixed: every stage holds the same tracker before training_log reduces it."""
    if scenario == "dsa-indexer" and "values" not in DSAIndexerLossLoggingHelper.tracker:
        # Megatron-LM #4518: every stage reduces, empty or not, with an agreed size
        DSAIndexerLossLoggingHelper.tracker["values"] = device.on_device(torch.zeros(model.num_layers))


def track_moe(scenario: str, model: Model, args: argparse.Namespace, device, iteration: int,
              total_loss_dict: dict) -> None:
    """training_log's call of megatron-core's track_moe_metrics, as the scenario's caller makes it."""
    common = dict(loss_scale=1 / args.microbatches, iteration=iteration, writer=None,
                  total_loss_dict=total_loss_dict, num_layers=model.num_layers,
                  moe_layer_freq=list(model.moe_layer_freq), mtp_num_layers=model.mtp_num_layers)
    if scenario == "moe-lazy-tracker" and not args.fixed:
        # Megatron-LM before #1444's fix (and NeMo-RL's get_moe_metrics before #3419): no force_initialize,
        # so each rank reduces the names its own, lazily created tracker holds
        track_moe_metrics(**common)
        return
    if scenario == "aux-loss-sizes" and args.fixed:
        # #3400/#3401: the forced tracker gets the router's size, num_layers + mtp_num_layers
        common["num_layers"] = model.num_layers + (model.mtp_num_layers or 0)
    # Megatron-LM's training_log: force_initialize=True, track_names, num_layers=args.num_layers; the
    # tracker it creates with device="cuda" lands on the emulated device
    with cuda_on_device(moe_utils, device):
        track_moe_metrics(force_initialize=True, track_names=[AUX_LOSS], **common)


def interval_time_elapsed() -> None:
    """megatron-core's Timer.elapsed(barrier=True): a barrier on its barrier group (the world)."""
    torch.distributed.barrier(group=None)


def training_log(scenario: str, model: Model, args: argparse.Namespace, device, iteration: int,
                 total_loss_dict: dict) -> None:
    """Megatron-LM's training_log: the MoE, MTP and indexer trackers, in its order; then, on a logging
    iteration, the interval timer's barrier and the log line."""
    if args.fixed:
        fix_trackers(scenario, model, device)
    if model.moe_layer_freq:
        track_moe(scenario, model, args, device, iteration, total_loss_dict)
    if model.mtp_num_layers:
        MTPLossLoggingHelper.track_mtp_metrics(1 / args.microbatches, iteration, None, None, total_loss_dict)
    if model.dsa_layers:
        DSAIndexerLossLoggingHelper.track_indexer_metrics(loss_scale=1 / args.microbatches, iteration=iteration,
                                                          writer=None, total_loss_dict=total_loss_dict)
    if iteration % args.log_interval == 0:
        interval_time_elapsed()
        line = " | ".join(f"{key}: {float(value.sum()):.4f}" for key, value in sorted(total_loss_dict.items()))
        print(f"rank {dist.get_rank()} iteration {iteration} | {line}", flush=True)
        total_loss_dict.clear()


# ---------------------------------------------------------------- the job


def init(args: argparse.Namespace):
    """The process group (gloo, or ncclcpu with its watchdog), megatron's groups, and the device."""
    timeouts = {}
    if args.mode == "nccl":
        watchdog.ABORT = not args.no_abort
        device = current_stream(args.sync)
        process_group.register()
        dist.init_process_group(process_group.BACKEND, timeout=timedelta(seconds=args.timeout_s))
        timeouts["distributed_timeout_minutes"] = args.timeout_s / 60.0
    else:  # gloo's and megatron's 30 minutes: the hang stays until then
        device = HostDevice()
        dist.init_process_group("gloo")
    mpu.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                                  context_parallel_size=args.cp, **timeouts)
    dist.barrier()  # the world communicator exists on every rank before the first iteration
    return device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = MODELS[args.scenario]
    device = init(args)
    rank = dist.get_rank()
    coords = (f"tp{mpu.get_tensor_model_parallel_rank()} cp{mpu.get_context_parallel_rank()} "
              f"dp{mpu.get_data_parallel_rank()} pp{mpu.get_pipeline_model_parallel_rank()}")
    layers = list(model.stage_layers(mpu.get_pipeline_model_parallel_rank(), args.pp))
    print(f"rank {rank} ({coords}) ready: {args.scenario}, mode {args.mode}, layers {layers[0]}-{layers[-1]}"
          f"{', fixed' if args.fixed else ''}", flush=True)
    optimizer = ENGINE.DistributedOptimizer(device)
    total_loss_dict: dict = {}
    started = time.monotonic()
    for iteration in range(1, args.steps + 1):
        train_step(iteration, model, args, device, optimizer)
        print(f"rank {rank} iteration {iteration}: training_log", flush=True)
        training_log(args.scenario, model, args, device, iteration, total_loss_dict)
        if args.step_sync and step_sync(started, args.steps * 600.0):
            break
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    mpu.destroy_model_parallel()
    process_group.destroy()  # the emulated watchdog and stream end first
    return 0


def step_sync(started: float, budget_s: float) -> bool:
    """--step-sync: the job's own end-of-step check, as Megatron-LM's train loop makes it for
    --exit-duration-in-mins: every rank agrees whether the time budget is spent, an all_reduce MAX of a flag
    over the world group, then reads it on the host. A call site of the job, which no table knows."""
    done = torch.tensor([int(time.monotonic() - started > budget_s)])
    dist.all_reduce(done, op=dist.ReduceOp.MAX)
    return bool(done.item())


if __name__ == "__main__":
    sys.exit(main())
