"""Pasted text as clean lines: colour codes, carriage returns, indentation and log prefixes taken off.

People paste dumps through terminals, chat and tickets: lines arrive reindented (tabs, two spaces,
none), with CRLF endings, ANSI colour, shell prompts before them and log prefixes (``[rank3]:``,
``[2026-01-29 13:12:37 TP1]``) in front of every line. Readers match on a line's content, never on
its indentation, so every one of those reads the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from mtpdiag.model import ENV_WHITELIST, printable

# CSI sequences (colour, cursor) and OSC sequences (terminal titles, links).
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# A log prefix at the very start of a line: ``[rank3]:``, ``[2026-01-29 13:12:37 PP2 TP1]``,
# ``(WorkerDict pid=1234, ip=10.0.0.1)``, ``rank3:``, a job runner's ``worker-0 >>`` (a word with a digit:
# ``x >> 2`` is code). Never a frame: frames do not start with these. Runners stack them
# (``[date] worker-0 >> [rank0]:``): all are taken off.
_PREFIXES = r"\[[^\[\]\n]{1,100}\]:?|\([A-Za-z_][\w.:]* pid=[0-9]+[^()\n]{0,80}\)|rank[0-9]{1,9}:"
_PREFIX = re.compile(rf"^(?:{_PREFIXES})[ \t]?")
_PREFIX_OR_RUNNER = re.compile(rf"^(?:{_PREFIXES}|[\w.:-]{{0,60}}[0-9][\w.:-]{{0,40}} >>)[ \t]?")  # texts with " >>"
# A shell command running py-spy or pystack, after a prompt (``$ ``, ``root@node:~# ``) or alone.
_COMMAND = re.compile(
    r"(?:^|[$#%>]\s*|\s)(?:sudo\s+(?:-\S+\s+)*)?(?:\S*/)?(?P<tool>py-spy|pystack)\s+(?P<args>(?:dump|remote|core)\b.*)$"
)
_PID_ARG = re.compile(r"(?:--pid[= ]\s*|-p\s*|\bremote\s+(?:--?\S+\s+)*)([0-9]{1,10})\b")
_LOCATION_ONLY = re.compile(r"^\([^()]*\)$")
_ENV_LINE = re.compile(r"^(?:export\s+)?(?P<key>[A-Z_]+)\s*[=:]\s*(?P<value>\S+)\s*$")
PYTHON_SOURCE = (".py", ".pyw")
# Keys that describe the whole job (any line of a paste may carry them); the rest describe one process.
JOB_KEYS = frozenset({"WORLD_SIZE", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"})


class Line(msgspec.Struct, frozen=True):
    """One line: its log prefix (if any; of stacked prefixes, the one next to the content, which is the rank's:
    ``[rank0]:`` in ``[date] worker-0 >> [rank0]:``) and its content with the surrounding whitespace removed."""

    prefix: str
    body: str
    raw: str  # the line without colour codes and line ending: what rank facts are read from


class Command(msgspec.Struct, frozen=True):
    """A ``py-spy dump``/``pystack remote`` command line found in a paste."""

    tool: str
    pid: int | None
    native: bool


def without_escapes(text: str) -> str:
    """``text`` without terminal escape sequences (colour, titles): what the person saw, not what was sent."""
    return _ESCAPES.sub("", text) if "\x1b" in text else text


def clean_lines(text: str) -> list[Line]:
    """``text`` split into lines, each without colour, line ending, indentation or log prefix."""
    text = without_escapes(text)
    runner = " >>" in text  # a job runner's ``name-0 >>`` prefix: looked for only in a text that has one
    pattern = _PREFIX_OR_RUNNER if runner else _PREFIX
    out = []
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        stripped = raw.strip()
        prefix = ""
        if stripped[:1] in "[(r" or (runner and " >>" in stripped):
            m = pattern.match(stripped)
            if m and not _looks_like_frame_start(stripped, m.end()):
                prefix, stripped = _inner_prefix(pattern, m.group().strip(), stripped[m.end() :].strip())
        out.append(Line(prefix, stripped, raw))
    return out


def _inner_prefix(pattern: re.Pattern[str], prefix: str, rest: str) -> tuple[str, str]:
    """Stacked prefixes (``[date] worker-0 >> [rank0]:``) all taken off: the last, next to the text, is kept."""
    while m := pattern.match(rest):
        if _looks_like_frame_start(rest, m.end()):
            break
        prefix, rest = m.group().strip(), rest[m.end() :].strip()
    return prefix, rest


def _looks_like_frame_start(text: str, end: int) -> bool:
    """``(libc.so.6)`` alone is no prefix; neither is ``[unknown] (x.so)``, a native frame."""
    rest = text[end:].strip()
    return not rest or _LOCATION_ONLY.match(rest) is not None


def command(body: str) -> Command | None:
    """The py-spy/pystack command a pasted prompt line ran, if it is one."""
    if "py-spy" not in body and "pystack" not in body:
        return None
    m = _COMMAND.search(body)
    if not m:
        return None
    pid = _PID_ARG.search(m["args"])
    return Command(tool=m["tool"], pid=int(pid[1]) if pid else None, native="--native" in m["args"])


def env_lines(bodies: Iterable[str]) -> dict[str, str]:
    """Whitelisted ``KEY=value`` lines pasted next to a dump (e.g. ``RANK=3``); nothing else."""
    out: dict[str, str] = {}
    for body in bodies:
        if "=" not in body and ":" not in body:
            continue
        m = _ENV_LINE.match(body)
        if m and m["key"] in ENV_WHITELIST:
            out[m["key"]] = printable(m["value"])
    return out


def is_python_file(file: str) -> bool:
    """A Python source as dumps name it: ``x.py``, ``<string>``, ``<frozen importlib._bootstrap>``."""
    return file.endswith(PYTHON_SOURCE) or (file.startswith("<") and file.endswith(">"))
