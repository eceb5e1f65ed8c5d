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
from dataclasses import dataclass
from itertools import pairwise

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.failed import failure_reason
from mtpdiag.inputs.lines import Line, clean_lines, is_python_file
from mtpdiag.inputs.pyspy_sections import RawFrame, Section, ThreadHeader, sections
from mtpdiag.inputs.settle import captures_of, thread
from mtpdiag.layout.cmdline import layout_hints, merge_hints
from mtpdiag.model import Frame, FrameArgs, ThreadStack, printable
from mtpdiag.vocabulary.ops import is_launcher_argv
from mtpdiag.vocabulary.stacks import display_path, kept_args

_LINE_NO = re.compile(r"[0-9]{1,9}")
_ADDRESS = re.compile(r"^0x[0-9A-Fa-f]{1,16}$")
_SNIFF = re.compile(
    r"(?:^|[\s\]:)])(?:Thread (?:0x[0-9A-Fa-f]{1,16}|[0-9]{1,10}) \((?:idle|active|active\+gil|gil)\)"
    r"|Process [0-9]{1,10}: )",
    re.MULTILINE,
)
MAIN = "MainThread"
FORM = "py-spy text"


def sniff(text: str, _path: str) -> bool:
    return _SNIFF.search(text) is not None


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    dumps = [d for section in sections(lines) for d in _dumps(section)]
    return captures_of(path, FORM, dumps, lines, context)


@dataclass(frozen=True)
class TextProcess:
    """One process of a py-spy text dump (the interface tests and callers used before ``inputs``)."""

    pid: int | None
    threads: tuple[ThreadStack, ...]
    hints: dict[str, int]
    launcher: bool = False


def parse_text_dump(text: str) -> list[TextProcess]:
    """The processes of ``py-spy dump`` text that hold at least one thread, threads in JSON order."""
    dumps = [d for section in sections(clean_lines(text)) for d in _dumps(section)]
    return [TextProcess(d.pid, d.threads, dict(d.hints), d.launcher) for d in dumps if d.threads]


# ---------------------------------------------------------------- sections into processes


def _dumps(section: Section) -> list[Dumped]:
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
        threads = [ThreadHeader(ident="0", name="", active=False, frames=section.stray)]
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


def _split_at_main_threads(threads: list[ThreadHeader]) -> list[list[ThreadHeader]]:
    """One process per ``MainThread`` header: py-spy prints a process's main thread first."""
    mains = [i for i, t in enumerate(threads) if t.name == MAIN]
    if len(mains) < 2:
        return [threads]
    cuts = [0] + mains[1:] + [len(threads)]
    return [threads[a:b] for a, b in pairwise(cuts) if a < b]


def _pid_of_main(threads: list[ThreadHeader]) -> int | None:
    for t in threads:
        if t.name == MAIN and not t.ident.startswith("0x"):
            return int(t.ident)
    return None


def _stacks(threads: list[ThreadHeader], native: bool) -> tuple[ThreadStack, ...]:
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


def _unreadable(threads: list[ThreadHeader], stacks: tuple[ThreadStack, ...], pid: int | None) -> str | None:
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


def _is_native_where(frame: RawFrame) -> bool:
    """A location with no line number (``libc.so.6``) or an address for a name: a ``--native`` dump."""
    where = frame.where
    _, colon, line_no = where.rpartition(":")
    return not (colon and _LINE_NO.fullmatch(line_no)) or _ADDRESS.match(frame.function) is not None


def _frame(frame: RawFrame, native_dump: bool) -> Frame:
    function, where, locals_ = frame.function, frame.where, frame.locals
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
