"""A log's physical lines joined back into the lines torch wrote (pure), for ``inputs.watchdog_log``.

Pasted logs arrive wrapped: a terminal or an issue tracker breaks a long line at a column (inside a word or a
number: ``NumelOut=5872`` / ``0256``, ``OpTy`` / ``pe=``, padding the rest of the row with spaces), an editor
breaks it at a space and drops the space (``[Rank 0]`` / ``Watchdog caught``), a mail quote indents what
follows. A line is joined with the next only while it holds the start of a watchdog record whose end is
missing (an open ``WorkNCCL(`` or bracket, a status line without its ``last completed`` number, a c10d log
line that does not end as torch ends one: ``.``, ``:`` or the status line's last number), and only when the
next line starts no record of its own (no ``[rankN]:`` prefix, glog header, ``what():``, C++ frame or NCCL
INFO line) and is not blank; or when a line ends in a status number and the next goes on with digits. Two
complete lines are never joined, whatever they hold; a record cut off by the end of a paste stays as it is.

The seam keeps one space where either side had whitespace (a wrap at a space) and none where neither had (a
wrap inside a word or a number), so a number split across rows is read whole. The record readers accept a
missing space between words for wraps that dropped one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MAX_LINE = 65536  # characters of a physical line that are read
MAX_JOINED = 64  # physical lines joined into one at most (a 600-column line wrapped at 10)

# Starts of a watchdog record, each with what must follow before the record is complete.
_TIMEOUT_TEXT = re.compile(r"(?:Watchdog\s*caught\s*collective\s*operation\s*timeout|watchdog\s*thread\s*terminated)")
_STATUS_TEXT = re.compile(
    r"(?:detected\s*by\s*watchdog|Timeout\s*at\s*NCCL|work\s*sequence\s*id|PG\s*status|Received\s*a\s*(?:dump|timeout)"
    r"|[Ll]ast\s*enqueued)"
)
_STATUS_WORDS = ("etected", "NCCL work", "NCCLwork", "equence", "tatus", "eceived", "nqueued")  # spaces aside
_COMPLETED = re.compile(r"last\s*completed\s*(?:NCCL\s*)?work:\s*-?\d")
_RAN_CUT = re.compile(r"\)\s*ran(?:\s*f(?:or?)?)?(?:\s*\d+)?$")  # "ran for 6000" cut before "22 milliseconds"
# A bracket left open by the cut: a glog header ("[E1130 10:00:01.12"), a group prefix ("[PG 0 Rank").
_OPEN_BRACKET = re.compile(r"\[(?:PG|Rank|rank|[EWIF]\d)[^\[\]]{0,200}$")
_IN_HEADER = re.compile(r"\[[EWIF]\d{0,4}[^\[\]]{0,80}$")
# A c10d log line (glog's "file:line]" or an exception's "what():") is whole when it ends as torch ends one.
_HEADER = re.compile(r"\.(?:cpp|cc|h|hpp):\d{1,6}\]|what\(\):")
_ENDED = re.compile(r"(?:[.:!]|work:\s*-?\d{1,20}|trace:\s*\d{1,3})$")
# A number cut at the end of a line that ends in it ("last completed work: 11" / "15").
_CUT_NUMBER = re.compile(r"work:\s*-?\d{1,20}$")
_NUMBER_REST = re.compile(r"\d{1,20}(?:\.(?:This|\s*$)|\s*$)")  # then the line's end, or a signal's ".This is …"
# What only the first physical line of a record holds.
_RECORD_START = re.compile(
    r"\[rank\d{1,9}\]:|ProcessGroupNCCL\.cpp:\d|what\(\):|Exception raised from|terminate called|frame #\d"
    r"|Traceback \(|NCCL (?:INFO|WARN)"
)
_GLOBAL = re.compile(r"\[rank\d{1,9}\]:")
_HINTS = ("NCCL", "atchdog", "[PG", "[Rank", "[rank", "[E", "nqueued", "what()")


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(number of the first physical line, the line torch wrote)`` for each line of ``text``."""
    lines = text.splitlines()
    count = len(lines)
    index = 0
    while index < count:
        line = lines[index][:MAX_LINE]
        first = index = index + 1
        if any(hint in line for hint in _HINTS):
            joined = 1
            while index < count and joined < MAX_JOINED and joins(line, lines[index]):
                line = seam(line, lines[index][:MAX_LINE])
                index += 1
                joined += 1
        yield first, line


def joins(head: str, rest: str) -> bool:
    """Whether ``rest`` is the rest of ``head``: ``head`` is an unfinished record and ``rest`` starts none of
    its own (the end of a glog header cut in two aside), or ``head`` ends in a number that ``rest`` goes on.
    ``rest`` is asked first: in a log most lines start a record of their own."""
    if not rest.strip():
        return False
    if head[-1:].isdigit() and _CUT_NUMBER.search(head[-40:]) and _NUMBER_REST.match(rest):
        return True
    start = _RECORD_START.search(rest, 0, 400)
    if start is not None and not (
        start.group().startswith("ProcessGroupNCCL")
        and _GLOBAL.search(rest, 0, 400) is None
        and _IN_HEADER.search(head.rstrip()[-90:]) is not None
    ):
        return False
    return is_open(head)


def is_open(line: str) -> bool:
    """Whether ``line`` holds the start of a watchdog record whose end is not on it (each test asked only of
    lines holding its words: most lines of a log hold none)."""
    tail = line.rstrip()
    end = tail[-220:]
    bracket = end.rfind("[")
    if bracket > end.rfind("]") and _OPEN_BRACKET.match(end, bracket):
        return True
    if "WorkNCCL(" in tail and _work_open(tail):
        return True
    if "ran" in end and _RAN_CUT.search(line[-60:]):
        return True
    if "atchdog" in tail and "WorkNCCL(" not in tail and _TIMEOUT_TEXT.search(tail):
        return True
    if any(word in tail for word in _STATUS_WORDS):
        status = _STATUS_TEXT.search(tail)
        if status is not None and _COMPLETED.search(tail, status.start()) is None:
            return True
    return _ENDED.search(end[-40:]) is None and _HEADER.search(tail) is not None


def _work_open(tail: str) -> bool:
    """A ``WorkNCCL(`` whose closing parenthesis is not on the line (``Timeout(ms)`` aside)."""
    start = tail.rfind("WorkNCCL(")
    return start >= 0 and ")" not in tail[start + 9 :].replace("(ms)", "")


def seam(head: str, rest: str) -> str:
    """``head`` and ``rest`` joined: one space where either had whitespace at the cut, none where neither."""
    stripped_head, stripped_rest = head.rstrip(), rest.lstrip()
    gap = " " if len(stripped_head) < len(head) or len(stripped_rest) < len(rest) else ""
    return stripped_head + gap + stripped_rest
