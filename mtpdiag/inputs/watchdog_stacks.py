"""The watchdog's ``Stack trace of the failed collective:`` blocks (torch 2.7+, with the Flight Recorder on).

torch prints, after a rank's failure line, the Python stack of the collective that failed, innermost first::

    [rank3]:[E508 07:35:59.44 ProcessGroupNCCL.cpp:733] Stack trace of the failed collective:
    #0 broadcast from /usr/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:2968
    #1 wrapper from /usr/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83
    #2 _pp_receive_prev_sampled_token_ids_to_input_batch from .../vllm/v1/worker/gpu_model_runner.py:4484

The innermost frame in torch.distributed is the op; the first frame outside torch is where the job called it (the
timeout's ``site``). It goes on the same rank's last failure logged before the block, else (a block pasted alone)
it is a failure of its own, with no sequence number or group.
"""

from __future__ import annotations

import re

from mtpdiag.model import replace
from mtpdiag.model.watchdog import PGRef, WatchdogTimeout
from mtpdiag.vocabulary.stacks import display_path

_HEAD = re.compile(r"Stack\s*trace\s*of\s*the\s*failed\s*collective:\s*$")
_FRAME = re.compile(r"#(\d{1,4})\s+(\S{1,200})\s+from\s+(\S{1,400}?):(\d{1,9})\s*$")
_TORCH_FILE = re.compile(r"(?:^|/)torch/")
MAX_FRAMES = 200


class FailedStack:
    """One block being read: its line, the rank on its header, and its frames (innermost first)."""

    def __init__(self, line: int, rank: int | None) -> None:
        self.line = line
        self.rank = rank
        self.frames: list[tuple[str, str, int]] = []
        self.open = True

    @classmethod
    def start(cls, line: str, number: int, rank: int | None) -> FailedStack | None:
        """The block a header line starts (``Stack trace of the failed collective:``), or None."""
        return cls(number, rank) if _HEAD.search(line) else None

    def takes(self, line: str) -> bool:
        """Whether ``line`` is this block's next frame (``#N name from file:line``, N in order); the first line
        that is not closes the block."""
        if not self.open:
            return False
        m = _FRAME.search(line)
        if m is not None and int(m[1]) == len(self.frames) and len(self.frames) < MAX_FRAMES:
            self.frames.append((m[2], m[3], int(m[4])))
            return True
        self.open = False
        return False

    def op_and_site(self) -> tuple[str | None, str | None]:
        """The collective (the innermost frame, in torch.distributed) and where the job called it (the first
        frame outside torch: ``name (file.py:12)``)."""
        op = self.frames[0][0] if self.frames and "distributed" in self.frames[0][1] else None
        for name, file, line in self.frames:
            if not _TORCH_FILE.search(file):
                return op, f"{name} ({display_path(file)}:{line})"
        return op, None


def with_stacks(timeouts: list[WatchdogTimeout], stacks: list[FailedStack]) -> tuple[WatchdogTimeout, ...]:
    """The timeouts with the call site of each failed collective's stack: on the same rank's last failure logged
    before the block, else (a block pasted alone) as a failure of its own, with no sequence number."""
    out = list(timeouts)
    for stack in stacks:
        if not stack.frames:
            continue
        op, site = stack.op_and_site()
        before = [i for i, t in enumerate(out) if t.line < stack.line and t.rank == stack.rank and t.site is None]
        if before:
            i = before[-1]
            out[i] = replace(out[i], site=site, op=out[i].op or op)
            continue
        out.append(
            WatchdogTimeout(
                line=stack.line,
                rank=stack.rank,
                group=PGRef(),
                seq=None,
                op_type=None,
                op=op,
                numel_in=None,
                numel_out=None,
                timeout_ms=None,
                ran_for_ms=None,
                site=site,
            )
        )
    return tuple(sorted(out, key=lambda t: t.line))
