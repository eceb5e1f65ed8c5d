"""Run torch's own Flight Recorder analyzer, ``torchfrtrace``, and read what it reports: an independent check.

``torchfrtrace DIR`` (``torch.distributed.flight_recorder.fr_trace``, shipped with torch) matches the ranks'
dumps collective by collective and logs one block per problem it finds::

    Not all ranks joining collective, sequence number: 1        | Collective sequence number: 2 has errors
    internal record id: 1
    group info: 3:DATA_PARALLEL_GROUP_WITH_CP
    collective: gloo:all_reduce
    missing ranks: {3}                                          | error msg: Culprit rank 3; Error type: ...
    ...
    expected ranks: {2, 3}

Its reference for a block is the first rank (in directory order) that still has entries; the printed
collective is that rank's, and the culprits are the members missing at that number or, when none is
missing, the members whose op, sizes or dtypes differ from the reference's.
"""

from __future__ import annotations

import ast
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpdiag.analysis.flight_recorder import Divergence, match_groups
from mtpdiag.inputs.flight_recorder import load_fr_dumps

_HEADER = re.compile(
    r"^(Not all ranks joining collective|Collective sequence number: \d+ has errors|"
    r"Input/output mismatch in the collective sequence number)(?:, sequence number)?:? ?(\d+)?"
)
_CULPRIT = re.compile(r"Culprit rank (\d+); Error type: (\w+)")


@dataclass(frozen=True)
class FRTraceBlock:
    """One problem torchfrtrace reported. ``kind``: missing (not all ranks joined), errors (op, sizes,
    dtypes or state differ from the reference's) or io (all_to_all totals)."""

    kind: str
    seq: int
    record_id: int
    group: str
    desc: str
    profiling_name: str
    missing: frozenset[int]
    expected: frozenset[int]
    culprits: tuple[tuple[int, str], ...]  # (rank, torch's MatchState name)
    input_sizes: str

    @property
    def culprit_ranks(self) -> frozenset[int]:
        return self.missing if self.kind == "missing" else frozenset(r for r, _ in self.culprits)


def run_torchfrtrace(dump_files: list[Path], prefix: str = "rank_") -> tuple[list[FRTraceBlock], str]:
    """torchfrtrace on a directory holding just ``dump_files`` (pickles named ``<prefix><rank>``): its blocks
    and its whole output. Run in this process (``fr_trace.main``, what the ``torchfrtrace`` script calls),
    reading its log records: a subprocess would pay torch's import each time."""
    from torch.distributed.flight_recorder.components import utils
    from torch.distributed.flight_recorder.fr_trace import main

    if not hasattr(utils, "tabulate"):
        # torch 2.13's utils.py names tabulate unguarded when printing a p2p batch: without the package it
        # raises NameError. Plain rows serve the same purpose here (only the problem blocks are read).
        utils.tabulate = lambda rows, headers=None: "\n".join(map(str, rows))  # noqa: ARG005 - tabulate's signature
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("Flight Recorder")
    keep = Keep(level=logging.DEBUG)
    logger.addHandler(keep)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for f in dump_files:
                shutil.copy(f, Path(tmp) / f.name)
            main([tmp, "-p", prefix, "--allow-incomplete-ranks"])
    finally:
        logger.removeHandler(keep)
    text = "\n".join(records)
    return parse_torchfrtrace(text), text


def parse_torchfrtrace(text: str) -> list[FRTraceBlock]:
    blocks: list[FRTraceBlock] = []
    current: dict | None = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            if current:
                blocks.append(_block(current))
            kind = {"Not": "missing", "Col": "errors", "Inp": "io"}[header.group(1)[:3]]
            seq = header.group(2) or re.search(r"(\d+)", line).group(1)
            current = {"kind": kind, "seq": int(seq)}
            continue
        if current is None or ": " not in line:
            continue
        key, _, value = line.partition(": ")
        if key in (
            "internal record id",
            "group info",
            "collective",
            "missing ranks",
            "expected ranks",
            "error msg",
            "input sizes",
        ):
            current[key] = value.strip()
    if current:
        blocks.append(_block(current))
    return blocks


def first_block_per_group(blocks: list[FRTraceBlock]) -> dict[str, FRTraceBlock]:
    out: dict[str, FRTraceBlock] = {}
    for b in blocks:
        out.setdefault(b.group, b)
    return out


def _block(d: dict) -> FRTraceBlock:
    group, _, desc = d.get("group info", "").partition(":")
    return FRTraceBlock(
        kind=d["kind"],
        seq=d["seq"],
        record_id=int(d.get("internal record id", -1)),
        group=group,
        desc=desc,
        profiling_name=d.get("collective", ""),
        missing=_set(d.get("missing ranks")),
        expected=_set(d.get("expected ranks")),
        culprits=tuple((int(r), t) for r, t in _CULPRIT.findall(d.get("error msg", ""))),
        input_sizes=d.get("input sizes", ""),
    )


def _set(text: str | None) -> frozenset[int]:
    if not text or text == "set()":
        return frozenset()
    return frozenset(int(x) for x in ast.literal_eval(text))


# Members whose state differs (one completed, one scheduled): mtpdiag does not count state, which each rank
# discovers on its own.
STATE_ONLY = {"COLLECTIVE_STATE_MISMATCH"}


def assert_agreement(files) -> dict[str, Divergence]:
    """torchfrtrace and mtpdiag agree on the dumps ``files`` (``<prefix><rank>`` pickles); returns ours."""
    prefix = files[0].name.rstrip("0123456789")
    blocks, text = run_torchfrtrace(list(files), prefix)
    theirs = {
        g: b
        for g, b in first_block_per_group(blocks).items()
        if b.kind != "errors" or {t for _, t in b.culprits} - STATE_ONLY
    }
    analysis = match_groups(load_fr_dumps([str(f) for f in files]))
    ours = {g.name: g.divergence for g in analysis.groups if g.divergence is not None}
    assert theirs, f"torchfrtrace found nothing:\n{text[-3000:]}"
    assert set(theirs) == set(ours), text[-3000:]
    for name, block in theirs.items():
        _agree(block, ours[name])
    return ours


def _agree(block: FRTraceBlock, d: Divergence) -> None:
    assert (block.seq, block.desc) == (d.seq, d.desc)
    assert block.expected == frozenset(d.members)
    assert block.profiling_name in {c.profiling_name for c in d.calls}
    if block.kind == "missing":
        assert block.missing == frozenset(d.missing) == frozenset(d.culprits)
        return
    reference = [
        r.rank
        for r in d.ranks
        if r.op is not None and r.profiling_name == block.profiling_name and r.rank not in block.culprit_ranks
    ]
    assert reference, f"no rank of ours issued torchfrtrace's reference {block.profiling_name}"
    assert frozenset(d.culprits_against(reference[0])) == block.culprit_ranks
