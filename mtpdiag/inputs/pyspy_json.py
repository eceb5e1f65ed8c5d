"""``py-spy dump --json`` documents (with or without ``--locals`` and ``--native``): a file, or a live dump.

One file is one process. Its rank comes from ``--rank-from`` on the path, else the file name; JSON
carries no other line that could name it. ``--native`` frames carry their library in ``module``.

The document is decoded by msgspec straight into the few fields read (``_Thread``, ``_Frame``): the rest
is skipped unparsed, and so are a frame's ``locals`` unless the frame is torch.distributed's, whose
whitelisted integer arguments (``dst``, ``src``, ...) are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import msgspec

from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import json_start
from mtpdiag.inputs.identity import rank_from_name
from mtpdiag.inputs.lines import is_python_file
from mtpdiag.model import (
    STATE_UNKNOWN,
    STATE_UNREADABLE,
    UNKNOWN_HOST,
    Frame,
    FrameArgs,
    RankCapture,
    ThreadStack,
    decimal,
    printable,
    replace,
)
from mtpdiag.model.fields import may_hold_unprintable, one_line_error
from mtpdiag.vocabulary.stacks import display_path, kept_args

FORM = "py-spy JSON"
LineCalls = Callable[[str, int], tuple[str, ...]]  # (file, line) -> the wait calls on that line


class _Local(msgspec.Struct, gc=False):
    name: str | None = None
    repr: str | None = None


class _Frame(msgspec.Struct, gc=False):
    name: str | None = None
    filename: str | None = None
    short_filename: str | None = None
    module: str | None = None
    line: int | None = None
    locals: msgspec.Raw = msgspec.Raw()  # decoded only for torch.distributed frames (and by watch)


class _Thread(msgspec.Struct, gc=False):
    frames: list[_Frame]
    pid: int | None = None
    thread_id: int | None = None
    thread_name: str | None = None
    os_thread_id: int | None = None
    active: bool | None = None


_DECODER = msgspec.json.Decoder(list[_Thread])
_LOCALS = msgspec.json.Decoder(Optional[list[_Local]])  # noqa: UP045 - a run-time type: typing.Optional reads the same on Python 3.10 to 3.13


def sniff(text: str | bytes, _path: str) -> bool:
    return json_start(text) == "["


def read(text: str | bytes, path: str, context: ReadContext) -> FileCaptures:
    data = text.encode() if isinstance(text, str) else text
    try:
        raw = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"{path}: not a py-spy --json dump ({one_line_error(exc)})") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InputError(f"{path}: invalid or truncated JSON ({one_line_error(exc)})") from None
    threads = _threads(raw, None, False, scrub=may_hold_unprintable(data))
    rank = None
    if context.rank_from is not None and (m := context.rank_from.search(path)):
        rank = decimal(m.group(1))
    if rank is None:
        rank = rank_from_name(path)
    pids = {t.pid for t in raw if t.pid is not None}
    pid = pids.pop() if len(pids) == 1 else None
    if not any(t.frames for t in threads):
        what = "no threads" if not threads else f"{len(threads)} thread(s) but no frame"
        if rank is None and pid is None:
            raise InputError(f"{path}: a py-spy dump with {what}")
        capture = RankCapture(
            pid=pid,
            host=UNKNOWN_HOST,
            rank=rank,
            state=STATE_UNREADABLE,
            source=path,
            error=f"a py-spy --json dump with {what}",
        )
        return FileCaptures(path, (capture,), form=FORM)
    capture = RankCapture(pid=pid, host=UNKNOWN_HOST, rank=rank, state=STATE_UNKNOWN, threads=threads, source=path)
    return FileCaptures(path, (capture,), form=FORM)


def threads_from_bytes(data: bytes, line_calls: LineCalls | None = None, live: bool = False) -> tuple[ThreadStack, ...]:
    """Threads of one ``py-spy dump --json`` output; ValueError (msgspec's) when it is not one.

    ``line_calls(file, line)``, given by a live capture, names the wait calls on each thread's innermost
    Python line (``capture.source`` reads them from the target's files); ``live`` keeps a hash of the locals
    for ``watch``.
    """
    return _threads(_DECODER.decode(data), line_calls, live, scrub=may_hold_unprintable(data))


def threads_from_json(data: Any, line_calls: LineCalls | None = None, live: bool = False) -> tuple[ThreadStack, ...]:
    """``threads_from_bytes`` of a document already parsed (a list of thread objects); ValueError otherwise."""
    try:
        encoded = msgspec.json.encode(data)
    except (TypeError, OverflowError, UnicodeEncodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    return threads_from_bytes(encoded, line_calls, live)


def _threads(raw: list[_Thread], line_calls: LineCalls | None, live: bool, scrub: bool) -> tuple[ThreadStack, ...]:
    return tuple(_thread(t, line_calls, live, scrub) for t in raw)


def _thread(t: _Thread, line_calls: LineCalls | None, live: bool, scrub: bool) -> ThreadStack:
    frames = tuple([_frame(f, scrub) for f in t.frames])
    calls: tuple[str, ...] = ()
    if line_calls is not None:
        innermost = next((f for f in t.frames if f.module is None), None)
        if innermost is not None and innermost.filename is not None and innermost.line is not None:
            calls = line_calls(innermost.filename, innermost.line)
    name = t.thread_name or ""
    return ThreadStack(
        thread_id=t.thread_id if t.thread_id is not None else 0,
        name=printable(name) if scrub else name,
        native_id=t.os_thread_id,
        active=t.active,
        frames=frames,
        calls=calls,
        locals_key=_locals_key(t.frames) if live else None,
    )


def _locals_key(frames: list[_Frame]) -> int:
    """A hash of each frame's locals (names and py-spy's reprs): the value is kept, never the locals."""
    parts: list[tuple[object, ...]] = []
    for f in frames:
        if f.locals:
            try:
                parts.append(tuple((v.name, v.repr) for v in _LOCALS.decode(f.locals) or ()))
            except msgspec.MsgspecError:
                parts.append((bytes(f.locals),))
    return hash(tuple(parts))


def _frame(f: _Frame, scrub: bool) -> Frame:
    """The Frame of a py-spy frame. Made once per distinct frame (``_FRAMES``): the ranks of a big job
    repeat a few stacks, and a Frame made before also carries its hash (``Frame`` caches it)."""
    key = (f.name, f.filename, f.short_filename, f.module, f.line)
    args = _args(f) if f.locals and f.filename is not None and "torch/distributed/" in f.filename else None
    frame = _FRAMES.get(key)
    if frame is None:
        if len(_FRAMES) >= _MAX_FRAMES:
            _FRAMES.clear()
        file = display_path(f.filename or f.short_filename or "<unknown>")
        function = f.name or "<unknown>"
        if scrub:
            file, function = printable(file), printable(function)
        frame = _FRAMES[key] = Frame(
            function=function, file=file, line=f.line if f.line is not None else 0, native=f.module is not None
        )  # --native names a C frame's library
    if args is not None and not (f.module and not is_python_file(frame.file)):
        return replace(frame, args=args)
    return frame


def _args(f: _Frame) -> FrameArgs | None:
    """The kept arguments of a torch.distributed frame, from its locals. Read once per distinct locals
    (``_ARGS``): at 16k ranks most ranks' collective frames hold the same ones, only a send's peer differs."""
    key = (f.filename, bytes(f.locals))
    if key in _ARGS:
        return _ARGS[key]
    if len(_ARGS) >= _MAX_FRAMES:
        _ARGS.clear()
    args = _ARGS[key] = _read_args(f)
    return args


def _read_args(f: _Frame) -> FrameArgs | None:
    try:
        pairs = [(v.name or "", v.repr) for v in _LOCALS.decode(f.locals) or ()]
    except msgspec.MsgspecError:  # locals that are not py-spy's: no argument is kept
        return None
    return FrameArgs.of(kept_args(display_path(f.filename or ""), pairs))


# Frames made, by the py-spy fields they were made from; bounded, as a long ``watch`` sees new ones.
_FRAMES: dict[tuple[str | None, str | None, str | None, str | None, int | None], Frame] = {}
_ARGS: dict[tuple[str | None, bytes], FrameArgs | None] = {}
_MAX_FRAMES = 1 << 16


READER = Reader(name=FORM, sniff=sniff, read=read)
