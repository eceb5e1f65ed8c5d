"""``py-spy dump --json`` documents (with or without ``--locals`` and ``--native``): a file, or a live dump.

One file is one process. Its rank comes from ``--rank-from`` on the path, else the file name; JSON
carries no other line that could name it. ``--native`` frames carry their library in ``module``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import json_start, parse_json
from mtpdiag.inputs.identity import rank_from_name
from mtpdiag.inputs.lines import is_python_file
from mtpdiag.model import (STATE_UNKNOWN, STATE_UNREADABLE, UNKNOWN_HOST, Frame, RankCapture, ThreadStack, decimal,
                           printable)
from mtpdiag.vocabulary.stacks import display_path, kept_args

FORM = "py-spy JSON"
LineCalls = Callable[[str, int], tuple[str, ...]]  # (file, line) -> the wait calls on that line


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


def threads_from_json(data: Any, line_calls: LineCalls | None = None, live: bool = False) -> tuple[ThreadStack, ...]:
    """Threads of one ``py-spy dump --json`` document (a list of thread objects).

    ``line_calls(file, line)``, given by a live capture, names the wait calls on each thread's innermost
    Python line (``capture.source`` reads them from the target's files); ``live`` keeps a hash of the locals
    for ``watch``.
    """
    if not isinstance(data, list):
        raise ValueError("a py-spy dump is a JSON list of threads")
    return tuple(_thread(t, line_calls, live) for t in data)


def _thread(t: Any, line_calls: LineCalls | None, live: bool) -> ThreadStack:
    if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
        raise ValueError("a py-spy thread needs a list of frames")
    native_id = t.get("os_thread_id")
    thread_id = t.get("thread_id")
    frames = tuple(_frame(f) for f in t["frames"])
    calls: tuple[str, ...] = ()
    if line_calls is not None:
        innermost = next((f for f in t["frames"] if isinstance(f, dict) and f.get("module") is None), None)
        if innermost is not None and isinstance(innermost.get("filename"), str) and \
                type(innermost.get("line")) is int:
            calls = line_calls(innermost["filename"], innermost["line"])
    return ThreadStack(
        thread_id=thread_id if isinstance(thread_id, int) else 0,
        name=printable(str(t.get("thread_name") or "")),
        native_id=native_id if isinstance(native_id, int) else None,
        active=t.get("active") if isinstance(t.get("active"), bool) else None,
        frames=frames,
        calls=calls,
        locals_key=_locals_key(t["frames"]) if live else None,
    )


def _locals_key(frames: list) -> int:
    """A hash of each frame's locals (names and py-spy's reprs): the value is kept, never the locals."""
    parts = []
    for f in frames:
        if isinstance(f, dict) and isinstance(f.get("locals"), list):
            parts.append(tuple((str(v.get("name")), str(v.get("repr"))) for v in f["locals"] if isinstance(v, dict)))
    return hash(tuple(parts))


def _frame(f: Any) -> Frame:
    if not isinstance(f, dict):
        raise ValueError("a py-spy frame must be an object")
    filename = f.get("filename") or f.get("short_filename") or "<unknown>"
    file = display_path(printable(str(filename)))
    line = f.get("line")
    locals_ = f.get("locals") or []
    pairs = [(str(v.get("name")), v.get("repr")) for v in locals_ if isinstance(v, dict)]
    return Frame(
        function=printable(str(f.get("name") or "<unknown>")),
        file=file,
        line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
        args=kept_args(file, pairs),
        native=f.get("module") is not None,  # py-spy --native names the shared object of a C frame
    )


READER = Reader(name=FORM, sniff=sniff, read=read)
