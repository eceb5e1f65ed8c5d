"""What every reader of an input file shares: the reader interface and what a reader hands back.

A reader is a name, a cheap ``sniff(text, path)`` that says whether the text is its format, and
``read(text, path, context)`` (the JSON readers take the file's bytes too, which msgspec decodes
directly). The registry (``inputs.registry``) asks them in order; the first that sniffs the text reads it.
Readers of pasted text return ``Dumped`` processes; ``inputs.settle`` turns those into ``RankCapture``s
(rank identity, merging, unreadable ranks) the same way for every format.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from mtpdiag.model import RankCapture, Snapshot, ThreadStack

if TYPE_CHECKING:  # the text readers' line type: loaded with the first text file, never for bundles
    from mtpdiag.inputs.lines import Line


class ReadContext(msgspec.Struct, frozen=True):
    """What the caller of ``load_paths`` passes down to every reader."""

    rank_from: re.Pattern[str] | None = None  # --rank-from: its first group is the rank


class FileCaptures(msgspec.Struct, frozen=True):
    """What one file contributed. ``notes`` say what was merged or guessed (one line each)."""

    path: str
    captures: tuple[RankCapture, ...]
    snapshot: Snapshot | None = None  # set for bundles
    notes: tuple[str, ...] = ()
    form: str = ""  # the reader's name


class Reader(msgspec.Struct, frozen=True):
    """One input format."""

    name: str
    sniff: Callable[[str, str], bool]
    read: Callable[[str, str, ReadContext], FileCaptures]


class Dumped(msgspec.Struct, frozen=True):
    """One process as a pasted dump shows it, before its rank is settled.

    ``context`` holds the lines that may name the process (its header, the lines that lead into it, the
    log prefixes of its lines); it is read for rank and environment facts and then dropped, never
    stored. ``error`` is set when no frame could be read (the tool failed, or the text is mangled).
    """

    pid: int | None
    threads: tuple[ThreadStack, ...]
    context: tuple[Line, ...] = ()
    title: str = ""  # the command line's first word (a process title such as sglang::scheduler_TP3)
    cmdline: str = ""  # read for whitelisted facts only (--rank N), never stored
    hints: tuple[tuple[str, int], ...] = ()
    launcher: bool = False
    native: bool = False
    error: str | None = None
