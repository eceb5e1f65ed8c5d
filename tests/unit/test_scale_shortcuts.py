"""The shortcuts that keep ``analyze`` of 16k ranks fast give what the general path gives.

* ``StackReader.views`` reads each class of ranks once; every recorded capture (and a tiled 64-rank world)
  must read as each rank read on its own does (``StackReader._one``, the general path).
* ``diagnose._sorted_and_indexed`` orders and indexes views whose ranks are distinct by rank alone: it must
  give what the general sort and ``_index`` give, notes included, whatever the ranks.
* ``diagnose._Coordinates`` (the analysis' ``coords_of``) holds the views' coordinates and computes any other
  rank's as ``ParallelLayout.coords`` does.
* ``ParallelLayout.coordinates_alike``: when it says so, every instance of a kind varies in the same
  coordinates as its first one (the gate reads them from one split instance).
* ``ParallelLayout.coords_each`` (the coordinates of a report's ranks in one call) gives each rank's index in
  its groups, as ``coords`` does, and None for a rank outside the world.
* ``ParallelLayout.pp_neighbour`` is ``group_of("pp", rank)`` stepped by one stage.
* ``find_causes`` makes a split of one entered and one absent rank an edge: the components of the graph
  with it as a node of its own must say the same of every split.
"""

from __future__ import annotations

import itertools
import random

import pytest

from mtpdiag.analysis.causes import _Graph, _pair_component
from mtpdiag.analysis.diagnose import _Coordinates, _index, _sorted_and_indexed
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
        "in rank order": views, "shuffled": shuffled, "empty": [],
        "a rank twice": [*shuffled, replace(views[5], pid=1)],
        "an unranked view": [*shuffled, replace(views[5], rank=None)],
        "a rank outside the world": [*shuffled, replace(views[5], rank=64)],
        "a negative rank": [*shuffled, replace(views[5], rank=-1)],
    }
    for case, captured in cases.items():
        for lay in (big, None):
            general_notes: list[str] = []
            general = tuple(sorted(captured, key=lambda v: (v.rank is None, v.rank or 0, v.pid or 0)))
            expected = (general, _index(general, lay, general_notes))
            notes: list[str] = []
            got = _sorted_and_indexed(list(captured), lay, notes)
            assert got == expected and list(got[1]) == list(expected[1]) and notes == general_notes, (case, lay)


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
    for world, tp, cp, pp, ep, etp, order in itertools.product((8, 12, 24), (1, 2, 3), (1, 2), (1, 2, 4), (1, 2),
                                                              (None, 2), orders):
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
            patterns = {tuple(name for name in COORDINATES if len({layout.coords(r)[name] for r in group}) > 1)
                        for group in layout.groups(kind)}
            assert len(patterns) == 1, (layout, kind, patterns)
            checked += 1
    assert checked > 1000


def test_coords_each_is_each_ranks_place_in_its_groups_and_none_outside_the_world():
    for layout in _layouts():
        world = layout.world_size
        places = [{c: sorted(layout.group_of(c, r)).index(r) for c in ("tp", "cp", "ep", "dp", "pp")}
                  for r in range(world)]  # megatron's get_*_rank(): the index in the sorted group
        assert layout.coords_each([*range(world), None, -1, world, world + 5]) == [*places, None, None, None, None]
        assert layout.coords_each(iter(range(world - 1, -1, -1))) == places[::-1]
        assert [layout.coords(r) for r in range(world)] == places


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
            splits.append(Mismatch(op="all_reduce", site=None, group="dp", members=tuple(sorted(members)),
                                   entered=tuple(sorted(members[:cut])), absent=tuple(sorted(members[cut:])),
                                   gate=None))
        edges = [(rng.randrange(n), rng.randrange(n + 2)) for _ in range(rng.randint(0, 4))]  # p2p waits
        full, short = _Graph(range(n)), _Graph(range(n))
        nodes = [full.add_mismatch(m.entered, m.absent) for m in splits]
        kept: list[int | None] = []
        for m in splits:
            if len(m.entered) == 1 and len(m.absent) == 1:
                short.edge(m.entered[0], m.absent[0])
                kept.append(None)
                pairs += 1
            else:
                kept.append(short.add_mismatch(m.entered, m.absent))
        for a, b in edges:
            full.edge(a, b)
            short.edge(a, b)
        comp, comp_short = full.components(), short.components()
        sizes, sizes_short = _sizes(comp), _sizes(comp_short)
        mcomp = [comp_short[k] if k is not None else _pair_component(comp_short, short, m, i)
                 for i, (m, k) in enumerate(zip(splits, kept, strict=True))]
        for i, j in itertools.product(range(len(splits)), repeat=2):
            assert (comp[nodes[i]] == comp[nodes[j]]) == (mcomp[i] == mcomp[j])
        for i in range(len(splits)):
            assert (sizes[comp[nodes[i]]] > 1) == (sizes_short.get(mcomp[i], 1) > 1)
    assert pairs > 1000


def _sizes(comp: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in comp:
        out[c] = out.get(c, 0) + 1
    return out
