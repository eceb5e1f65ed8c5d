"""Process-group instances that only some of their members entered.

For each (op, site) where ranks wait in a collective, the group kind comes from the known-site table
when the site is known, else it is inferred from the layout: the smallest kind (of size > 1) whose
instances touched by the waiting ranks are *consistent*: either every one of them is only partly
entered (each waiting rank is explained: its group lacks someone) or every one is fully entered
(nothing is split there). Kinds that mix the two are skipped; if every kind mixes, the smallest one
with a split instance is used. Each partly entered instance becomes a ``Mismatch``.

Collectives without a group argument in practice (barrier, process-group creation) default to the
world group, and point-to-point ops are matched by peer elsewhere (``waits``), not here.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple

from mtpdiag.analysis.gate import CoordsOf, read_gate, varying_coordinates
from mtpdiag.analysis.known_sites import is_mtp_site, kinds_of, lookup
from mtpdiag.layout import GROUP_KINDS, INFERENCE_ORDER, ParallelLayout
from mtpdiag.model import Mismatch, RankView, Site
from mtpdiag.vocabulary.ops import BATCH_P2P_OP, P2P_OPS, WAIT_OP, WORLD_OPS
from mtpdiag.vocabulary.states import FROZEN_STATES, GateStrength, GroupFrom, RankState
from mtpdiag.vocabulary.waits import WAIT_PHRASES

_EXPERT_KINDS = frozenset(k for k, (generator, _) in GROUP_KINDS.items() if generator == "expert")


def is_point_to_point(view: RankView) -> bool:
    """A wait matched by peer: send/recv, or batched p2p and bare waits in point-to-point code.

    A ``batch_isend_irecv`` or ``wait`` at a known site of another kind (context-parallel ring
    attention) is treated as a collective of that site's group: every member must take part.
    """
    return is_p2p_op(view.op, view.site)


@lru_cache(maxsize=1024)
def is_p2p_op(op: str | None, site: Site | None) -> bool:
    """``is_point_to_point`` of a rank in ``op`` at ``site`` (cached: asked of every rank, and a job's ranks
    wait at a handful of sites)."""
    if op in P2P_OPS:
        return True
    if op in (BATCH_P2P_OP, WAIT_OP):
        known = lookup(site)
        if known is not None:
            return known.p2p
        return op == BATCH_P2P_OP
    return False


def doing(view: RankView | None) -> str:
    """What a rank is doing, in a few words: ``all_gather in ring_attention``, ``stopped``, ..."""
    if view is None:
        return "not captured"
    if view.state in FROZEN_STATES:
        return view.state
    where = view.site.function if view.site is not None else None
    if view.op is not None:
        return f"{view.op} in {where}" if where else view.op
    what = WAIT_PHRASES.get(view.wait.kind, "running") if view.state == RankState.WAITING and view.wait else "running"
    return f"{what} in {where}" if where else what


def candidate_kinds(op: str, site: Site | None, layout: ParallelLayout) -> tuple[str, ...]:
    """Kinds to try for a site, most likely first: the known-site table's, else all by size."""
    known = lookup(site)
    if known is not None and not known.p2p:
        return kinds_of(site)  # every megatron release's form of the helper (0.13's MTP reduce ran on TP×CP)
    inferred = tuple(k for k in INFERENCE_ORDER if k not in _EXPERT_KINDS or _has_experts(layout))
    if op in WORLD_OPS:
        return ("world",) + tuple(k for k in inferred if k != "world")
    return inferred


def _has_experts(layout: ParallelLayout) -> bool:
    """Expert groups differ from dense ones only with ep > 1 or an expert tp of its own."""
    return layout.ep > 1 or (layout.etp is not None and layout.etp != layout.tp)


class KindReading(NamedTuple):
    """The group kind of a site, where it came from (known-site | unique-fit | guess) and every kind that fit."""

    kind: str
    source: GroupFrom
    candidates: tuple[str, ...]


def read_kind(op: str, site: Site | None, entered: Sequence[int], layout: ParallelLayout) -> KindReading:
    """The group kind for the ranks waiting at a site, and how it was found.

    The known-site table names it for megatron's and verl's call sites. Otherwise it is read from the
    membership: every kind whose instances the waiting ranks all leave partly entered fits; one fit (or
    several with the very same members, CP and DP×CP with dp=1) is a ``unique-fit``; several different fits,
    or none (then the smallest kind with a split), is a ``guess`` and the report lists the candidates.
    """
    kinds = candidate_kinds(op, site, layout)
    kind = choose_kind(entered, kinds, layout)
    known = lookup(site)
    if known is not None and not known.p2p:
        return KindReading(kind, GroupFrom.KNOWN_SITE, (kind,))
    if op in WORLD_OPS and kind == "world":
        return KindReading(kind, GroupFrom.WORLD_OP, (kind,))
    fits = [k for k in kinds if _all_split(entered, k, layout)]
    if not fits:
        return KindReading(kind, GroupFrom.GUESS, (kind,))
    distinct: dict[tuple[tuple[int, ...], ...], str] = {}  # membership -> the first (smallest) kind that has it
    for k in fits:
        distinct.setdefault(tuple(sorted({layout.group_of(k, r) for r in entered})), k)
    source = GroupFrom.UNIQUE_FIT if len(distinct) == 1 else GroupFrom.GUESS
    return KindReading(kind, source, tuple(distinct.values()))


def _all_split(entered: Sequence[int], kind: str, layout: ParallelLayout) -> bool:
    """Every instance of ``kind`` that the waiting ranks touch is only partly entered (size > 1)."""
    entered_set = set(entered)
    seen: dict[int, tuple[int, ...]] = {}
    for rank in entered:
        group = layout.group_of(kind, rank)
        seen[id(group)] = group
    if max(len(g) for g in seen.values()) < 2:
        return False
    return all(not entered_set.issuperset(g) for g in seen.values())


def choose_kind(entered: Sequence[int], kinds: Sequence[str], layout: ParallelLayout) -> str:
    """The first consistent kind for these waiting ranks (see the module docstring)."""
    if len(kinds) == 1:
        return kinds[0]  # whatever the membership says (a known site's one kind)
    first_split: str | None = None
    for kind in kinds:
        instances: dict[int, tuple[int, ...]] = {}
        counts: Counter[int] = Counter()
        for rank in entered:
            group = layout.group_of(kind, rank)
            instances[id(group)] = group
            counts[id(group)] += 1
        if max(len(g) for g in instances.values()) < 2:
            continue  # a group of one cannot hang
        split = sum(1 for key, group in instances.items() if counts[key] < len(group))
        if split == len(instances) or split == 0:
            return kind
        if first_split is None:
            first_split = kind
    return first_split or kinds[0]


def mismatch_key(m: Mismatch) -> tuple[object, ...]:
    """What makes two reports of a split the same split: op, where it was called, and who is in the group."""
    site = (os.path.basename(m.site.file), m.site.line) if m.site is not None else None
    return (m.op, site, m.members)


class _Split(NamedTuple):
    """A partly entered instance, before its site's gate is known (what ``gate_of`` reads)."""

    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]


def find_mismatches(views: Mapping[int, RankView], layout: ParallelLayout,
                    coords_of: CoordsOf) -> list[Mismatch]:
    """Every partly entered group instance, for every site where ranks wait in a collective.

    ``views`` maps each captured rank inside the layout's world to its view. Only ranks in state
    ``collective`` count as entered: a stopped rank cannot take part, so it is absent.
    """
    waiting: dict[tuple[str, Site | None], list[int]] = {}
    for rank, view in views.items():
        if view.state == RankState.COLLECTIVE and view.op is not None:
            waiting.setdefault((view.op, view.site), []).append(rank)
    by_site = {key: ranks for key, ranks in waiting.items() if not is_p2p_op(*key)}
    doing_of = _doing_of(views)
    out: list[Mismatch] = []
    for (op, site), entered in sorted(by_site.items(), key=lambda item: min(item[1])):
        reading = read_kind(op, site, entered, layout)
        kind = reading.kind
        entered_set = set(entered)
        touched = {id(g): g for g in map(layout.group_index(kind).__getitem__, entered)}
        splits = []
        for group in sorted((g for g in touched.values() if not entered_set.issuperset(g)), key=min):
            members = tuple(sorted(group))
            splits.append(_Split(members=members, entered=tuple([m for m in members if m in entered_set]),
                                 absent=tuple([m for m in members if m not in entered_set])))
        # the coordinates that vary inside the split instances: in one of them, when all instances are alike
        varying = varying_coordinates(splits[:1], coords_of) if splits and layout.coordinates_alike(kind) else None
        gate = read_gate(splits, coords_of, varying)
        if gate.strength == GateStrength.WEAK and is_mtp_site(site) and kind == "dp_cp" and gate.gate == {"cp": 0}:
            gate = gate._replace(strength=GateStrength.STRONG)  # the known verl #5895 signature, however few the ranks
        out += [Mismatch(op=op, site=site, group=kind, members=s.members, entered=s.entered, absent=s.absent,
                         gate=gate.gate, absent_doing={a: doing_of(a) for a in s.absent},
                         group_from=reading.source, group_candidates=reading.candidates,
                         gate_strength=gate.strength, gate_alternatives=gate.alternatives)
                for s in splits]
    return out


def _doing_of(views: Mapping[int, RankView]) -> Callable[[int], str]:
    """``doing`` of a rank's view, worded once for the ranks that agree in what it reads (state, op, site,
    wait kind): a split of 8,192 instances names thousands of absent ranks doing the same thing."""
    said: dict[tuple[object, ...], str] = {}

    def doing_of(rank: int) -> str:
        view = views.get(rank)
        if view is None:
            return doing(None)
        key = (view.state, view.op, view.site, view.wait.kind if view.wait is not None else None)
        found = said.get(key)
        if found is None:
            found = said[key] = doing(view)
        return found

    return doing_of
