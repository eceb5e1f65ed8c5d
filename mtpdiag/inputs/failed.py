"""A capture that failed: a file holding py-spy's or pystack's error output, or nothing at all.

The rank whose dump failed is often the one that matters (a process in uninterruptible sleep, frozen
by a filesystem, makes a blocking py-spy wait and time out), so such a file is a rank that could not
be read, with the tool's reason in one line, and never an input to skip.
"""

from __future__ import annotations

import re
from itertools import pairwise

from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.lines import Line, clean_lines, command
from mtpdiag.inputs.settle import captures_of
from mtpdiag.model import printable

# (pattern, tool) pairs, matched against a clean line; group 1, when there is one, is the reason.
_ERRORS = (
    (re.compile(r"^Error: (.+)$"), "py-spy"),
    (re.compile(r"^(Permission Denied: .+)$"), "py-spy"),
    (re.compile(r"^\U0001F480 (.+?) \U0001F480$"), "pystack"),
    (re.compile(r"^(?:py-?spy|pystack): error: (.+)$", re.IGNORECASE), ""),
    (re.compile(r"^py-?spy failed to dump PID [0-9]{1,10}\. *(?:Error: *)?(.*)$", re.IGNORECASE), "py-spy"),
    (re.compile(r"^py-?spy failed on pid [^:]{1,20}: *(?:Error: *)?(.*)$", re.IGNORECASE), "py-spy"),
    (re.compile(r"^(?:\S+: )?(?:[0-9]+: )?(?:py-spy|pystack): (?:command )?not found$"), ""),
    (re.compile(r"^(?:timeout: .*|Terminated|Killed)$"), ""),
)
_CAUSE_HEAD = re.compile(r"^Caused by:$")
_CAUSE = re.compile(r"^[0-9]{1,3}: (.+)$")
_FAILED_PID = re.compile(r"py-?spy failed to dump PID ([0-9]{1,10})", re.IGNORECASE)
_TOOL_HEADER = re.compile(r"^(?:Process [0-9]{1,10}:|Python v[0-9])")
_MAX = 300


def failure_reason(bodies: list[str]) -> str | None:
    """The tool's reason in one line (``py-spy: Failed to get stack traces: Failed to suspend process:
    EPERM: Operation not permitted``), or None when no line is a tool's error."""
    parts: list[str] = []
    tool = ""
    causes = False
    for body in bodies:
        if not body:
            continue
        if _CAUSE_HEAD.match(body):
            causes = bool(parts)
            continue
        if causes and (m := _CAUSE.match(body)):
            if m[1] not in parts:
                parts.append(m[1])
            continue
        causes = False
        for pattern, who in _ERRORS:
            m = pattern.match(body)
            if m:
                reason = (m[1] if pattern.groups and m[1] else body).strip()
                if reason and reason not in parts:
                    parts.append(reason)
                tool = tool or who
                break
    if not parts:
        return None
    text = ": ".join(parts)
    text = f"{tool}: {text}" if tool and not text.lower().startswith(tool) else text
    text = printable(" ".join(text.split()))
    return text if len(text) <= _MAX else text[: _MAX - 1] + "…"


def sniff(text: str, _path: str) -> bool:
    if not text.strip():
        return True
    return failure_reason([line.body for line in clean_lines(text)[:400]]) is not None


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    lines = clean_lines(text)
    if not text.strip():
        error = "empty file: the capture printed nothing (a py-spy or pystack that hung and was killed leaves this)"
        return captures_of(path, "empty capture", [Dumped(pid=None, threads=(), error=error)], lines, context)
    dumps = [Dumped(pid=pid, threads=(), context=tuple(chunk), error=reason) for pid, chunk, reason in _chunks(lines)]
    return captures_of(path, "failed capture", dumps, lines, context)


def _chunks(lines: list[Line]) -> list[tuple[int | None, list[Line], str]]:
    """(pid, lines, reason) per command that failed: a paste of a loop over pids holds several."""
    starts = [i for i, line in enumerate(lines) if command(line.body) or _FAILED_PID.search(line.body)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    bounds = list(pairwise([*starts, len(lines)]))
    out = []
    for begin, end in bounds:
        chunk = lines[begin:end]
        reason = failure_reason([line.body for line in chunk])
        if reason is None:
            if any(_TOOL_HEADER.match(line.body) for line in chunk):
                reason = "the dump stops after its header: the tool printed no thread"
            else:
                continue
        out.append((_pid_of(chunk), chunk, reason))
    if not out:
        out.append((None, lines, failure_reason([line.body for line in lines]) or "no stack in this file"))
    return out


def _pid_of(chunk: list[Line]) -> int | None:
    for line in chunk:
        cmd = command(line.body)
        if cmd is not None and cmd.pid is not None:
            return cmd.pid
        m = _FAILED_PID.search(line.body)
        if m:
            return int(m[1])
    return None


READER = Reader(name="failed capture", sniff=sniff, read=read)
