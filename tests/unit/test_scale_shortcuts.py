"""The shortcuts that keep ``analyze`` of 16k ranks fast give what the general path gives.

* ``StackReader.views`` reads each class of ranks once; every recorded capture (and a tiled 64-rank world)
  must read as each rank read on its own does (``StackReader._one``, the general path).
* ``ranks.place_ranks`` orders and indexes views whose ranks are distinct by rank alone: it must
  give what the general sort and ``_index`` give, notes included, whatever the ranks.
* ``ranks._Coordinates`` (the analysis' ``coords_of``) holds the views' coordinates and computes any other
  rank's as ``ParallelLayout.coords`` does.
* ``ParallelLayout.coordinates_alike``: when it says so, every instance of a kind varies in the same
  coordinates as its first one (the gate reads them from one split instance).
* ``ParallelLayout.coords_each`` (the coordinates of a report's ranks in one call) gives each rank's index in
  its groups, as ``coords`` does, and None for a rank outside the world.
* ``ParallelLayout.pp_neighbour`` is ``group_of("pp", rank)`` stepped by one stage.
* ``find_causes`` makes a split of one entered and one absent rank an edge: the components of the graph
  with it as a node of its own must say the same of every split. What reaches a core or a problem rank is
  decided component by component in the order Tarjan closed them: it must be what a search of the
  reversed graph finds.
* ``ParallelLayout.varying_in`` and ``coordinate`` answer from the rank digits what the instances' members'
  ``coords`` say; each instance of ``groups`` is ascending (``find_mismatches`` takes its first as its least);
  ``group_of`` refuses a rank outside the world (its index is a list).
* ``find_mismatches`` reads the gate in bulk from the layout and words the ranks waiting at one site together:
  every split must say what ``read_gate`` (rank by rank, through ``coords``) and ``doing`` of each rank say.
"""

from __future__ import annotations

import itertools
import random

import pytest

from mtpdiag.analysis.causes import _Graph, _pair_components
from mtpdiag.analysis.gate import read_gate
from mtpdiag.analysis.known_sites import is_mtp_site
from mtpdiag.analysis.mismatch import doing, find_mismatches
from mtpdiag.analysis.ranks import _Coordinates, _index, place_ranks
from mtpdiag.analysis.views import StackReader
from mtpdiag.layout import GROUP_KINDS, LayoutError, ParallelLayout
from mtpdiag.model import Mismatch, replace
from mtpdiag.vocabulary.groups import COORDINATES
from support.captures import load_scenario, scenarios, tile


@pytest.mark.parametrize("name", scenarios())
def test_ranks_read_by_class_read_as_each_rank_alone(name):
    snapshot, layout, _ = load_scenario(name)
    for lay in (layout, None):
        by_class = StackReader(lay)
        alone = StackReader(lay)
        assert by_class.views(snapshot.captures) == [alone._one(c) for c in snapshot.captures]
        assert by_class.stacks() == alone.stacks()


def test_a_tiled_world_reads_by_class_as_each_rank_alone():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    big = ParallelLayout.for_world(64, cp=2, pp=2)
    tiled = tile(snapshot, layout, big)
    by_class, alone = StackReader(big), StackReader(big)
    views = by_class.views(tiled.captures)
    assert views == [alone._one(c) for c in tiled.captures]
    assert len({v.peer for v in views if v.op == "send"}) == 16  # each send's own dst, not its class's first


def test_views_ordered_by_rank_alone_are_ordered_and_indexed_as_by_the_general_path():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    big = ParallelLayout.for_world(64, cp=2, pp=2)
    views = StackReader(big).views(tile(snapshot, layout, big).captures)
    shuffled = random.Random(13).sample(views, len(views))
    cases = {
        "in rank order": views,
        "shuffled": shuffled,
        "empty": [],
        "a rank twice": [*shuffled, replace(views[5], pid=1)],
        "an unranked view": [*shuffled, replace(views[5], rank=None)],
        "a rank outside the world": [*shuffled, replace(views[5], rank=64)],
        "a negative rank": [*shuffled, replace(views[5], rank=-1)],
    }
    for case, captured in cases.items():
        for lay in (big, None):
            # the general path: by rank, a rank's views in capture order, unranked ones last by pid
            general = tuple(
                sorted(captured, key=lambda v: (v.rank is None, v.rank or 0, (v.pid or 0) * (v.rank is None)))
            )
            by_rank, general_notes = _index(general, lay, ())
            got = place_ranks(list(captured), lay)
            assert got.views == general and got.by_rank == by_rank and list(got.by_rank) == list(by_rank), (case, lay)
            assert got.notes == general_notes, (case, lay)


def test_coords_of_is_each_views_coordinates_and_the_layouts_for_any_other_rank():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    big = ParallelLayout.for_world(64, cp=2, pp=2)
    views = StackReader(big).views(tile(snapshot, layout, big).captures[:40])  # ranks 40-63 not captured
    coords_of = _Coordinates(big, [*views, replace(views[0], rank=None, coords=None)]).__getitem__
    assert [coords_of(r) for r in range(64)] == [big.coords(r) for r in range(64)]
    assert all(coords_of(v.rank) is v.coords for v in views)
    with pytest.raises(LayoutError, match="outside a world of 64"):
        coords_of(64)
    with pytest.raises(LayoutError, match="no coordinates without a layout"):
        _Coordinates(None, StackReader(None).views(snapshot.captures))[0]


def _layouts():
    orders = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-dp-cp-ep", "pp-dp-tp-cp-ep", "cp-tp-ep-dp-pp")
    for world, tp, cp, pp, ep, etp, order in itertools.product(
        (8, 12, 24), (1, 2, 3), (1, 2), (1, 2, 4), (1, 2), (None, 2), orders
    ):
        try:
            yield ParallelLayout.for_world(world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, order=order)
        except LayoutError:
            continue


def test_instances_said_alike_vary_in_the_same_coordinates():
    checked = 0
    for layout in _layouts():
        for kind in GROUP_KINDS:
            if not layout.coordinates_alike(kind):
                continue
            patterns = {
                tuple(name for name in COORDINATES if len({layout.coords(r)[name] for r in group}) > 1)
                for group in layout.groups(kind)
            }
            assert len(patterns) == 1, (layout, kind, patterns)
            checked += 1
    assert checked > 1000


def test_coords_each_is_each_ranks_place_in_its_groups_and_none_outside_the_world():
    for layout in _layouts():
        world = layout.world_size
        places = [
            {c: sorted(layout.group_of(c, r)).index(r) for c in ("tp", "cp", "ep", "dp", "pp")} for r in range(world)
        ]  # megatron's get_*_rank(): the index in the sorted group
        assert layout.coords_each([*range(world), None, -1, world, world + 5]) == [*places, None, None, None, None]
        assert layout.coords_each(iter(range(world - 1, -1, -1))) == places[::-1]
        assert [layout.coords(r) for r in range(world)] == places


def test_varying_coordinates_and_coordinate_values_are_those_of_the_members_coords():
    for layout in _layouts():
        ranks = range(layout.world_size)
        for name in COORDINATES:
            assert layout.coordinate(name, ranks) == [layout.coords(r)[name] for r in ranks], (layout, name)
        for kind in GROUP_KINDS:
            groups = layout.groups(kind)
            assert all(list(g) == sorted(g) for g in groups), (layout, kind)
            varying = layout.varying_in(kind)
            if varying is None:
                assert not layout.coordinates_alike(kind)
                continue
            for group in groups:
                assert varying == tuple(n for n in COORDINATES if len({layout.coords(r)[n] for r in group}) > 1)
        for outside in (-1, layout.world_size):  # the rank index is a list: a negative rank must not wrap
            with pytest.raises(LayoutError):
                layout.group_of("tp", outside)


def _split_worlds():
    for name in scenarios():
        snapshot, layout, _ = load_scenario(name)
        yield name, snapshot, layout
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    big = ParallelLayout.for_world(64, cp=2, pp=2)
    yield "mtp_cp_pp tiled to 64", tile(snapshot, layout, big), big


def test_splits_read_in_bulk_say_what_each_rank_read_alone_says():
    checked = 0
    for name, snapshot, layout in _split_worlds():
        by_rank = {}
        for view in StackReader(layout).views(snapshot.captures):
            if view.rank is not None and 0 <= view.rank < layout.world_size:
                by_rank.setdefault(view.rank, view)
        splits = find_mismatches(by_rank, layout)
        for m in splits:
            assert m.absent_doing == {a: doing(by_rank.get(a)) for a in m.absent}, name
            assert m.members == tuple(sorted(m.entered + m.absent)), name
            site = [s for s in splits if (s.op, s.site) == (m.op, m.site)]
            alone = read_gate(site, layout.coords)
            assert (m.gate, m.gate_alternatives) == (alone.gate, alone.alternatives), name
            known = is_mtp_site(m.site) and m.group == "dp_cp" and m.gate == {"cp": 0}  # always strong
            assert m.gate_strength == (alone.strength if not known else "strong"), name
            checked += 1
    assert checked > 20


def test_pp_neighbour_is_the_next_or_previous_member_of_the_pipeline_group():
    for layout in _layouts():
        for rank in range(layout.world_size):
            stages = layout.group_of("pp", rank)
            here = stages.index(rank)
            for step in (1, -1):
                assert layout.pp_neighbour(rank, step) == stages[(here + step) % len(stages)]


def test_a_split_of_two_ranks_as_an_edge_keeps_every_split_in_its_component():
    rng = random.Random(13)
    pairs = 0
    for _ in range(1500):
        n = rng.randint(2, 16)
        splits = []
        for _ in range(rng.randint(1, 8)):
            members = rng.sample(range(n + 2), rng.randint(2, 4))  # n, n+1: ranks nobody captured
            cut = rng.randint(1, len(members) - 1)
            splits.append(
                Mismatch(
                    op="all_reduce",
                    site=None,
                    group="dp",
                    members=tuple(sorted(members)),
                    entered=tuple(sorted(members[:cut])),
                    absent=tuple(sorted(members[cut:])),
                    gate=None,
                )
            )
        edges = [(rng.randrange(n), rng.randrange(n + 2)) for _ in range(rng.randint(0, 4))]  # p2p waits
        full, short = _Graph(range(n)), _Graph(range(n))
        nodes = [full.add_mismatch(m.entered, m.absent) for m in splits]
        kept: list[int | None] = []
        for m in splits:
            if len(m.entered) == 1 and len(m.absent) == 1:
                kept.append(None)
                pairs += 1
            else:
                kept.append(short.add_mismatch(m.entered, m.absent))
        paired = [i for i, k in enumerate(kept) if k is None]
        short.add_edges([splits[i].entered[0] for i in paired], [splits[i].absent[0] for i in paired])
        for a, b in edges:
            full.edge(a, b)
        short.add_edges([a for a, _ in edges], [b for _, b in edges])
        comp, comp_short = full.components(), short.components()
        sizes, sizes_short = _sizes(comp), _sizes(comp_short)
        made = _pair_components(
            comp_short, short, [splits[i].entered[0] for i in paired], [splits[i].absent[0] for i in paired], paired
        )
        mcomp = [comp_short[k] if k is not None else made[paired.index(i)] for i, k in enumerate(kept)]
        for i, j in itertools.product(range(len(splits)), repeat=2):
            assert (comp[nodes[i]] == comp[nodes[j]]) == (mcomp[i] == mcomp[j])
        for i in range(len(splits)):
            assert (sizes[comp[nodes[i]]] > 1) == (sizes_short.get(mcomp[i], 1) > 1)
        # what reaches some problem ranks (and every cyclic core): as a search of the reversed graph says
        problems = [full.rank_nodes[r] for r in rng.sample(range(n + 2), rng.randint(0, 2)) if r in full.rank_nodes]
        targets = {v for v, c in enumerate(comp) if sizes[c] > 1} | set(problems)
        reached = [False] * len(sizes)
        for v in targets:
            reached[comp[v]] = True
        reached = full.reaching(comp, reached)
        assert {v for v, c in enumerate(comp) if reached[c]} == _reaching(full.edges, targets)
    assert pairs > 1000


def _reaching(edges: list[list[int]], targets: set[int]) -> set[int]:
    """Nodes with a path to a target, by a plain search of the reversed graph."""
    reverse: list[list[int]] = [[] for _ in edges]
    for v, outs in enumerate(edges):
        for w in outs:
            reverse[w].append(v)
    seen, todo = set(targets), list(targets)
    while todo:
        for u in reverse[todo.pop()]:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _sizes(comp: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in comp:
        out[c] = out.get(c, 0) + 1
    return out
