"""Process-group instances that only some of their members entered.

For each (op, site) where ranks wait in a collective, the group kind comes from the known-site table
when the site is known, else it is inferred from the layout: the smallest kind (of size > 1) whose
instances touched by the waiting ranks are *consistent*: either every one of them is only partly
entered (each waiting rank is explained: its group lacks someone) or every one is fully entered
(nothing is split there). A kind whose instances are all fully entered gives way to a larger one that
leaves every instance partly entered when absent members are captured elsewhere: a fully entered
group cannot be what its members wait for. Kinds that mix the two are skipped; if every kind mixes, the
smallest one with a split instance is used. Each partly entered instance becomes a ``Mismatch``.

Collectives without a group argument in practice (barrier, process-group creation) default to the
world group, and point-to-point ops are matched by peer elsewhere (``waits``), not here.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import chain, filterfalse
from operator import itemgetter
from typing import NamedTuple

from msgspec.structs import replace as struct_replace

from mtpdiag.analysis.gate import read_split_gate
from mtpdiag.analysis.known_sites import is_mtp_site, kinds_of, lookup
from mtpdiag.layout import GROUP_KINDS, INFERENCE_ORDER, ParallelLayout
from mtpdiag.model import Mismatch, RankView, Site
from mtpdiag.vocabulary.groups import GroupKind
from mtpdiag.vocabulary.ops import BATCH_P2P_OP, P2P_OPS, WAIT_OP, WORLD_OPS
from mtpdiag.vocabulary.states import FROZEN_STATES, GateStrength, GroupFrom, RankState
from mtpdiag.vocabulary.waits import WAIT_PHRASES

_EXPERT_KINDS = frozenset(k for k, (generator, _) in GROUP_KINDS.items() if generator == "expert")


@lru_cache(maxsize=1024)
def is_p2p_op(op: str | None, site: Site | None) -> bool:
    """Whether a rank in ``op`` at ``site`` waits in a wait matched by peer: send/recv, or batched p2p and bare
    waits in point-to-point code (cached: asked of every rank, and a job's ranks wait at a handful of sites).

    A ``batch_isend_irecv`` or ``wait`` at a known site of another kind (context-parallel ring
    attention) is treated as a collective of that site's group: every member must take part.
    """
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
        return (GroupKind.WORLD,) + tuple(k for k in inferred if k != GroupKind.WORLD)
    return inferred


def _has_experts(layout: ParallelLayout) -> bool:
    """Expert groups differ from dense ones only with ep > 1 or an expert tp of its own."""
    return layout.ep > 1 or (layout.etp is not None and layout.etp != layout.tp)


class KindReading(NamedTuple):
    """The group kind of a site, where it came from (known-site | unique-fit | guess) and every kind that fit."""

    kind: str
    source: GroupFrom
    candidates: tuple[str, ...]


def read_kind(
    op: str,
    site: Site | None,
    entered: Sequence[int],
    layout: ParallelLayout,
    captured: Container[int] | None = None,
) -> KindReading:
    """The group kind for the ranks waiting at a site, and how it was found.

    The known-site table names it for megatron's and verl's call sites. Otherwise it is read from the
    membership: every kind whose instances the waiting ranks all leave partly entered fits; one fit (or
    several with the very same members, CP and DP×CP with dp=1) is a ``unique-fit``; several different fits,
    or none (then the smallest kind with a split), is a ``guess`` and the report lists the candidates.
    """
    kinds = candidate_kinds(op, site, layout)
    kind = choose_kind(entered, kinds, layout, captured)
    known = lookup(site)
    if known is not None and not known.p2p:
        return KindReading(kind, GroupFrom.KNOWN_SITE, (kind,))
    if op in WORLD_OPS and kind == GroupKind.WORLD:
        return KindReading(kind, GroupFrom.WORLD_OP, (kind,))
    fits = [k for k in kinds if _all_split(entered, k, layout)]
    if not fits:
        return KindReading(kind, GroupFrom.GUESS, (kind,))
    distinct: dict[tuple[tuple[int, ...], ...], str] = {}  # membership -> the first (smallest) kind that has it
    for k in fits:
        distinct.setdefault(tuple(sorted(_instances(entered, k, layout)[0].values())), k)
    source = GroupFrom.UNIQUE_FIT if len(distinct) == 1 else GroupFrom.GUESS
    return KindReading(kind, source, tuple(distinct.values()))


def _instances(
    entered: Sequence[int], kind: str, layout: ParallelLayout
) -> tuple[dict[int, tuple[int, ...]], Counter[int]]:
    """The instances of ``kind`` that hold the (distinct) entered ranks, by id in the order first met, and
    how many entered ranks each holds: one instance is split when it holds fewer than its size. C loops over
    the layout's rank index, no Python step per rank (8,192 entered ranks at 16k)."""
    groups = list(map(layout.group_index(kind).__getitem__, entered))
    keys = list(map(id, groups))
    return dict(zip(keys, groups, strict=True)), Counter(keys)


def _all_split(entered: Sequence[int], kind: str, layout: ParallelLayout) -> bool:
    """Every instance of ``kind`` that the waiting ranks touch is only partly entered (size > 1)."""
    instances, counts = _instances(entered, kind, layout)
    if max(map(len, instances.values())) < 2:
        return False
    return all(counts[key] < len(group) for key, group in instances.items())


def choose_kind(
    entered: Sequence[int], kinds: Sequence[str], layout: ParallelLayout, captured: Container[int] | None = None
) -> str:
    """The first consistent kind for these waiting ranks (see the module docstring).

    Every member of a fully entered instance is in the collective, so it cannot be what they wait for (unless
    the cause is below Python). With ``captured`` (the ranks whose whereabouts are known), a larger kind that
    every waiting rank leaves partly entered, with absent members captured elsewhere, explains the wait better
    and is preferred: a world-group all_reduce of one pipeline stage fills its CP groups.
    """
    if len(kinds) == 1:
        return kinds[0]  # whatever the membership says (a known site's one kind)
    first_split: str | None = None
    first_full: str | None = None
    for kind in kinds:
        instances, counts = _instances(entered, kind, layout)
        if max(map(len, instances.values())) < 2:
            continue  # a group of one cannot hang
        split = sum(1 for key, group in instances.items() if counts[key] < len(group))
        if split == len(instances):
            if first_full is None or (captured is not None and _absent_captured(entered, instances, captured)):
                return kind
            continue
        if split == 0:
            if captured is None:
                return kind
            first_full = first_full or kind
        elif first_split is None:
            first_split = kind
    return first_full or first_split or kinds[0]


def _absent_captured(entered: Sequence[int], instances: Mapping[int, Sequence[int]], captured: Container[int]) -> bool:
    """Some member of these instances that did not enter was captured elsewhere: the split is seen, not merely
    inferred from ranks nobody captured (one node of many, whose peers on other nodes wait with them)."""
    absent = set(chain.from_iterable(instances.values())).difference(entered)
    return any(map(captured.__contains__, absent))


def mismatch_key(m: Mismatch) -> tuple[object, ...]:
    """What makes two reports of a split the same split: op, where it was called, and who is in the group."""
    site = (os.path.basename(m.site.file), m.site.line) if m.site is not None else None
    return (m.op, site, m.members)


def find_mismatches(views: Mapping[int, RankView], layout: ParallelLayout) -> list[Mismatch]:
    """Every partly entered group instance, for every site where ranks wait in a collective.

    ``views`` maps each captured rank inside the layout's world to its view. Only ranks in state
    ``collective`` count as entered: a stopped rank cannot take part, so it is absent. The gate reads the
    coordinates of thousands of ranks from the layout in bulk (``ParallelLayout.coordinate``).
    """
    waiting: dict[tuple[str, Site | None], list[int]] = {}
    collective = RankState.COLLECTIVE
    for rank, view in views.items():
        if view.state == collective and view.op is not None:
            waiting.setdefault((view.op, view.site), []).append(rank)
    by_site = {key: ranks for key, ranks in waiting.items() if not is_p2p_op(*key)}
    said = _Doing(views, waiting)
    out: list[Mismatch] = []
    for (op, site), entered in sorted(by_site.items(), key=lambda item: min(item[1])):
        reading = read_kind(op, site, entered, layout, views)
        kind = reading.kind
        instances, counts = _instances(entered, kind, layout)
        # an instance's members are ascending (the layout's contract): its first is its least
        groups = sorted([g for key, g in instances.items() if counts[key] < len(g)], key=itemgetter(0))
        if not groups:
            continue
        inside = set(entered).__contains__
        entered_of = [tuple(filter(inside, g)) for g in groups]
        absent_of = [tuple(filterfalse(inside, g)) for g in groups]
        gate = read_split_gate(groups, entered_of, absent_of, layout.coordinate, layout.varying_in(kind))
        if (
            gate.strength == GateStrength.WEAK
            and is_mtp_site(site)
            and kind == GroupKind.DP_CP
            and gate.gate == {"cp": 0}
        ):
            gate = gate._replace(strength=GateStrength.STRONG)  # the known verl #5895 signature, however few the ranks
        words = said.of(absent_of)
        # each instance's record is the site's with its ranks: a replace costs half a build from keywords
        site_split = Mismatch(
            op=op,
            site=site,
            group=kind,
            members=(),
            entered=(),
            absent=(),
            gate=gate.gate,
            group_from=reading.source,
            group_candidates=reading.candidates,
            gate_strength=gate.strength,
            gate_alternatives=gate.alternatives,
        )
        out += [
            struct_replace(site_split, members=g, entered=e, absent=a, absent_doing={r: words[r] for r in a})
            for g, e, a in zip(groups, entered_of, absent_of, strict=True)
        ]
    return out


class _Doing:
    """``doing`` of ranks, worded once for the ranks that agree in what it reads (state, op, site, wait kind):
    a split of 8,192 instances names thousands of absent ranks doing the same thing. A rank in a collective
    reads its op and site only, so the ranks found waiting at one are worded together, without a step each."""

    def __init__(self, views: Mapping[int, RankView], waiting: Mapping[tuple[str, Site | None], list[int]]) -> None:
        self.views = views
        self.words: dict[int, str] = {}
        for ranks in waiting.values():
            self.words.update(dict.fromkeys(ranks, doing(views[ranks[0]])))
        self.said: dict[tuple[object, ...], str] = {}

    def of(self, absent: Iterable[Iterable[int]]) -> dict[int, str]:
        """Every rank's words (a mapping that holds at least the ranks of ``absent``)."""
        words = self.words
        for rank in set(chain.from_iterable(absent)).difference(words):
            view = self.views.get(rank)
            if view is None:
                words[rank] = doing(None)
                continue
            key = (view.state, view.op, view.site, view.wait.kind if view.wait is not None else None)
            found = self.said.get(key)
            if found is None:
                found = self.said[key] = doing(view)
            words[rank] = found
        return words
