"""Which rank a dump is: from its file name, ``RANK=`` lines, log prefixes, process titles,
whitelisted command-line flags, or ``--rank-from``.

Every source found for one process must agree; two that disagree are an input error naming both,
because guessing would put a stack on the wrong rank. ``--rank-from REGEX`` (first group = rank) is the
user's word and goes first: it is searched in the lines around the process, then in the file's path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import msgspec

from mtpdiag.errors import InputError
from mtpdiag.inputs.base import Dumped
from mtpdiag.inputs.lines import env_lines
from mtpdiag.model import decimal, printable

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)
_R_IN_NAME = re.compile(r"(?:^|[^a-z0-9])r(\d+)(?![0-9])", re.IGNORECASE)
_RANK_PREFIX = re.compile(r"^\[?rank ?([0-9]{1,9})\]?:?$", re.IGNORECASE)  # torch's [rank3]:, or rank3:
# sglang names its schedulers by their coordinates: the TP rank is the global rank only without PP/DP
# stages in front of it (``sglang::scheduler_TP3``, log prefix ``[2026-01-29 13:12:37 TP3]``).
_TP = re.compile(r"(?:^|[\s_\[])TP([0-9]{1,9})(?=$|[\s_\]])")
_STAGED = re.compile(r"(?:^|[\s_\[])(?:PP|DP|EP)[1-9][0-9]{0,8}(?=$|[\s_\]])")
_FILE_HEADER = re.compile(r"^==> (.{1,300}) <==$")  # what ``head``/``tail`` print between the files they join
_RANK_FLAG = re.compile(r"(?:^|\s)--(?:global[-_])?rank(?:=|\s+)([0-9]{1,9})(?=\s|$)")


class Claim(msgspec.Struct, frozen=True):
    """One source's word on a rank, and where it was read (for the error when two disagree)."""

    rank: int
    where: str


def rank_from_name(path: str) -> int | None:
    """Rank in a file name: ``rank3``, ``rank-3``, ``rank_3`` or ``r3`` (the last one named wins)."""
    name = os.path.basename(path)
    for pattern in (_RANK_IN_NAME, _R_IN_NAME):
        found = pattern.findall(name)
        if found:
            return int(found[-1])
    return None


def compile_rank_from(regex: str | None) -> re.Pattern[str] | None:
    """``--rank-from``: a regular expression whose first group is the rank; InputError if it is not one."""
    if regex is None:
        return None
    try:
        pattern = re.compile(regex)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InputError(f"--rank-from {regex!r} is not a regular expression ({exc})") from None
    if pattern.groups < 1:
        raise InputError(f"--rank-from {regex!r} has no group: put the rank in parentheses, e.g. 'worker-(\\d+)'")
    return pattern


def rank_of(dump: Dumped, path: str, single: bool, rank_from: re.Pattern[str] | None) -> int | None:
    """The rank of one dumped process; ``single``: the file holds only this process (its name counts)."""
    if rank_from is not None:
        found = _rank_from(dump, path if single else None, rank_from)
        if found is not None:
            return found
    claims = list(claims_of(dump))
    if single:
        named = rank_from_name(path)
        if named is not None:
            claims.insert(0, Claim(named, f"the file name ({os.path.basename(path)})"))
    for claim in claims[1:]:
        if claim.rank != claims[0].rank:
            first = claims[0]
            raise InputError(
                f"{path}: {first.where} says rank {first.rank} but {claim.where} says rank "
                f"{claim.rank} (pass --rank-from REGEX to say which)"
            )
    return claims[0].rank if claims else None


def claims_of(dump: Dumped) -> Iterator[Claim]:
    """Every rank the lines around a process name, in the order a person would trust them."""
    rank = decimal(env_lines(line.body for line in dump.context).get("RANK"))
    if rank is not None:
        yield Claim(rank, f"a RANK={rank} line")
    for line in dump.context:
        if line.body.startswith("==> ") and (m := _FILE_HEADER.match(line.body)):
            named = rank_from_name(m[1])
            if named is not None:
                yield Claim(named, f"the file header {printable(line.body)[:80]}")
    for prefix in dict.fromkeys(line.prefix for line in dump.context if line.prefix):
        m = _RANK_PREFIX.match(prefix)
        if m:
            yield Claim(int(m[1]), f"the log prefix {printable(prefix)[:40]}")
        elif (tp := _tp(prefix)) is not None:
            yield Claim(tp, f"the log prefix {printable(prefix)[:40]}")
    if dump.title and (tp := _tp(dump.title)) is not None:
        yield Claim(tp, f"the process title {printable(dump.title)[:60]}")
    if dump.cmdline and (m := _RANK_FLAG.search(dump.cmdline)):
        yield Claim(int(m[1]), f"--rank {m[1]} on its command line")


def rank_of_prefix(prefix: str) -> int | None:
    """The rank a log prefix names (torch's ``[rank3]:``, sglang's ``[date TP3]``), or None."""
    m = _RANK_PREFIX.match(prefix)
    return int(m[1]) if m else _tp(prefix)


def _tp(text: str) -> int | None:
    m = _TP.search(text)
    if m is None or _STAGED.search(text):
        return None
    return int(m[1])


def _rank_from(dump: Dumped, path: str | None, pattern: re.Pattern[str]) -> int | None:
    texts = [line.raw for line in dump.context] + ([dump.title] if dump.title else [])
    if path is not None:
        texts.append(path)
    for text in texts:
        m = pattern.search(text)
        if m and m.group(1) is not None:
            rank = decimal(m.group(1))
            if rank is not None:
                return rank
    return None
