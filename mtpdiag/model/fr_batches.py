"""How torch records one call as several entries: a batch's parts, then the entry that closes it.

torch numbers a group's collectives (``collective_seq_id``) and point-to-point ops (``p2p_seq_id``) once
per kernel launch, so the parts of a batch share their closing entry's number. Within one group and
in record order, a run of entries with the same number that ends in a ``coalesced``/``*_coalesced``
entry is one call (torch's analyzer groups them the same way, ``find_coalesced_group``). The dump reader
gives the parts their closer's state with this rule, and the analysis reads the calls with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from mtpdiag.model.flight_recorder import FREntry
from mtpdiag.vocabulary.profiling_names import parse_profiling_name


def batches(entries: Iterable[FREntry]) -> list[tuple[FREntry, ...]]:
    """One group's entries (record order) cut into calls: a single entry, or a batch's parts + closer."""
    out: list[tuple[FREntry, ...]] = []
    run: list[FREntry] = []
    for e in entries:
        if run and _same_number(run[0], e):
            run.append(e)
            if parse_profiling_name(e.profiling_name).closes_batch:
                out.append(tuple(run))
                run = []
            continue
        out.extend((x,) for x in run)
        run = [e]
    out.extend((x,) for x in run)
    return out


def _same_number(first: FREntry, e: FREntry) -> bool:
    """Whether ``e`` shares ``first``'s launch: the closing ``coalesced`` entry of a p2p batch may carry
    either flag, so it is matched by the number its run is counted by."""
    if first.is_p2p:
        return e.p2p_seq_id == first.p2p_seq_id and (e.is_p2p or e.collective_seq_id in (0, first.collective_seq_id))
    return not e.is_p2p and e.collective_seq_id == first.collective_seq_id
