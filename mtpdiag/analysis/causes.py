"""Root cause versus consequence: the wait-for graph of a hang.

In a real deadlock split collectives block each other: rank 2 waits in an all_reduce for rank 3,
which waits in an all_gather for rank 2. Only one of them is the bug. This module builds the graph
"who waits on whom" — a rank waits on its split instance, an instance waits on its absent members, a
send/recv waits on its peer when the peer is not in the matching op — and finds:

* the cyclic cores (strongly connected components); in each, one root site is chosen (``_root_score``)
  and every other split instance in the core is a consequence;
* the problem sinks: ranks that are waited on but wait on nothing themselves, because they run
  (stragglers), are stopped or unreadable (frozen), or were never captured (missing);
* everything that waits, directly or not, on a core or a problem sink is a consequence. A split with
  neither behind it is its own root.

Instances are nodes of their own, so a group of 8192 ranks costs 8192 edges, not 8192².
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

from mtpdiag.analysis.known_sites import is_mtp_site
from mtpdiag.analysis.mismatch import is_point_to_point, mismatch_key
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Mismatch, RankView, Site, replace
from mtpdiag.vocabulary.ops import BARRIER_OPS, RECV_OPS, SEND_OPS
from mtpdiag.vocabulary.states import FROZEN_STATES, RankState, Role
from mtpdiag.vocabulary.waits import SELF_INFLICTED

PROBLEM_STATES = frozenset((RankState.RUNNING, *FROZEN_STATES))


def holds_up(view: RankView | None) -> bool:
    """A rank that others can wait on without it waiting on anybody: it runs, waits on something of its own
    (a lock, I/O, a data loader, a sleep), is stopped or unreadable, or was never captured. A rank at a host
    sync waits on the device, which waits on a collective: not one of these."""
    if view is None or view.state in PROBLEM_STATES:
        return True
    return view.state == RankState.WAITING and view.wait is not None and view.wait.kind in SELF_INFLICTED


class P2PWait(NamedTuple):
    """A rank blocked in a send/recv whose peer is not in the matching op (a tuple: a pipeline's thousands
    of them are made faster)."""

    rank: int
    op: str
    site: Site | None
    peer: int


@dataclass(frozen=True)
class Waiter:
    """Something that waits on a problem rank: a split instance (index) or a p2p wait."""

    mismatch: int | None = None
    p2p: P2PWait | None = None


@dataclass(frozen=True)
class Causes:
    """The outcome: roles assigned, root p2p waits, and the waited-on problem ranks."""

    mismatches: tuple[Mismatch, ...]
    root_p2p: tuple[P2PWait, ...]
    consequence_p2p: tuple[P2PWait, ...]
    # problem rank (running/stopped/gone/unreadable or not captured) -> what waits on it directly
    blocked_on: Mapping[int, tuple[Waiter, ...]] = field(default_factory=dict)


def _direction(view: RankView) -> str:
    if view.op in SEND_OPS:
        return "send"
    if view.op in RECV_OPS:
        return "recv"
    return "both"  # batch_isend_irecv, a wait in pipeline p2p code


def unmatched_p2p(views: Mapping[int, RankView]) -> list[P2PWait]:
    """Ranks in a send/recv with a known peer that is not in the matching op (or not waiting at all)."""
    out = []
    for rank, view in views.items():
        if view.peer is None or view.state != RankState.COLLECTIVE or not is_point_to_point(view):
            continue
        other = views.get(view.peer)
        if other is not None and other.state == RankState.COLLECTIVE and is_point_to_point(other):
            mine, theirs = _direction(view), _direction(other)
            complementary = mine == "both" or theirs == "both" or mine != theirs
            if complementary and other.peer in (rank, None):
                continue
        out.append(P2PWait(rank=rank, op=view.op or "", site=view.site, peer=view.peer))
    return sorted(out, key=attrgetter("rank"))


class _Graph:
    """Nodes are ranks and split instances (mismatch indices); edges point from waiter to waited-on.

    Node ids are list positions; a rank's id is looked up by the rank itself, an instance's by its
    index, so building the graph of 16k ranks creates no key objects.
    """

    def __init__(self, ranks: Sequence[int] = ()) -> None:
        """A graph whose first nodes are ``ranks``, in order."""
        self.rank_nodes: dict[int, int] = {r: i for i, r in enumerate(ranks)}
        self.mismatch_nodes: list[int] = []
        self.edges: list[list[int]] = [[] for _ in self.rank_nodes]

    def rank(self, rank: int) -> int:
        found = self.rank_nodes.get(rank)
        if found is None:
            found = self.rank_nodes[rank] = len(self.edges)
            self.edges.append([])
        return found

    def add_mismatch(self, entered: Sequence[int], absent: Sequence[int]) -> int:
        """A node for the next split instance: its entered ranks wait on it, it waits on its absent ones."""
        nodes, edges = self.rank_nodes, self.edges
        # may add nodes for uncaptured ranks: before this one's id
        waits_on = [nodes[a] if a in nodes else self.rank(a) for a in absent]
        node = len(edges)
        self.mismatch_nodes.append(node)
        edges.append(waits_on)
        for r in entered:
            edges[nodes[r] if r in nodes else self.rank(r)].append(node)
        return node

    def edge(self, a: int, b: int) -> None:
        """Rank ``a`` waits on rank ``b``."""
        self.edges[self.rank(a)].append(self.rank(b))

    def components(self) -> list[int]:
        """Tarjan's strongly connected components, iteratively (no recursion limit at 16k ranks); each node's
        out-edges are walked by one iterator that the work stack resumes."""
        edges = self.edges
        n = len(edges)
        index, low, comp = [-1] * n, [0] * n, [-1] * n
        on_stack = [False] * n
        stack: list[int] = []
        counter = components = 0
        for start in range(n):
            if index[start] != -1:
                continue
            index[start] = low[start] = counter
            counter += 1
            stack.append(start)
            on_stack[start] = True
            work = [(start, iter(edges[start]))]
            while work:
                v, outs = work[-1]
                for w in outs:
                    if index[w] == -1:
                        index[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        on_stack[w] = True
                        work.append((w, iter(edges[w])))
                        break
                    if on_stack[w] and index[w] < low[v]:
                        low[v] = index[w]
                else:
                    work.pop()
                    if work:
                        parent = work[-1][0]
                        if low[v] < low[parent]:
                            low[parent] = low[v]
                    if low[v] == index[v]:
                        while True:
                            w = stack.pop()
                            on_stack[w] = False
                            comp[w] = components
                            if w == v:
                                break
                        components += 1
        return comp

    def reaching(self, targets: Sequence[int]) -> set[int]:
        """Nodes with a path to any target (the targets included)."""
        reverse: list[list[int]] = [[] for _ in self.edges]
        for v, outs in enumerate(self.edges):
            for w in outs:
                reverse[w].append(v)
        seen = set(targets)
        queue = deque(targets)
        while queue:
            v = queue.popleft()
            for u in reverse[v]:
                if u not in seen:
                    seen.add(u)
                    queue.append(u)
        return seen


SiteKey = tuple[object, ...]  # which split or unmatched p2p call: kind, op, site (and group)


def find_causes(mismatches: Sequence[Mismatch], views: Mapping[int, RankView],
                layout: ParallelLayout | None, root_hints: frozenset[SiteKey] = frozenset()) -> Causes:
    """Assign root/consequence roles and find the problem ranks others wait on. ``root_hints``: the keys
    (``mismatch.mismatch_key``) of splits the Flight Recorder's program order shows some rank skipped."""
    p2p = unmatched_p2p(views)
    graph = _Graph(list(views))
    # A split of one entered and one absent rank (a CP pair) is an edge between them, not a node of its own:
    # the graph of 16k ranks is then a third smaller, with the same components and reachability.
    nodes: list[int | None] = []
    for m in mismatches:
        if len(m.entered) == 1 and len(m.absent) == 1:
            graph.edge(m.entered[0], m.absent[0])
            nodes.append(None)
        else:
            nodes.append(graph.add_mismatch(m.entered, m.absent))
    for w in p2p:
        graph.edge(w.rank, w.peer)

    comp = graph.components()
    size: dict[int, int] = {}
    for c in comp:
        size[c] = size.get(c, 0) + 1
    cyclic = {c for c, n in size.items() if n > 1}
    # each split's component: a pair's is its ranks' when they share one (it lies on their cycle), else its own
    mcomp = [comp[n] if n is not None else _pair_component(comp, graph, m, i) for i, (m, n) in
             enumerate(zip(mismatches, nodes, strict=True))]

    blocked: dict[int, list[Waiter]] = {}
    for i, m in enumerate(mismatches):
        for a in m.absent:
            if holds_up(views.get(a)):
                blocked.setdefault(a, []).append(Waiter(mismatch=i))
    for w in p2p:
        if holds_up(views.get(w.peer)):
            blocked.setdefault(w.peer, []).append(Waiter(p2p=w))

    targets = [v for v, c in enumerate(comp) if c in cyclic]
    targets += [graph.rank_nodes[r] for r in blocked]
    downstream = graph.reaching(targets)

    root_keys = _choose_roots(mismatches, p2p, views, graph, comp, mcomp, cyclic, layout, root_hints)
    roles = []
    for m, node, c in zip(mismatches, nodes, mcomp, strict=True):
        if c in cyclic:
            root = root_keys.get(c) == _mismatch_key(m)
        else:  # a pair reaches what its absent rank reaches
            root = (node if node is not None else graph.rank_nodes[m.absent[0]]) not in downstream
        role = Role.ROOT if root else Role.CONSEQUENCE
        roles.append(m if m.role == role else replace(m, role=role))
    root_p2p: list[P2PWait] = []
    consequence_p2p: list[P2PWait] = []
    for w in p2p:
        node = graph.rank_nodes[w.rank]
        if comp[node] in cyclic:
            root = root_keys.get(comp[node]) == _p2p_key(w) and comp[graph.rank_nodes[w.peer]] == comp[node]
        else:
            root = node not in downstream
        (root_p2p if root else consequence_p2p).append(w)
    return Causes(mismatches=tuple(roles), root_p2p=tuple(root_p2p), consequence_p2p=tuple(consequence_p2p),
                  blocked_on={r: tuple(ws) for r, ws in sorted(blocked.items())})


def _mismatch_key(m: Mismatch) -> SiteKey:
    return ("m", m.op, m.site, m.group)


def _p2p_key(w: P2PWait) -> SiteKey:
    return ("p", w.op, w.site)


@dataclass
class _Candidate:
    key: SiteKey
    mtp: bool
    barrier: bool
    rank0_gate: bool
    other_side_in_barrier: bool
    entered: int
    first: int
    skipped: bool = False  # the Flight Recorder shows an absent rank went past it without issuing it


def _pair_component(comp: list[int], graph: _Graph, m: Mismatch, index: int) -> int:
    """The component of a split made an edge: its ranks' when they share one, else one of its own (a negative
    id no node has)."""
    entered, absent = comp[graph.rank_nodes[m.entered[0]]], comp[graph.rank_nodes[m.absent[0]]]
    return entered if entered == absent else -1 - index


def _choose_roots(mismatches: Sequence[Mismatch], p2p: Sequence[P2PWait], views: Mapping[int, RankView],
                  graph: _Graph, comp: list[int], mcomp: list[int], cyclic: set[int],
                  layout: ParallelLayout | None, root_hints: frozenset[SiteKey] = frozenset()) -> dict[int, SiteKey]:
    """The root site of each cyclic core (``mcomp``: each split's component)."""
    candidates: dict[int, dict[SiteKey, _Candidate]] = {}

    def in_barrier(rank: int) -> bool:
        view = views.get(rank)
        return view is not None and view.state == RankState.COLLECTIVE and view.op in BARRIER_OPS

    for m, c in zip(mismatches, mcomp, strict=True):
        if c not in cyclic:
            continue
        key = _mismatch_key(m)
        cand = candidates.setdefault(c, {}).get(key)
        if cand is None:
            cand = candidates[c][key] = _Candidate(
                key=key, mtp=is_mtp_site(m.site), barrier=m.op in BARRIER_OPS,
                rank0_gate=_rank0_style(m.gate, layout), other_side_in_barrier=False, entered=0,
                first=m.entered[0], skipped=mismatch_key(m) in root_hints)
        cand.entered += len(m.entered)
        if not cand.other_side_in_barrier:  # once one absent rank of the site is in a barrier, that is said
            cand.other_side_in_barrier = any(in_barrier(a) for a in m.absent)
        cand.first = min(cand.first, m.entered[0])
    for w in p2p:
        c = comp[graph.rank_nodes[w.rank]]
        if c not in cyclic or comp[graph.rank_nodes[w.peer]] != c:
            continue
        key = _p2p_key(w)
        cand = candidates.setdefault(c, {}).get(key)
        if cand is None:
            cand = candidates[c][key] = _Candidate(key=key, mtp=False, barrier=False, rank0_gate=False,
                                                   other_side_in_barrier=False, entered=0, first=w.rank,
                                                   skipped=False)
        cand.entered += 1
        cand.other_side_in_barrier |= in_barrier(w.peer)
        cand.first = min(cand.first, w.rank)
    return {c: min(cands.values(), key=_root_score).key for c, cands in candidates.items()}


def _root_score(c: _Candidate) -> tuple[bool, bool, bool, bool, bool, int, int, str]:
    """Lower is more likely the cause.

    A known signature first; then a split the Flight Recorder shows an absent rank skipped (it went on to
    later collectives without issuing it: program order, not a guess); a barrier is where ranks that went
    ahead wait, so it is never the cause while something else is in the core; a gate on 0 or on the last
    pipeline stage is how rank-dependent code is written; a split whose absent side sits in a barrier is
    the one they skipped; then the split entered by fewer ranks; then the lowest rank, for a stable answer.
    """
    return (not c.mtp, not c.skipped, c.barrier, not c.rank0_gate, not c.other_side_in_barrier, c.entered,
            c.first, repr(c.key))


def _rank0_style(gate: Mapping[str, int] | None, layout: ParallelLayout | None) -> bool:
    if not gate:
        return False
    last_stage = layout.pp - 1 if layout is not None else None
    return all(v == 0 or (k == "pp" and v == last_stage) for k, v in gate.items())
