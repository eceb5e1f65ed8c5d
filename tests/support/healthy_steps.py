"""examples/gated_collectives ``--scenario healthy`` with a realistic step: a data loader that waits
``HEALTHY_LOAD_SLEEP`` seconds for I/O (the main thread sleeps), then a batch of ``HEALTHY_ROWS`` x 64, then the
step's matmuls and the real all_reduce of the gradient, unchanged.

The healthy jobs of the tests run through this launcher rather than the worker itself: the worker's own healthy
loop trains flat out (a 64 x 64 batch, sub-millisecond steps), so each of its ranks takes a core for as long as a
test watches it, and CI's e2e tier is bound by CPU (docs/design.md). A step that waits for its data as well as
computing is what a training job does, and still moves the main thread's CPU ticks and stacks many times a second.
Run as a script: ``torchrun ... healthy_steps.py --scenario healthy --steps N --log-every N``.
"""

import os
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "examples", "gated_collectives", "worker.py")


def main(argv: list[str]) -> int:
    import torch

    load_sleep = float(os.environ.get("HEALTHY_LOAD_SLEEP", "0.05"))
    rows = int(os.environ.get("HEALTHY_ROWS", "64"))
    worker = runpy.run_path(WORKER, run_name="gated_collectives_worker")

    def load_batch(step: int, straggler_rank: int) -> torch.Tensor:  # noqa: ARG001 (the worker's signature)
        """Wait for the next batch as a data loader waits for I/O, then build it."""
        time.sleep(load_sleep)
        return torch.randn(rows, 64)

    worker["train"].__globals__["load_batch"] = load_batch
    return worker["main"](argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
