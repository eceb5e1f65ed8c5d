"""One rank of ``mtpdiag verify``: real megatron-core on gloo, collecting the MTP loss behind a gate.

Started by torchrun (see ``mtpdiag.fix.verify.runner``). It imports torch and megatron-core; nothing in
``mtpdiag`` imports this file. Each rank exits by itself if the runner dies, and otherwise:

1. initialises megatron-core model parallelism (``initialize_model_parallel``) and writes
   ``ready-<rank>.json`` into ``--out``;
2. on the last pipeline stage, saves the loss ``rank + 1`` into the real ``MTPLossLoggingHelper``
   tracker with ``avg_group`` = DP x CP, as ``GPTModel`` does, so the reduced value is the mean over
   a known set of ranks;
3. collects it the way the chosen verl engine gates it (``--gate``), which is where ``buggy`` hangs
   with cp > 1; a rank that writes the metric records it in ``metric-<rank>.json``;
4. meets every rank at a world barrier, destroys its groups, writes ``done-<rank>.json`` and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from mtpdiag.fix.verify.cpu_rank import prepare_cpu_rank  # noqa: E402

prepare_cpu_rank()  # before megatron-core: torch.compile at first call, one gloo device (cpu_rank.py)

from megatron.core import parallel_state as mpu  # noqa: E402
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper  # noqa: E402

METRIC_NAME = "mtp_1 loss"  # the key track_mtp_metrics writes for MTP layer 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--etp", type=int, default=None)
    parser.add_argument("--vpp", type=int, default=None)
    parser.add_argument("--order", default="tp-cp-ep-dp-pp")
    parser.add_argument("--gate", choices=["buggy", "fixed"], required=True)
    parser.add_argument(
        "--timeout-s", type=int, default=1800, help="gloo timeout: the last backstop, after exit_with_the_runner"
    )
    parser.add_argument("--out", required=True, help="directory for the per-rank result files")
    return parser.parse_args(argv)


def write_result(out_dir: str, kind: str, rank: int, payload: dict[str, object]) -> None:
    """Write ``<kind>-<rank>.json`` atomically, so the runner never reads half a file."""
    path = os.path.join(out_dir, f"{kind}-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "time": time.time(), **payload}, f)
    os.replace(path + ".tmp", path)


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def exit_with_the_runner(interval_s: float = 1.0) -> None:
    """Exit once the runner that started torchrun is gone (SIGKILLed, say), instead of hanging on.

    Our parent is the torchrun agent and its parent the runner; when either dies, the orphan is
    re-parented, so a changed parent says so without trusting a pid that may have been reused.
    """
    agent = os.getppid()
    runner = parent_of(agent)

    def watch() -> None:
        while os.getppid() == agent and parent_of(agent) == runner:
            time.sleep(interval_s)
        os._exit(3)

    threading.Thread(target=watch, name="exit-with-runner", daemon=True).start()


def is_mp_src_rank_with_outputs() -> bool:
    """verl's condition for the rank that owns the model outputs (tp 0, last stage, cp 0)."""
    return bool(
        mpu.get_tensor_model_parallel_rank() == 0
        and mpu.get_pipeline_model_parallel_rank() == mpu.get_pipeline_model_parallel_world_size() - 1
        and mpu.get_context_parallel_rank() == 0
    )


def save_mtp_loss() -> torch.distributed.ProcessGroup:
    """What GPTModel does on the last stage: add this rank's MTP loss, averaged over DP x CP.

    The loss is ``rank + 1`` (``mtpdiag.fix.verify.rank_loss``): distinct per rank, so a mean over the
    wrong group shows.
    """
    avg_group = mpu.get_data_parallel_group(with_context_parallel=True)
    # save_loss_to_tracker would allocate on torch.cuda.current_device(); seed the tracker on CPU.
    MTPLossLoggingHelper.tracker["values"] = torch.zeros(1)
    MTPLossLoggingHelper.save_loss_to_tracker(
        torch.tensor(float(dist.get_rank() + 1)), layer_number=0, num_layers=1, avg_group=avg_group
    )
    return avg_group


def megatron_mtp_loss(n_micro_batch: int = 1) -> dict[str, float]:
    """verl's get_megatron_mtp_loss: reduce the tracker (a DP x CP all_reduce) into a loss dict."""
    total_loss_dict: dict[str, Any] = {}  # metric name -> a torch tensor
    MTPLossLoggingHelper.track_mtp_metrics(1.0 / n_micro_batch, 0, None, None, total_loss_dict)
    return {key: value.item() for key, value in total_loss_dict.items()}


def collect_mtp_loss(gate: str) -> dict[str, float]:
    """The tail of verl's forward_backward_batch, gated as the chosen engine gates it."""
    metrics: dict[str, float] = {}
    if gate == "buggy":  # verl 0.7.1: only the src rank enters the reduce
        if is_mp_src_rank_with_outputs():
            metrics.update(megatron_mtp_loss())
    else:  # verl 0.8.0: every last-stage rank reduces, only the src rank keeps the metric
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            losses = megatron_mtp_loss()
            if is_mp_src_rank_with_outputs():
                metrics.update(losses)
    return metrics


def coordinates() -> dict[str, int]:
    return {
        "tp": mpu.get_tensor_model_parallel_rank(),
        "cp": mpu.get_context_parallel_rank(),
        "dp": mpu.get_data_parallel_rank(),
        "pp": mpu.get_pipeline_model_parallel_rank(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_with_the_runner()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        virtual_pipeline_model_parallel_size=args.vpp,
        context_parallel_size=args.cp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
        distributed_timeout_minutes=max(1, -(-args.timeout_s // 60)),
        order=args.order,
        create_gloo_process_groups=False,  # the default backend is gloo already
    )
    rank = dist.get_rank()
    write_result(args.out, "ready", rank, {"coords": coordinates()})

    avg_group = save_mtp_loss() if mpu.is_pipeline_last_stage(ignore_virtual=True) else None
    metrics = collect_mtp_loss(args.gate)
    if METRIC_NAME in metrics:
        group = dist.get_process_group_ranks(avg_group) if avg_group is not None else []
        write_result(
            args.out, "metric", rank, {"name": METRIC_NAME, "value": metrics[METRIC_NAME], "avg_group": sorted(group)}
        )

    dist.barrier()
    mpu.destroy_model_parallel()
    dist.destroy_process_group()
    write_result(args.out, "done", rank, {})
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's teardown of torch: about a second per run, for nothing
