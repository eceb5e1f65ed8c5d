"""Root cause versus consequence: the wait-for graph of a hang.

In a real deadlock split collectives block each other: rank 2 waits in an all_reduce for rank 3,
which waits in an all_gather for rank 2. Only one of them is the bug. This module builds the graph
"who waits on whom" — a rank waits on its split instance, an instance waits on its absent members, a
send/recv waits on its peer when the peer is not in the matching op — and finds:

* the cyclic cores (strongly connected components); in each, one root site is chosen (``roots``: program
  order from the Flight Recorder, the known-site table and the stacks, then heuristics) and every other
  split instance in the core is a consequence;
* the problem sinks: ranks that are waited on but wait on nothing themselves, because they run
  (stragglers), are stopped or unreadable (frozen), or were never captured (missing);
* everything that waits, directly or not, on a core or a problem sink is a consequence. A split with
  neither behind it is its own root.

Instances are nodes of their own, so a group of 8192 ranks costs 8192 edges, not 8192².
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, is_not

import msgspec
from msgspec.structs import replace as struct_replace

from mtpdiag.analysis.mismatch import is_p2p_op
from mtpdiag.analysis.program_order import RootOrder, StackOrders
from mtpdiag.analysis.roots import CoreSite, SiteKey, choose_roots, mismatch_site_key
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Mismatch, RankView, Site, Stack
from mtpdiag.vocabulary.ops import RECV_OPS, SEND_OPS
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


class P2PWait(msgspec.Struct, frozen=True, gc=False):
    """A rank blocked in a send/recv whose peer is not in the matching op (a msgspec Struct: a pipeline's
    thousands of them are made five times faster than as a NamedTuple)."""

    rank: int
    op: str
    site: Site | None
    peer: int


class Waiter(msgspec.Struct, frozen=True):
    """Something that waits on a problem rank: a split instance (index) or a p2p wait."""

    mismatch: int | None = None
    p2p: P2PWait | None = None


class Causes(msgspec.Struct, frozen=True):
    """The outcome: roles assigned, root p2p waits, and the waited-on problem ranks."""

    mismatches: tuple[Mismatch, ...]
    root_p2p: tuple[P2PWait, ...]
    consequence_p2p: tuple[P2PWait, ...]
    # problem rank (running/stopped/gone/unreadable or not captured) -> what waits on it directly
    blocked_on: Mapping[int, tuple[Waiter, ...]] = msgspec.field(default_factory=dict)
    # root site (``roots.mismatch_site_key``) -> why program order makes it the root of its cycle, when it does
    orders: Mapping[SiteKey, RootOrder] = msgspec.field(default_factory=dict)


def _direction(view: RankView) -> str:
    if view.op in SEND_OPS:
        return "send"
    if view.op in RECV_OPS:
        return "recv"
    return "both"  # batch_isend_irecv, a wait in pipeline p2p code


def unmatched_p2p(views: Mapping[int, RankView]) -> list[P2PWait]:
    """Ranks in a send/recv with a known peer that is not in the matching op (or not waiting at all)."""
    out = []
    # only the ranks that name a peer (a pipeline's senders, a few thousand of 16k ranks), picked in C
    for rank in compress(views, map(is_not, map(attrgetter("peer"), views.values()), repeat(None))):
        view = views[rank]
        peer = view.peer
        if peer is None or view.state != RankState.COLLECTIVE or not is_p2p_op(view.op, view.site):
            continue
        other = views.get(peer)
        if other is not None and other.state == RankState.COLLECTIVE and is_p2p_op(other.op, other.site):
            mine, theirs = _direction(view), _direction(other)
            complementary = mine == "both" or theirs == "both" or mine != theirs
            if complementary and other.peer in (rank, None):
                continue
        out.append(P2PWait(rank, view.op or "", view.site, peer))
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
        self.closed: list[int] = []  # see ``components``

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

    def add_edges(self, waiters: Sequence[int], waited: Sequence[int]) -> None:
        """Each rank of ``waiters`` waits on the rank at the same place in ``waited`` (``edge`` without a
        method call each: 8,192 CP pairs and 4,096 sends at 16k ranks; their nodes looked up in C)."""
        try:
            sources = list(map(self.rank_nodes.__getitem__, waiters))
            targets = list(map(self.rank_nodes.__getitem__, waited))
        except KeyError:  # a rank nobody captured: its node is made now
            sources, targets = list(map(self.rank, waiters)), list(map(self.rank, waited))
        edges = self.edges
        for a, b in zip(sources, targets, strict=True):
            edges[a].append(b)

    def components(self) -> list[int]:
        """Tarjan's strongly connected components, iteratively (no recursion limit at 16k ranks); each node's
        out-edges are walked by one iterator that the work stack resumes. A node is on the stack while it is
        visited and not yet in a component. ``closed``: the nodes in the order their components closed,
        which is after every component they reach."""
        edges = self.edges
        n = len(edges)
        index, low, comp = [-1] * n, [0] * n, [-1] * n
        stack: list[int] = []
        closed: list[int] = []
        self.closed = closed
        counter = components = 0
        for start in range(n):
            if index[start] != -1:
                continue
            index[start] = low[start] = counter
            counter += 1
            stack.append(start)
            work = [(start, iter(edges[start]))]
            while work:
                v, outs = work[-1]
                for w in outs:
                    if index[w] == -1:
                        index[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        work.append((w, iter(edges[w])))
                        break
                    if comp[w] == -1 and index[w] < low[v]:
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
                            comp[w] = components
                            closed.append(w)
                            if w == v:
                                break
                        components += 1
        return comp

    def reaching(self, comp: list[int], reached: list[bool]) -> list[bool]:
        """Each component that has a path to one marked in ``reached`` (by component id), marked too.

        One pass over the nodes in the order ``components`` closed them decides each component after all
        those it reaches (no reverse graph, no queue)."""
        edges, at, comp_of = self.edges, reached.__getitem__, comp.__getitem__
        for v in self.closed:
            c = comp[v]
            if not reached[c] and any(map(at, map(comp_of, edges[v]))):
                reached[c] = True
        return reached


def find_causes(
    mismatches: Sequence[Mismatch],
    views: Mapping[int, RankView],
    layout: ParallelLayout | None,
    root_hints: frozenset[SiteKey] = frozenset(),
    stacks: Sequence[Stack] = (),
) -> Causes:
    """Assign root/consequence roles and find the problem ranks others wait on. ``root_hints``: the keys
    (``mismatch.mismatch_key``) of splits the Flight Recorder's program order shows some rank skipped;
    ``stacks``: the report's stack table (``RankView.stack`` indexes it), for the stacks' program order."""
    p2p = unmatched_p2p(views)
    graph = _Graph(list(views))
    # A split of one entered and one absent rank (a CP pair) is an edge between them, not a node of its own:
    # the graph of 16k ranks is then a third smaller, with the same components and reachability.
    nodes: list[int | None] = [
        None if len(m.entered) == 1 and len(m.absent) == 1 else graph.add_mismatch(m.entered, m.absent)
        for m in mismatches
    ]
    pairs = [i for i, node in enumerate(nodes) if node is None]
    waiters, waited = [mismatches[i].entered[0] for i in pairs], [mismatches[i].absent[0] for i in pairs]
    graph.add_edges(waiters, waited)
    graph.add_edges([w.rank for w in p2p], [w.peer for w in p2p])

    comp = graph.components()
    cyclic = {c for c, n in Counter(comp).items() if n > 1}
    mcomp = [comp[n] if n is not None else -1 for n in nodes]
    for i, c in zip(pairs, _pair_components(comp, graph, waiters, waited, pairs), strict=True):
        mcomp[i] = c

    blocked = _blocked_on(mismatches, p2p, views, graph)
    downstream = _downstream(graph, comp, cyclic, blocked)

    # the split instances of each cyclic core, by site: (component, op, site, group) -> their indices
    cores: dict[CoreSite, list[int]] = {}
    site_of = attrgetter("op", "site", "group")
    for i, (m, c) in enumerate(zip(mismatches, mcomp, strict=True)):
        if c in cyclic:
            cores.setdefault((c, *site_of(m)), []).append(i)
    orders = StackOrders(stacks, views) if stacks else None
    chosen = choose_roots(mismatches, cores, _p2p_in_cores(p2p, graph, comp, cyclic), views, layout, root_hints, orders)
    root_keys = chosen.keys
    key_of = mismatch_site_key
    roots = {i for (c, *_), idx in cores.items() if root_keys.get(c) == key_of(mismatches[idx[0]]) for i in idx}
    roles = []
    for i, (m, node, c) in enumerate(zip(mismatches, nodes, mcomp, strict=True)):
        if c in cyclic:
            root = i in roots
        else:  # a pair reaches what its absent rank reaches
            root = not downstream[comp[node if node is not None else graph.rank_nodes[m.absent[0]]]]
        role = Role.ROOT if root else Role.CONSEQUENCE
        roles.append(m if m.role == role else struct_replace(m, role=role))
    root_p2p, consequence_p2p = _p2p_roles(p2p, graph, comp, cyclic, downstream, root_keys)
    return Causes(
        mismatches=tuple(roles),
        root_p2p=tuple(root_p2p),
        consequence_p2p=tuple(consequence_p2p),
        blocked_on={r: tuple(ws) for r, ws in sorted(blocked.items())},
        orders=chosen.orders,
    )


def _blocked_on(
    mismatches: Sequence[Mismatch], p2p: Sequence[P2PWait], views: Mapping[int, RankView], graph: _Graph
) -> dict[int, list[Waiter]]:
    """The problem ranks (holding the job up, or never captured) and what waits on each of them."""
    holding = _holding_up(views)
    blocked: dict[int, list[Waiter]] = {}
    if holding or len(graph.rank_nodes) > len(views):  # or a split or send names a rank nobody captured
        for i, m in enumerate(mismatches):
            for a in m.absent:
                if a in holding or a not in views:
                    blocked.setdefault(a, []).append(Waiter(mismatch=i))
        for w in p2p:
            if w.peer in holding or w.peer not in views:
                blocked.setdefault(w.peer, []).append(Waiter(p2p=w))
    return blocked


def _downstream(graph: _Graph, comp: list[int], cyclic: set[int], blocked: Mapping[int, object]) -> list[bool]:
    """By component: whether it waits, directly or not, on a cyclic core or a problem rank."""
    reached = [False] * (max(comp) + 1 if comp else 0)
    for c in cyclic:
        reached[c] = True
    for r in blocked:
        reached[comp[graph.rank_nodes[r]]] = True
    return graph.reaching(comp, reached)


def _p2p_roles(
    p2p: Sequence[P2PWait],
    graph: _Graph,
    comp: list[int],
    cyclic: set[int],
    downstream: list[bool],
    root_keys: Mapping[int, SiteKey],
) -> tuple[list[P2PWait], list[P2PWait]]:
    """The pending sends and receives split into roots and consequences, as the splits are."""
    root_p2p: list[P2PWait] = []
    consequence_p2p: list[P2PWait] = []
    for w in p2p:
        c = comp[graph.rank_nodes[w.rank]]
        if c in cyclic:
            root = root_keys.get(c) == _p2p_key(w) and comp[graph.rank_nodes[w.peer]] == c
        else:
            root = not downstream[c]
        (root_p2p if root else consequence_p2p).append(w)
    return root_p2p, consequence_p2p


def _holding_up(views: Mapping[int, RankView]) -> set[int]:
    """The captured ranks that ``holds_up`` (an uncaptured one always does). A rank in a collective never
    does: only the others are asked, picked in C loops (at 16k ranks nearly all wait in collectives)."""
    states = map(attrgetter("state"), views.values())
    return {r for r in compress(views, map(RankState.COLLECTIVE.__ne__, states)) if holds_up(views[r])}


def _p2p_in_cores(
    p2p: Sequence[P2PWait], graph: _Graph, comp: list[int], cyclic: set[int]
) -> dict[int, list[tuple[SiteKey, int, int]]]:
    """Per cyclic core, each unmatched send/recv whose rank and peer are both in it: its key, rank and peer."""
    out: dict[int, list[tuple[SiteKey, int, int]]] = {}
    for w in p2p:
        c = comp[graph.rank_nodes[w.rank]]
        if c in cyclic and comp[graph.rank_nodes[w.peer]] == c:
            out.setdefault(c, []).append((_p2p_key(w), w.rank, w.peer))
    return out


def _p2p_key(w: P2PWait) -> SiteKey:
    return ("p", w.op, w.site)


def _pair_components(
    comp: list[int], graph: _Graph, entered: Sequence[int], absent: Sequence[int], indices: Sequence[int]
) -> list[int]:
    """The component of each split made an edge (its entered and absent rank, its index among the splits): its
    ranks' when they share one, else one of its own (a negative id no node has)."""
    node, comp_of = graph.rank_nodes.__getitem__, comp.__getitem__
    return [
        e if e == a else -1 - i
        for e, a, i in zip(map(comp_of, map(node, entered)), map(comp_of, map(node, absent)), indices, strict=True)
    ]
