"""py-spy text read line by line into sections, before they become processes (``inputs.pyspy_text``).

Each clean line is first read once into a typed record (``Record``: what kind of line it is and every reading
the parser may need), then fed to a small state machine (``Parser``) whose steps each handle one kind. A
section is one process header, a pasted prompt, or a run of threads with neither; grouped pastes (several
``Thread`` headers over one stack) share one frames list between their headers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import msgspec

from mtpdiag.inputs.failed import failure_reason
from mtpdiag.inputs.lines import Command, Line, command
from mtpdiag.model import printable

# Numbers are ASCII and bounded: py-spy never prints others, and int() refuses 5000-digit strings.
_PROCESS = re.compile(r"^Process ([0-9]{1,10}): ?(.*)$")
_PARENT = re.compile(r"^Parent Process ([0-9]{1,10}): ?(.*)$")
_PYTHON = re.compile(r"^Python v[0-9]")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]{1,16}|[0-9]{1,10}) \((idle|active|active\+gil|gil)\)(?:: "(.*)")?$')
_FRAME = re.compile(r"^(?P<function>\S.*?) \((?P<where>[^()]*)\)$")
_LOCALS_HEAD = re.compile(r"^(?:Arguments|Locals):$")
_LOCAL = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*): (?P<repr>.*)$")


class RawFrame(msgspec.Struct):
    """One frame line as read: the function, its ``file:line`` (or library), and the locals under it."""

    function: str
    where: str
    locals: list[tuple[str, str]] = msgspec.field(default_factory=list)


@dataclass
class ThreadHeader:
    """One ``Thread`` header and the frames read under it so far."""

    ident: str
    name: str
    active: bool
    frames: list[RawFrame]  # shared by the headers of a grouped paste
    context: list[Line] = field(default_factory=list)
    unread: list[int] = field(default_factory=lambda: [0])  # shared like frames


@dataclass
class Section:
    """One process as its lines were read: its header facts, its threads, and the lines around them."""

    pid: int | None = None
    cmdline: str = ""
    parents: list[str] = field(default_factory=list)
    context: list[Line] = field(default_factory=list)
    threads: list[ThreadHeader] = field(default_factory=list)
    stray: list[RawFrame] = field(default_factory=list)  # frames with no Thread header above them
    from_command: bool = False
    bodies: list[str] = field(default_factory=list)  # every line, for a tool's error


class Kind(IntEnum):
    """What a line of py-spy text is, before the parser's state decides what it means."""

    BLANK = 0
    PROCESS = 1  # Process N: <command line>
    PARENT = 2  # Parent Process N: <command line>
    PYTHON = 3  # Python v3.x (<path>)
    THREAD = 4  # Thread N (idle): "name"
    OTHER = 5  # a frame, a local, a locals header, a prompt, or text (headers are tried in _HEADERS' order)


_HEADERS = ((Kind.PROCESS, _PROCESS), (Kind.PARENT, _PARENT), (Kind.PYTHON, _PYTHON), (Kind.THREAD, _THREAD))
_HEADER_STARTS = "PT"  # every header begins with one of these: other lines skip the header patterns
_BLANK, _PROCESS_LINE, _PARENT_LINE, _THREAD_LINE, _OTHER = (
    Kind.BLANK,
    Kind.PROCESS,
    Kind.PARENT,
    Kind.THREAD,
    Kind.OTHER,
)


class Record(msgspec.Struct, frozen=True, gc=False):
    """One clean line, read once: its kind and every reading the parser may need (the regexes run here)."""

    line: Line
    kind: Kind
    match: re.Match[str] | None = None  # of PROCESS, PARENT or THREAD
    frame: tuple[str, str] | None = None  # (function, where) when the line reads as a frame
    local: re.Match[str] | None = None  # ``name: repr`` (a local, under an Arguments/Locals header)
    locals_head: bool = False
    command: Command | None = None  # a pasted py-spy/pystack prompt


def record_of(line: Line) -> Record:
    body = line.body
    if not body:
        return Record(line, _BLANK)
    if body[0] in _HEADER_STARTS:
        for kind, pattern in _HEADERS:
            if m := pattern.match(body):
                return Record(line, kind, m)
    frame = _FRAME.match(body)
    local = _LOCAL.match(body) if ": " in body else None
    return Record(
        line,
        _OTHER,
        frame=(frame["function"], frame["where"]) if frame else None,
        local=local,
        locals_head=body[-1] == ":" and _LOCALS_HEAD.match(body) is not None,
        command=command(body),
    )


class Parser:
    """Line records into sections (one per process header, prompt, or run of threads without either). Its state
    is what earlier lines opened: the section, the headers that get the next frames, the last frame, and the
    lines since it (they lead into what comes next)."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self.section: Section | None = None
        self.group: list[ThreadHeader] = []
        self.frame: RawFrame | None = None  # the last frame
        self.in_cmdline = False
        self.in_locals = False
        self.pending: list[Line] = []
        self.last_was_header = False

    def feed(self, record: Record) -> None:
        if self.section is not None:
            self.section.bodies.append(record.line.body)
        kind = record.kind
        if kind is _OTHER and not self.in_cmdline:  # most lines: frames
            self.last_was_header = False
            self._other(record)
        elif kind is _BLANK:
            self._blank(record.line)
        elif kind is _PROCESS_LINE:
            self._process(record)
        elif self.in_cmdline and self._continues_cmdline(record):
            return
        elif kind is _PARENT_LINE:
            if self.section is not None and record.match is not None:
                self.section.parents.append(record.match[2])
        elif kind is _THREAD_LINE:
            self._thread(record)
        elif kind is _OTHER:
            self.last_was_header = False
            self._other(record)

    def finish(self) -> list[Section]:
        if self.pending:
            self._context().extend(self.pending)
        return self.sections

    def _context(self) -> list[Line]:  # where lines about the current thread (or process) go
        if self.group:
            return self.group[-1].context
        return self.section.context if self.section is not None else []

    def _start(self, pid: int | None, line: Line | None, from_command: bool = False) -> Section:
        before: list[Line] = []  # before the first process, every line leads into it (a tool's own log line
        lead_in = self.pending  # naming the rank, e.g. sglang's "[... TP0] Pyspy dump for PID N:")
        if self.section is not None:
            before, lead_in = _split_lead_in(self.pending, line.prefix if line else "")
        self._context().extend(before)
        self.section = Section(pid=pid, from_command=from_command, context=[*lead_in, *([line] if line else [])])
        self.sections.append(self.section)
        self.group, self.frame, self.pending = [], None, []
        return self.section

    def _blank(self, line: Line) -> None:
        self.in_cmdline = False
        if line.prefix:
            self.pending.append(line)

    def _process(self, record: Record) -> None:
        assert record.match is not None
        pid, line, section = int(record.match[1]), record.line, self.section
        if (
            section is not None
            and section.from_command
            and not section.threads
            and (section.pid in (None, pid) or failure_reason(section.bodies) is None)
        ):  # the header of the dump a pasted prompt ran
            section.pid, section.from_command = pid, False
            section.context += [*self.pending, line]
            self.group, self.frame, self.pending = [], None, []
        else:
            section = self._start(pid, line)
        section.cmdline = record.match[2]
        self.in_cmdline, self.in_locals, self.last_was_header = True, False, False

    def _continues_cmdline(self, record: Record) -> bool:
        """A command line runs over several lines until the Python version line or a thread header."""
        if record.kind is Kind.PYTHON:
            self.in_cmdline = False
            return True
        if self.section is not None and record.kind is not Kind.THREAD:
            self.section.cmdline += " " + record.line.body
            return True
        self.in_cmdline = False
        return False

    def _thread(self, record: Record) -> None:
        assert record.match is not None
        m, section = record.match, self.section or self._start(None, None)
        self.frame, self.in_locals = None, False
        name = printable(m[3] or "")
        new = ThreadHeader(
            ident=m[1], name=name, active=m[2] != "idle", frames=[], context=[*self.pending, record.line]
        )
        last = self.group[-1] if self.group else None
        if self.last_was_header and last is not None and not last.frames and last.name == name:
            new.frames, new.unread = last.frames, last.unread  # grouped: one stack, many headers
            self.group.append(new)
        else:
            self.group = [new]
        section.threads.append(new)
        self.pending, self.last_was_header = [], True

    def _other(self, record: Record) -> None:
        line = record.line
        if self.in_locals and self.frame is not None and record.local is not None:
            self.frame.locals.append((record.local["name"], record.local["repr"]))
            self._keep_prefix(line)
        elif self.frame is not None and record.locals_head:
            self.in_locals = True
        elif record.frame is not None and ": " not in record.frame[0] and record.command is None:
            self._frame(record.frame, line)
        elif record.command is not None:
            self._start(record.command.pid, line, from_command=True)
            self.in_locals = False
        else:
            self.in_locals = False
            self.pending.append(line)

    def _frame(self, where: tuple[str, str], line: Line) -> None:
        section = self.section or self._start(None, None)
        self.frame, self.in_locals = RawFrame(printable(where[0]), where[1]), False
        if self.group:
            self.group[0].frames.append(self.frame)
            if self.pending:
                self.group[-1].unread[0] += _unread(self.pending)
        else:
            section.stray.append(self.frame)
        self._keep_prefix(line, self.pending)
        self.pending = []

    def _keep_prefix(self, line: Line, pending: Sequence[Line] = ()) -> None:  # a prefix is a rank fact
        extra = [*pending] + ([Line(line.prefix, "", line.prefix)] if line.prefix else [])
        if extra and (self.group or self.section is not None):
            self._context().extend(extra)


def sections(lines: list[Line]) -> list[Section]:
    parser = Parser()
    feed = parser.feed
    for line in lines:
        feed(record_of(line))
    return parser.finish()


def _split_lead_in(pending: list[Line], prefix: str) -> tuple[list[Line], list[Line]]:
    """The lines before a new process: those that end the previous one, and the run that leads into the new
    one. A line behind another log prefix than the new header's belongs to what came before."""
    cut = len(pending)
    while cut > 0 and (not pending[cut - 1].prefix or pending[cut - 1].prefix == prefix):
        cut -= 1
    return pending[:cut], pending[cut:]


def _unread(pending: list[Line]) -> int:
    return sum(1 for line in pending if line.body and not command(line.body))
