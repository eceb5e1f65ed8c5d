"""The root of each deadlock cycle: which split of a cyclic core of the wait-for graph is the bug, and how we know.

In a cycle every split waits on another, so the graph alone cannot say which came first. Program order can:

* the Flight Recorder's sequence numbers on a shared communicator show that a rank went on to later
  collectives without issuing one (``flight_recorder.order``): it skipped it (``certain``);
* the known-site table names functions that let part of the group return before their collectives (an early
  return on an empty metric tracker, ``KnownSite.skip``);
* the stacks: the ranks absent from a split that stand at a later line of the deepest frame they share with
  its entered ranks went past it (``program_order``). Line order holds within one run of that frame only, so
  alone it is ``possible`` and the report says a loop could reverse it.

Where none of these orders the core, the heuristics of docs/design.md ("Root cause in a cycle") decide. A
group kind that was guessed never outranks one the table, the recorder or the membership names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, compress
from operator import attrgetter, itemgetter

import msgspec
from msgspec.structs import replace as struct_replace

from mtpdiag.analysis.known_sites import is_mtp_site, skip_of
from mtpdiag.analysis.mismatch import mismatch_key
from mtpdiag.analysis.program_order import Passing, RootOrder, StackOrders
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Mismatch, RankView, Site
from mtpdiag.vocabulary.groups import Coordinate
from mtpdiag.vocabulary.ops import BARRIER_OPS
from mtpdiag.vocabulary.states import GroupFrom, OrderSource, RankState
from mtpdiag.vocabulary.waits import Confidence

SiteKey = tuple[object, ...]  # which split or unmatched p2p call: kind, op, site (and group)
CoreSite = tuple[int, str, Site | None, str]  # the splits of a site in a cyclic core: component, op, site, group


class Candidate(msgspec.Struct):
    """One site of a cyclic core, with what speaks for it being the root (``root_score``)."""

    key: SiteKey
    mtp: bool
    barrier: bool
    rank0_gate: bool
    other_side_in_barrier: bool
    entered: int
    first: int
    skipped: bool = False  # the Flight Recorder shows an absent rank went past it without issuing it
    known_skip: bool = False  # the known-site table: the entered side's code can return before it
    passed: bool = False  # the stacks: absent ranks stand at a later line of a frame they share with it
    guessed: bool = False  # its group kind is a guess among several
    absent: tuple[int, ...] = ()


class Roots(msgspec.Struct, frozen=True):
    """The root site of each cyclic core (by component) and, for roots program order decided, why."""

    keys: dict[int, SiteKey]
    orders: dict[SiteKey, RootOrder]


def mismatch_site_key(m: Mismatch) -> SiteKey:
    return ("m", m.op, m.site, m.group)


def choose_roots(
    mismatches: Sequence[Mismatch],
    cores: Mapping[CoreSite, list[int]],
    p2p_in_cores: Mapping[int, Sequence[tuple[SiteKey, int, int]]],
    views: Mapping[int, RankView],
    layout: ParallelLayout | None,
    root_hints: frozenset[SiteKey] = frozenset(),
    orders: StackOrders | None = None,
) -> Roots:
    """The root site of each cyclic core (``cores``: the indices of the splits of each (component, op, site,
    group) in a cyclic core, in order; ``p2p_in_cores``: per component, each unmatched send/recv in it as its
    key, rank and peer)."""
    candidates: dict[int, dict[SiteKey, Candidate]] = {}
    in_barrier = _in_barrier(views) if cores or p2p_in_cores else set()
    skips: dict[Site | None, bool] = {}  # per site, not per core: a cycle repeated over replicas shares its sites
    by_key: dict[SiteKey, list[Candidate]] = {}  # each split site's candidates, over the cores it is in
    for (c, op, site, _), idx in cores.items():
        first = mismatches[idx[0]]  # the site's first split speaks for its gate and its Flight Recorder key
        splits = [mismatches[i] for i in idx]
        key = mismatch_site_key(first)
        absent = tuple(chain.from_iterable(map(attrgetter("absent"), splits)))
        cand = candidates.setdefault(c, {})[key] = Candidate(
            key=key,
            mtp=is_mtp_site(site),
            barrier=op in BARRIER_OPS,
            rank0_gate=_rank0_style(first.gate, layout),
            other_side_in_barrier=not in_barrier.isdisjoint(absent),
            entered=sum(map(len, map(attrgetter("entered"), splits))),
            first=min(map(itemgetter(0), map(attrgetter("entered"), splits))),
            skipped=bool(root_hints) and mismatch_key(first) in root_hints,
            known_skip=skips[site] if site in skips else skips.setdefault(site, skip_of(site) is not None),
            guessed=first.group_from == GroupFrom.GUESS,
            absent=absent,
        )
        by_key.setdefault(key, []).append(cand)
    for c, waits in p2p_in_cores.items():
        for key, rank, peer in waits:
            wait = candidates.setdefault(c, {}).get(key)
            if wait is None:
                wait = candidates[c][key] = Candidate(
                    key=key,
                    mtp=False,
                    barrier=False,
                    rank0_gate=False,
                    other_side_in_barrier=False,
                    entered=0,
                    first=rank,
                )
            wait.entered += 1
            wait.other_side_in_barrier |= peer in in_barrier
            wait.first = min(wait.first, rank)
    passings = _read_orders(by_key, orders) if orders is not None else {}
    keys: dict[int, SiteKey] = {}
    said: dict[SiteKey, RootOrder | None] = {}
    absent_of: dict[SiteKey, list[tuple[int, ...]]] = {}
    for c, cands in candidates.items():
        root = min(cands.values(), key=root_score)
        keys[c] = root.key
        if root.key not in said:
            said[root.key] = _order_of(root, views, passings.get(root.key) or Passing())
        absent_of.setdefault(root.key, []).append(root.absent)
    out = {}
    for key, order in said.items():
        if order is None:
            continue
        if order.source in (OrderSource.FLIGHT_RECORDER, OrderSource.KNOWN_SITE):  # who skipped it, over its cores
            order = struct_replace(order, skipped_by=tuple(sorted(set(chain.from_iterable(absent_of[key])))))
        out[key] = order
    return Roots(keys, out)


def _read_orders(by_key: Mapping[SiteKey, Sequence[Candidate]], orders: StackOrders) -> dict[SiteKey, Passing]:
    """What the stacks say of each split site (``by_key``: its candidates, one per core it is in), read once per
    site over all its cores: each distinct pair of stacks is compared once, the ranks are picked in C."""
    out = {}
    for key, site_cands in by_key.items():
        passing = out[key] = orders.passing(
            list(map(attrgetter("first"), site_cands)),
            list(chain.from_iterable(map(attrgetter("absent"), site_cands))),
        )
        if not passing.passed and passing.early_return is None:
            continue  # nothing to mark: no core's candidate changes
        passed = frozenset(passing.passed)
        for cand in site_cands:
            cand.passed = bool(passed) and not passed.isdisjoint(cand.absent)
            cand.known_skip |= passing.early_return is not None
    return out


def _source_of(root: Candidate) -> tuple[OrderSource, Confidence] | None:
    """What program order makes ``root`` the root of its core on, and how sure that is; None when it does not
    (never for the MTP signature, which names itself)."""
    if root.mtp or root.key[0] != "m":
        return None
    if root.skipped:
        return OrderSource.FLIGHT_RECORDER, Confidence.CERTAIN
    passed = root.passed
    if root.known_skip:
        if passed:
            return OrderSource.STACKS_AND_KNOWN_SITE, Confidence.LIKELY
        return OrderSource.KNOWN_SITE, Confidence.POSSIBLE
    if passed:
        return OrderSource.STACKS, Confidence.POSSIBLE
    return None


def _order_of(root: Candidate, views: Mapping[int, RankView], passing: Passing) -> RootOrder | None:
    """Why program order makes ``root`` the root of its core, when it does (``passing``: what the stacks say of
    its site)."""
    found = _source_of(root)
    if found is None:
        return None
    source, confidence = found
    who = root.absent if source in (OrderSource.FLIGHT_RECORDER, OrderSource.KNOWN_SITE) else passing.passed
    instead = views.get(who[0]) if who else None
    site = root.key[2]
    return RootOrder(
        source=source,
        confidence=confidence,
        skipped_by=tuple(sorted(set(who))),
        instead_op=instead.op if instead is not None else None,
        instead_site=instead.site if instead is not None else None,
        at=passing.at if passing.passed else None,
        early_return=passing.early_return or (skip_of(site) if isinstance(site, Site) else None),
        loop_caveat=source == OrderSource.STACKS,
        contradicted=bool(passing.behind) and not passing.passed and source == OrderSource.KNOWN_SITE,
    )


def _in_barrier(views: Mapping[int, RankView]) -> set[int]:
    """The ranks waiting in a barrier (picked in C loops: a few of 16k ranks, if any)."""
    named = compress(views, map(BARRIER_OPS.__contains__, map(attrgetter("op"), views.values())))
    return {rank for rank in named if views[rank].state == RankState.COLLECTIVE}


Score = tuple[bool, bool, bool, bool, bool, bool, bool, bool, int, int, str]


def root_score(c: Candidate) -> Score:
    """Lower is more likely the cause.

    A known signature first; then program order: a split the Flight Recorder shows an absent rank skipped (it
    went on to later collectives without issuing it), then one whose code the known-site table says returns
    early on part of the group; a barrier is where ranks that went ahead wait, so it is never the cause while
    something else is in the core; then a split whose absent ranks stand at a later line of a frame they share
    with it (line order, which a loop can reverse); a split on a guessed group never outranks one on a group
    that is known; a gate on 0 or on the last pipeline stage is how rank-dependent code is written; a split
    whose absent side sits in a barrier is the one they skipped; then the split entered by fewer ranks; then
    the lowest rank, for a stable answer.
    """
    return (
        not c.mtp,
        not c.skipped,
        not c.known_skip,
        c.barrier,
        not c.passed,
        c.guessed,
        not c.rank0_gate,
        not c.other_side_in_barrier,
        c.entered,
        c.first,
        repr(c.key),
    )


def _rank0_style(gate: Mapping[str, int] | None, layout: ParallelLayout | None) -> bool:
    if not gate:
        return False
    last_stage = layout.pp - 1 if layout is not None else None
    return all(v == 0 or (k == Coordinate.PP and v == last_stage) for k, v in gate.items())
