"""``py-spy dump --json`` files (with or without ``--locals`` and ``--native``).

One file is one process. Its rank comes from ``--rank-from`` on the path, else the file name; JSON
carries no other line that could name it. ``--native`` frames carry their library in ``module``.
"""

from __future__ import annotations

from dataclasses import replace

from mtpdiag.capture.pyspy import threads_from_json
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import json_start, parse_json
from mtpdiag.inputs.identity import rank_from_name
from mtpdiag.inputs.lines import is_python_file
from mtpdiag.inputs.settle import STATE_UNKNOWN, STATE_UNREADABLE, UNKNOWN_HOST
from mtpdiag.model import RankCapture, ThreadStack, decimal

FORM = "py-spy JSON"


def sniff(text: str, path: str) -> bool:
    return json_start(text) == "["


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    data = parse_json(text, path, "a py-spy dump")
    try:
        threads = threads_from_json(data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a py-spy --json dump ({exc})") from None
    rank = None
    if context.rank_from is not None and (m := context.rank_from.search(path)):
        rank = decimal(m.group(1))
    if rank is None:
        rank = rank_from_name(path)
    pids = {t.get("pid") for t in data if isinstance(t, dict) and isinstance(t.get("pid"), int)}
    pid = pids.pop() if len(pids) == 1 else None
    if not any(t.frames for t in threads):
        what = "no threads" if not threads else f"{len(threads)} thread(s) but no frame"
        if rank is None and pid is None:
            raise InputError(f"{path}: a py-spy dump with {what}")
        capture = RankCapture(pid=pid, host=UNKNOWN_HOST, rank=rank, state=STATE_UNREADABLE, source=path,
                              error=f"a py-spy --json dump with {what}")
        return FileCaptures(path, (capture,), form=FORM)
    capture = RankCapture(pid=pid, host=UNKNOWN_HOST, rank=rank, state=STATE_UNKNOWN,
                          threads=_mark_native(data, threads), source=path)
    return FileCaptures(path, (capture,), form=FORM)


def _mark_native(data: list, threads: tuple[ThreadStack, ...]) -> tuple[ThreadStack, ...]:
    """``--native`` frames name their library in ``module`` (Python frames have none): mark them."""
    if not any(type(f) is dict and f.get("module") for t in data if type(t) is dict
               for f in (t["frames"] if type(t.get("frames")) is list else ())):
        return threads
    out = []
    for raw, t in zip(data, threads):
        frames = tuple(replace(f, native=True, args=()) if type(r) is dict and r.get("module")
                       and not is_python_file(f.file) else f for r, f in zip(raw["frames"], t.frames))
        out.append(replace(t, frames=frames))
    return tuple(out)


READER = Reader(name=FORM, sniff=sniff, read=read)
