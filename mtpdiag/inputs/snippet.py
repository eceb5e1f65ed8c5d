"""A few frame lines pasted with no thread header: "the top frames were ..." in a ticket or chat.

Two shapes: py-spy's ``function (file.py:12)`` (innermost first) and a traceback's
``File "file.py", line 12, in function`` (innermost last, unless the paste says "most recent call
first"; faulthandler's ``line 12 in function``, without the comma, is innermost first). The snippet is
one process with one thread; the shape with more lines wins when both appear.
"""

from __future__ import annotations

import re

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.lines import clean_lines
from mtpdiag.inputs.settle import captures_of, thread
from mtpdiag.model import Frame, printable
from mtpdiag.vocabulary.stacks import display_path

_SPY = re.compile(r"^(?P<function>[^\s()]+) \((?P<file>[^()\s]+?):(?P<line>[0-9]{1,9})\)$")
_TRACEBACK = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>[0-9]{1,9})(?P<comma>,?) in (?P<function>\S+)$')
_SNIFF = re.compile(
    r'^\s*(?:\S*\s)?(?:[^\s()]+ \([^()\s]+?:[0-9]{1,9}\)|File "[^"]+", line [0-9]{1,9},? in \S+)\s*$', re.MULTILINE
)
_FIRST = "most recent call first"
_SNIFF_CHARS = 200_000  # how far the prefix-aware look goes (this reader is the last one asked)
FORM = "frame lines"


def sniff(text: str, _path: str) -> bool:
    """Frame lines, or (behind log prefixes and their indentation: ``[date] worker-0 >> [rank0]:   File ...``)
    frame lines once the prefixes are taken off."""
    if _SNIFF.search(text) is not None:
        return True
    return any(_SPY.match(line.body) or _TRACEBACK.match(line.body) for line in clean_lines(text[:_SNIFF_CHARS]))


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    spy, traceback, rest = [], [], []
    for line in lines:
        if m := _SPY.match(line.body):
            spy.append(m)
        elif m := _TRACEBACK.match(line.body):
            traceback.append(m)
        elif line.body or line.prefix:
            rest.append(line)
    if len(spy) >= len(traceback):
        frames = [_frame(m) for m in spy]
    else:
        frames = [_frame(m) for m in traceback]
        if traceback[0]["comma"] and _FIRST not in text:
            frames.reverse()
    stack = (thread(0, "", tuple(frames)),)
    return captures_of(path, FORM, [Dumped(pid=None, threads=stack, context=tuple(rest))], lines, context)


def _frame(m: re.Match[str]) -> Frame:
    return Frame(function=printable(m["function"]), file=display_path(printable(m["file"])), line=int(m["line"]))


READER = Reader(name=FORM, sniff=sniff, read=read)
