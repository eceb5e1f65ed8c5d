"""A job's log lines, tagged with ranks, and no stack: what a ticket holds when the stacks were never taken
(the watchdog's dump failed, or only the scheduler's state was printed). Asked last.

Each rank the log prefixes name (``[rank3]:``, sglang's ``[date TP3]``) is a rank that could not be read, with
"no stack" as its reason: the job's ranks are known, where they wait is not, and the diagnosis says what to
collect (``incomplete``). A log with NCCL watchdog lines is not this reader's: ``--log`` reads those (and
``analyze`` reads a positional one as ``--log`` would). A text whose lines name no rank is not a capture.
"""

from __future__ import annotations

import re

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.identity import rank_of_prefix
from mtpdiag.inputs.lines import Line, clean_lines
from mtpdiag.inputs.settle import captures_of
from mtpdiag.model import printable
from mtpdiag.vocabulary.ops import WORK_TIMEOUT_PHRASES

FORM = "log without stacks"
_SNIFF_CHARS = 200_000
_WATCHDOG = re.compile(
    "|".join((*WORK_TIMEOUT_PHRASES, r"detected\s*by\s*watchdog", r"ast\s*enqueued\s*(?:NCCL\s*)?work"))
)


def sniff(text: str, _path: str) -> bool:
    head = text[:_SNIFF_CHARS]
    if _WATCHDOG.search(head):
        return False
    return any(line.prefix and rank_of_prefix(line.prefix) is not None for line in clean_lines(head))


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    by_rank: dict[int, list[Line]] = {}
    for line in lines:
        rank = rank_of_prefix(line.prefix) if line.prefix else None
        if rank is not None:
            by_rank.setdefault(rank, []).append(line)
    dumps = []
    for rank_lines in by_rank.values():
        said = printable(rank_lines[0].body)[:80]
        error = f"no stack: only log lines ({said!r}), no py-spy, faulthandler or pystack dump"
        dumps.append(Dumped(pid=None, threads=(), context=tuple(rank_lines), error=error))
    return captures_of(path, FORM, dumps, lines, context)


READER = Reader(name=FORM, sniff=sniff, read=read)
