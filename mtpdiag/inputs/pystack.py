"""``pystack remote PID`` output, with or without ``--native`` (and ``--locals``).

pystack prints each thread "most recent call last" (reversed here: mtpdiag stacks are innermost first),
Python frames as ``(Python) File "f.py", line N, in name`` and C frames as ``(C) File "x.c", line N, in
symbol (library)`` (``Frame.native``). It names no process: a pasted ``$ pystack remote 812`` prompt
gives the pid, and otherwise the main thread's id is the pid (on Linux they are equal). pystack prints
the main thread last, so in a paste of several runs without prompts a new process begins after each
thread that ``threading`` did not start. Function names are bare (``reduce_loss_in_tracker``, where
py-spy prints ``MTPLossLoggingHelper.reduce_loss_in_tracker``).
"""

from __future__ import annotations

import re

import msgspec

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.failed import failure_reason
from mtpdiag.inputs.lines import Line, clean_lines, command
from mtpdiag.inputs.settle import captures_of, main_first, started_by_threading, thread
from mtpdiag.model import Frame, FrameArgs, ThreadStack, printable
from mtpdiag.vocabulary.stacks import display_path, kept_args
from mtpdiag.vocabulary.waits import calls_in

_HEADER = re.compile(
    r"^Traceback for thread (?P<tid>[0-9]{1,10})(?: \((?P<name>.*?)\))?(?: \[(?P<status>[^\]]*)\])?"
    r" \(most recent call last\):$"
)
_EMPTY = re.compile(r"^The frame stack for thread ([0-9]{1,10}) is empty$")
_PYTHON = re.compile(r'^\(Python\) File "(?P<file>.*)", line (?P<line>[0-9]{1,9}), in (?P<function>.+)$')
_NATIVE = re.compile(
    r'^\(C\) File "(?P<file>.*)", line (?P<line>[0-9]{1,9}), in (?P<function>.+?)'
    r"(?: \((?P<library>[^()]*)\))?$"
)
_LOCALS_HEAD = re.compile(r"^(?:Arguments|Locals):$")
_LOCAL = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*): (?P<repr>.*)$")
_SNIFF = re.compile(
    r"Traceback for thread [0-9]{1,10} .*\(most recent call last\):|"
    r"The frame stack for thread [0-9]{1,10} is empty|\((?:Python|C)\) File \""
)
FORM = "pystack"


class _Frame(msgspec.Struct):
    """One frame as read, with its locals (``--locals``) and what its source line calls."""

    function: str
    file: str
    line: int
    native: bool
    locals: list[tuple[str, str]] = msgspec.field(default_factory=list)
    calls: tuple[str, ...] = ()


class _Thread(msgspec.Struct):
    """One thread: its header's facts, its frames (outermost first, as printed) and its context lines."""

    tid: int
    name: str
    active: bool | None
    context: list[Line]
    frames: list[_Frame] = msgspec.field(default_factory=list)


class _Run(msgspec.Struct):
    """One pasted ``pystack remote`` command (or the whole text): its pid, threads, context and bodies."""

    pid: int | None
    threads: list[_Thread] = msgspec.field(default_factory=list)
    context: list[Line] = msgspec.field(default_factory=list)
    bodies: list[str] = msgspec.field(default_factory=list)


def sniff(text: str, _path: str) -> bool:
    return _SNIFF.search(text) is not None


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    dumps = [d for run in _runs(lines) for d in _processes(run)]
    return captures_of(path, FORM, dumps, lines, context)


class _Runs:
    """pystack output, line by line, into runs: one per pasted ``pystack remote`` command (or one for the
    whole text), each a ``_Run`` of ``_Thread``s. The state is the run and thread being read, the last frame
    (for its locals and its source line) and the lines since the last header (they lead into the next
    thread)."""

    def __init__(self) -> None:
        self.runs: list[_Run] = []
        self.run: _Run | None = None
        self.current: _Thread | None = None
        self.frame: _Frame | None = None
        self.in_locals = self.source_next = False
        self.pending: list[Line] = []

    def feed(self, line: Line) -> None:
        body = line.body
        if self.run is not None:
            self.run.bodies.append(body)
        cmd = command(body) if body else None
        if cmd is not None:
            self.run, self.current, self.frame = self._new_run(cmd.pid), None, None
            self.run.context.extend([*self.pending, line])
            self.pending = []
            return
        header = _HEADER.match(body)
        opened = header or _EMPTY.match(body)
        if opened:
            self._open(line, opened, header)
        elif self.current is None:
            if body:
                self.pending.append(line)
        else:
            self._thread_line(line, self.current)

    def finish(self) -> list[_Run]:
        if self.pending and self.run is not None:
            run = self.run
            (run.threads[-1].context if run.threads else run.context).extend(self.pending)
        return self.runs

    def _new_run(self, pid: int | None) -> _Run:
        made = _Run(pid=pid)
        self.runs.append(made)
        return made

    def _open(self, line: Line, opened: re.Match[str], header: re.Match[str] | None) -> None:
        run = self.run if self.run is not None else self._new_run(None)
        self.run = run
        status = (header["status"] or "") if header else ""
        self.current = _Thread(
            tid=int(opened[1]),
            name=printable(header["name"] or "") if header else "",
            active=True if "Has the GIL" in status or "collecting" in status else None,
            context=[*self.pending, line],
        )
        run.threads.append(self.current)
        self.frame, self.in_locals, self.source_next, self.pending = None, False, False, []

    def _thread_line(self, line: Line, current: _Thread) -> None:
        body = line.body
        if self.in_locals and self.frame is not None and (m := _LOCAL.match(body)):
            self.frame.locals.append((m["name"], m["repr"]))
            return
        if _LOCALS_HEAD.match(body):
            self.in_locals, self.source_next = self.frame is not None, False
            return
        python = _PYTHON.match(body)
        native = None if python else _NATIVE.match(body)
        if hit := python or native:
            self.frame = _frame_of(hit, native=native is not None)
            current.frames.append(self.frame)
            self.in_locals, self.source_next = False, python is not None
            if line.prefix:
                current.context.append(Line(line.prefix, "", line.prefix))
        elif self.source_next and body:  # pystack prints the source line of a Python frame under it
            self.source_next = False
            if self.frame is not None:
                self.frame.calls = calls_in(body)  # what the line calls (a host sync, a lock); never the text
        elif body and not body.startswith("* - "):
            self.pending.append(line)


def _runs(lines: list[Line]) -> list[_Run]:
    """One run per pasted ``pystack remote`` command (or one for the whole text)."""
    reader = _Runs()
    for line in lines:
        reader.feed(line)
    return reader.finish()


def _frame_of(m: re.Match[str], native: bool) -> _Frame:
    function = printable(m["function"])
    if native:
        function = function.removesuffix(" (inlined)")
        file = m["file"] if m["file"] != "???" else (m["library"] or "???")
    else:
        file = display_path(printable(m["file"]))
    return _Frame(function=function, file=printable(file), line=int(m["line"]), native=native)


def _processes(run: _Run) -> list[Dumped]:
    if not run.threads:
        reason = failure_reason(run.bodies) or "pystack printed no thread"
        return [Dumped(pid=run.pid, threads=(), context=tuple(run.context), error=reason)]
    stacks = [_stack(t) for t in run.threads]
    parts = [list(range(len(stacks)))] if run.pid is not None else _split_after_mains(stacks)
    out = []
    for n, part in enumerate(parts):
        threads = [stacks[i] for i in part]
        context = (run.context if n == 0 else []) + [line for i in part for line in run.threads[i].context]
        ordered = main_first(threads)
        pid = run.pid if run.pid is not None else (ordered[0].native_id if ordered[0].frames else None)
        if pid is not None:
            ordered = tuple(sorted(threads, key=lambda t: t.native_id != pid))
        error = (
            None
            if any(t.frames for t in threads)
            else f"pystack output with {len(threads)} thread(s) but no frame could be read"
        )
        out.append(
            Dumped(
                pid=pid,
                threads=ordered,
                context=tuple(context),
                native=any(f.native for t in threads for f in t.frames),
                error=error,
            )
        )
    return out


def _split_after_mains(stacks: list[ThreadStack]) -> list[list[int]]:
    """pystack prints a process's main thread last: a thread not started by ``threading`` ends a process."""
    parts: list[list[int]] = [[]]
    for i, s in enumerate(stacks):
        parts[-1].append(i)
        if s.frames and not started_by_threading(s.frames) and i < len(stacks) - 1:
            parts.append([])
    return [p for p in parts if p]


def _stack(t: _Thread) -> ThreadStack:
    frames = [
        Frame(
            function=f.function,
            file=f.file,
            line=f.line,
            native=f.native,
            args=None if f.native or not f.locals else FrameArgs.of(kept_args(f.file, f.locals)),
        )
        for f in reversed(t.frames)
    ]
    innermost = next((f for f in reversed(t.frames) if not f.native), None)
    calls = innermost.calls if innermost is not None else ()
    return thread(t.tid, t.name, tuple(frames), t.tid, t.active, calls)


READER = Reader(name=FORM, sniff=sniff, read=read)
