"""``py-spy dump`` text as people paste it: one process or many, plain, ``--locals`` or ``--native``.

Lines are matched on their content, never their indentation (see ``inputs.lines``). What is read:

* ``Process N: <command line>`` starts a process (the command line, which may run over several lines,
  is reduced to layout hints, a process title and whitelisted flags, then dropped); so does a pasted
  ``$ py-spy dump --pid N`` prompt. Without either, every ``MainThread`` header starts a process.
* Several ``Thread`` headers of one name in a row, then one stack: a grouped paste (identical stacks
  deduplicated by hand); each header gets the stack.
* ``Arguments:``/``Locals:`` blocks: only ``kept_args`` of torch.distributed frames survive.
* ``--native``: frames of C/C++ code (a library instead of ``file.py:line``) get ``Frame.native``.
* A process with headers but no readable frame is an unreadable rank with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.failed import failure_reason
from mtpdiag.inputs.lines import Line, clean_lines, command, is_python_file
from mtpdiag.inputs.settle import captures_of, thread
from mtpdiag.layout.cmdline import layout_hints, merge_hints
from mtpdiag.model import Frame, FrameArgs, ThreadStack, printable
from mtpdiag.vocabulary.ops import is_launcher_argv
from mtpdiag.vocabulary.stacks import display_path, kept_args

# Numbers are ASCII and bounded: py-spy never prints others, and int() refuses 5000-digit strings.
_PROCESS = re.compile(r"^Process ([0-9]{1,10}): ?(.*)$")
_PARENT = re.compile(r"^Parent Process ([0-9]{1,10}): ?(.*)$")
_PYTHON = re.compile(r"^Python v[0-9]")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]{1,16}|[0-9]{1,10}) \((idle|active|active\+gil|gil)\)(?:: "(.*)")?$')
_FRAME = re.compile(r"^(?P<function>\S.*?) \((?P<where>[^()]*)\)$")
_LOCALS_HEAD = re.compile(r"^(?:Arguments|Locals):$")
_LOCAL = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*): (?P<repr>.*)$")
_LINE_NO = re.compile(r"[0-9]{1,9}")
_ADDRESS = re.compile(r"^0x[0-9A-Fa-f]{1,16}$")
_SNIFF = re.compile(
    r"(?:^|[\s\]:)])(?:Thread (?:0x[0-9A-Fa-f]{1,16}|[0-9]{1,10}) \((?:idle|active|active\+gil|gil)\)"
    r"|Process [0-9]{1,10}: )",
    re.MULTILINE,
)
MAIN = "MainThread"
FORM = "py-spy text"


@dataclass
class _Thread:
    ident: str
    name: str
    active: bool
    frames: list  # shared by the headers of a grouped paste
    context: list = field(default_factory=list)
    unread: list = field(default_factory=lambda: [0])  # shared like frames


@dataclass
class _Section:
    pid: int | None = None
    cmdline: str = ""
    parents: list = field(default_factory=list)
    context: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    stray: list = field(default_factory=list)  # frames with no Thread header above them
    from_command: bool = False
    bodies: list = field(default_factory=list)  # every line, for a tool's error


def sniff(text: str, path: str) -> bool:
    return _SNIFF.search(text) is not None


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    dumps = [d for section in _sections(lines) for d in _dumps(section)]
    return captures_of(path, FORM, dumps, lines, context)


@dataclass(frozen=True)
class TextProcess:
    """One process of a py-spy text dump (the interface tests and callers used before ``inputs``)."""

    pid: int | None
    threads: tuple[ThreadStack, ...]
    hints: dict
    launcher: bool = False


def parse_text_dump(text: str) -> list[TextProcess]:
    """The processes of ``py-spy dump`` text that hold at least one thread, threads in JSON order."""
    dumps = [d for section in _sections(clean_lines(text)) for d in _dumps(section)]
    return [TextProcess(d.pid, d.threads, dict(d.hints), d.launcher) for d in dumps if d.threads]


# ---------------------------------------------------------------- reading lines into sections


def _sections(lines: list[Line]) -> list[_Section]:
    sections: list[_Section] = []
    section: _Section | None = None
    group: list[_Thread] = []  # the headers that receive the next frames
    frame: list | None = None  # [function, where, locals] of the last frame, for its locals
    in_cmdline = in_locals = False
    pending: list[Line] = []  # lines since the last frame: they lead into what comes next
    last_was_header = False

    def start(pid: int | None, line: Line | None, from_command: bool = False) -> _Section:
        nonlocal section, group, frame, pending
        before, lead_in = _split_lead_in(pending, line.prefix if line else "")
        if before and section is not None:
            (group[-1].context if group else section.context).extend(before)
        section = _Section(pid=pid, from_command=from_command, context=[*lead_in, *([line] if line else [])])
        sections.append(section)
        group, frame, pending = [], None, []
        return section

    for line in lines:
        body = line.body
        if section is not None:
            section.bodies.append(body)
        if not body:
            in_cmdline = False
            if line.prefix:
                pending.append(line)
            continue
        if m := _PROCESS.match(body):
            pid = int(m[1])
            if (
                section is not None
                and section.from_command
                and not section.threads
                and (section.pid in (None, pid) or failure_reason(section.bodies) is None)
            ):
                section.pid, section.from_command = pid, False
                section.context += [*pending, line]
                group, frame, pending = [], None, []
            else:
                section = start(pid, line)
            section.cmdline = m[2]
            in_cmdline, in_locals, last_was_header = True, False, False
            continue
        if in_cmdline:
            if _PYTHON.match(body):
                in_cmdline = False
                continue
            if section is not None and not _THREAD.match(body):
                section.cmdline += " " + body
                continue
            in_cmdline = False
        if m := _PARENT.match(body):
            if section is not None:
                section.parents.append(m[2])
            continue
        if _PYTHON.match(body):
            continue
        if m := _THREAD.match(body):
            if section is None:
                section = start(None, None)
            frame, in_locals = None, False
            name = printable(m[3] or "")
            new = _Thread(ident=m[1], name=name, active=m[2] != "idle", frames=[], context=[*pending, line])
            if last_was_header and group and not group[-1].frames and group[-1].name == name:
                new.frames, new.unread = group[-1].frames, group[-1].unread  # grouped: one stack, many headers
                group.append(new)
            else:
                group = [new]
            section.threads.append(new)
            pending, last_was_header = [], True
            continue
        last_was_header = False
        if in_locals and frame is not None and (m := _LOCAL.match(body)):
            frame[2].append((m["name"], m["repr"]))
            _keep_prefix(line, group, section)
            continue
        if frame is not None and _LOCALS_HEAD.match(body):
            in_locals = True
            continue
        if (m := _FRAME.match(body)) and ": " not in m["function"] and not command(body):
            if section is None:
                section = start(None, None)
            frame, in_locals = [printable(m["function"]), m["where"], []], False
            if group:
                group[0].frames.append(frame)
                group[-1].unread[0] += _unread(pending)
            else:
                section.stray.append(frame)
            _keep_prefix(line, group, section, pending)
            pending = []
            continue
        cmd = command(body)
        if cmd is not None:
            start(cmd.pid, line, from_command=True)
            in_locals = False
            continue
        in_locals = False
        pending.append(line)
    if pending:
        if group:
            group[-1].context.extend(pending)
        elif section is not None:
            section.context.extend(pending)
    return sections


def _split_lead_in(pending: list[Line], prefix: str) -> tuple[list[Line], list[Line]]:
    """The lines before a new process: those that end the previous one, and the run that leads into the new
    one. A line behind another log prefix than the new header's belongs to what came before."""
    cut = len(pending)
    while cut > 0 and (not pending[cut - 1].prefix or pending[cut - 1].prefix == prefix):
        cut -= 1
    return pending[:cut], pending[cut:]


def _keep_prefix(line: Line, group: list[_Thread], section: _Section | None, pending: Sequence[Line] = ()) -> None:
    """A frame line adds its log prefix (a rank fact) and the lines before it to its thread's context."""
    extra = [p for p in pending] + ([Line(line.prefix, "", line.prefix)] if line.prefix else [])
    if not extra:
        return
    if group:
        group[-1].context.extend(extra)
    elif section is not None:
        section.context.extend(extra)


def _unread(pending: list[Line]) -> int:
    return sum(1 for line in pending if line.body and not command(line.body))


# ---------------------------------------------------------------- sections into processes


def _dumps(section: _Section) -> list[Dumped]:
    argv = section.cmdline.split()
    hints = layout_hints(argv)
    for parent in section.parents:
        hints = merge_hints(hints, layout_hints(parent.split()))
    title = argv[0] if argv else ""

    def dumped(
        pid: int | None, threads: tuple[ThreadStack, ...], context: list[Line], error: str | None, native: bool = False
    ) -> Dumped:
        return Dumped(
            pid=pid,
            threads=threads,
            context=tuple(context),
            error=error,
            native=native,
            title=title,
            cmdline=section.cmdline,
            hints=tuple(sorted(hints.items())),
            launcher=is_launcher_argv(argv),
        )

    threads = section.threads
    if not threads and section.stray and failure_reason(section.bodies) is None:
        threads = [_Thread(ident="0", name="", active=False, frames=section.stray)]
    if not threads and section.from_command and failure_reason(section.bodies) is None:
        return []  # a prompt line and nothing the tool printed: no process
    if not threads:
        reason = failure_reason(section.bodies) or (
            "the dump stops after its process header: py-spy printed no thread (a process in "
            "uninterruptible sleep makes a blocking py-spy wait until it is killed)"
            if section.cmdline or section.pid is not None
            else "no Thread header and no frame"
        )
        return [dumped(section.pid, (), section.context, reason)]
    out = []
    for i, part in enumerate(_split_at_main_threads(threads)):
        pid = section.pid if i == 0 and section.pid is not None else _pid_of_main(part)
        context = (section.context if i == 0 else []) + [line for t in part for line in t.context]
        native = any(_is_native_where(f) for t in part for f in t.frames)
        stacks = _stacks(part, native)
        out.append(dumped(pid, stacks, context, _unreadable(part, stacks, pid), native))
    return out


def _split_at_main_threads(threads: list[_Thread]) -> list[list[_Thread]]:
    """One process per ``MainThread`` header: py-spy prints a process's main thread first."""
    mains = [i for i, t in enumerate(threads) if t.name == MAIN]
    if len(mains) < 2:
        return [threads]
    cuts = [0] + mains[1:] + [len(threads)]
    return [threads[a:b] for a, b in pairwise(cuts) if a < b]


def _pid_of_main(threads: list[_Thread]) -> int | None:
    for t in threads:
        if t.name == MAIN and not t.ident.startswith("0x"):
            return int(t.ident)
    return None


def _stacks(threads: list[_Thread], native: bool) -> tuple[ThreadStack, ...]:
    """py-spy prints threads in reverse order of its JSON output; they are put back in JSON order."""
    made: dict[int, tuple[Frame, ...]] = {}  # grouped headers share one frames list: build it once
    out = []
    for t in reversed(threads):
        key = id(t.frames)
        if key not in made:
            made[key] = tuple([_frame(f, native) for f in t.frames])
        native_id = None if t.ident.startswith("0x") else int(t.ident)
        thread_id = native_id if native_id is not None else int(t.ident, 16)
        out.append(thread(thread_id, t.name, made[key], native_id, t.active))
    return tuple(out)


def _unreadable(threads: list[_Thread], stacks: tuple[ThreadStack, ...], pid: int | None) -> str | None:
    if not any(s.frames for s in stacks):
        unread = sum(t.unread[0] for t in threads)
        n = len(threads)
        lines = f" ({unread} line{'s' if unread != 1 else ''} under them not understood)" if unread else ""
        return f"py-spy text with {n} Thread header{'s' if n != 1 else ''} but no frame could be read{lines}"
    main = (
        next((s for s in stacks if pid is not None and s.native_id == pid), None)
        or next((s for s in stacks if s.name == MAIN), None)
        or stacks[0]
    )
    if not main.frames:
        t = threads[len(threads) - 1 - stacks.index(main)]
        if t.unread[0]:
            return f"the main thread's frames could not be read ({t.unread[0]} lines under its Thread header)"
    return None


def _is_native_where(frame: list) -> bool:
    """A location with no line number (``libc.so.6``) or an address for a name: a ``--native`` dump."""
    where = frame[1]
    _, colon, line_no = where.rpartition(":")
    return not (colon and _LINE_NO.fullmatch(line_no)) or _ADDRESS.match(frame[0]) is not None


def _frame(frame: list, native_dump: bool) -> Frame:
    function, where, locals_ = frame
    file, _, line_no = where.rpartition(":")
    if not _LINE_NO.fullmatch(line_no):
        file, line_no = where, "0"
    file = display_path(printable(file))
    native = native_dump and not is_python_file(file)
    return Frame(
        function=function,
        file=file,
        line=int(line_no),
        args=None if native or not locals_ else FrameArgs.of(kept_args(file, locals_)),
        native=native,
    )


READER = Reader(name=FORM, sniff=sniff, read=read)
