"""Python's ``faulthandler`` output: ``faulthandler.dump_traceback(all_threads=True)``, a handler from
``faulthandler.register(signal.SIGUSR1)``, ``dump_traceback_later`` timeouts, fatal errors.

Its stacks are innermost first, as mtpdiag's are ("most recent call first"). It names no pid and no
main thread: ``Current thread`` is the one that dumped, and the main thread is taken to be the one that
``threading`` did not start (``settle.main_first``). A log may hold several dumps: a new one starts at a
``Timeout (…)!`` line, any other line between two threads (one dump separates them by blank lines only),
a change of log prefix, or when a thread shows up again. Dumps of one process
(none names another rank) are its repeats: the last is read, and a note says so.
"""

from __future__ import annotations

import re

import msgspec

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.identity import claims_of
from mtpdiag.inputs.lines import Line, clean_lines
from mtpdiag.inputs.settle import captures_of, main_first, thread
from mtpdiag.model import Frame, printable
from mtpdiag.vocabulary.stacks import display_path

_HEADER = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9A-Fa-f]{1,16})(?: \[(?P<name>[^\]]*)\])?"
    r" \(most recent call first\):$"
)
_STACK = re.compile(r"^Stack \(most recent call first\):$")
_FRAME = re.compile(r'^File "(?P<file>.*)", line (?P<line>[0-9]{1,9}|\?\?\?) in (?P<function>.+)$')
_BREAK = re.compile(r"^(?:Timeout \([0-9:.]+\)!|Fatal Python error: .*)$")
_SNIFF = re.compile(
    r"(?:(?:Current thread|Thread) 0x[0-9A-Fa-f]{1,16}(?: \[[^\]\n]*\])?|(?:^|\s)Stack)"
    r" \(most recent call first\):",
    re.MULTILINE,
)
FORM = "faulthandler"


class _Thread(msgspec.Struct):
    """One thread header and the frames read under it so far."""

    ident: str
    name: str
    current: bool
    frames: list[Frame] = msgspec.field(default_factory=list)


class _Dump(msgspec.Struct):
    """One dump as it is read: its threads, the lines that may name its process, and its log prefix."""

    prefix: str
    threads: list[_Thread] = msgspec.field(default_factory=list)
    context: list[Line] = msgspec.field(default_factory=list)


def sniff(text: str, _path: str) -> bool:
    return _SNIFF.search(text) is not None


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    dumps = [_dumped(dump) for dump in _dumps(lines)]
    notes: list[str] = []
    return captures_of(path, FORM, _last_of_each_process(path, dumps, notes), lines, context, notes)


def _dumps(lines: list[Line]) -> list[_Dump]:
    """Each dump: its threads (ident, name, current, frames) and its context lines."""
    dumps: list[_Dump] = []
    dump: _Dump | None = None
    current: _Thread | None = None
    pending: list[Line] = []
    for line in lines:
        body = line.body
        header = _HEADER.match(body)
        if header or _STACK.match(body):
            ident = header["ident"] if header else "0x0"
            if (
                dump is None
                or any(t.ident == ident for t in dump.threads)
                or any(x.body for x in pending)
                or line.prefix != dump.prefix
            ):
                dump = _Dump(prefix=line.prefix)
                dumps.append(dump)
            dump.context.extend([*pending, line])
            current = _Thread(
                ident=ident,
                name=printable(header["name"] or "") if header else "",
                current=bool(header and header["current"] == "Current thread"),
            )
            dump.threads.append(current)
            pending = []
        elif current is not None and (m := _FRAME.match(body)):
            line_no = m["line"]
            current.frames.append(
                Frame(
                    function=printable(m["function"]),
                    file=display_path(printable(m["file"])),
                    line=int(line_no) if line_no.isdigit() else 0,
                )
            )
            if line.prefix and dump is not None:
                dump.context.append(Line(line.prefix, "", line.prefix))
        elif _BREAK.match(body):
            dump = current = None
            pending.append(line)
        elif body:
            pending.append(line)
    if pending and dump is not None:
        dump.context.extend(pending)
    return dumps


def _dumped(dump: _Dump) -> Dumped:
    stacks = [thread(int(t.ident, 16), t.name, tuple(t.frames)) for t in dump.threads]
    current = next((i for i, t in enumerate(dump.threads) if t.current), None)
    error = None
    if not any(s.frames for s in stacks):
        n = len(stacks)
        error = f"faulthandler output with {n} thread header{'s' if n != 1 else ''} but no frame could be read"
    return Dumped(pid=None, threads=main_first(stacks, current), context=tuple(dump.context), error=error)


def _last_of_each_process(path: str, dumps: list[Dumped], notes: list[str]) -> list[Dumped]:
    """Dumps that name the same ranks (or none) are one process dumped again: keep its last."""
    last: dict[tuple[int, ...], int] = {}
    count: dict[tuple[int, ...], int] = {}
    for i, dump in enumerate(dumps):
        key = tuple(sorted({c.rank for c in claims_of(dump)}))
        last[key] = i
        count[key] = count.get(key, 0) + 1
    for key, n in count.items():
        if n > 1:
            who = f"rank {key[0]}" if len(key) == 1 else "one process"
            notes.append(f"{path}: faulthandler dumped {who} {n} times; the last dump is read")
    return [dumps[i] for i in sorted(last.values())]


READER = Reader(name=FORM, sniff=sniff, read=read)
