"""Many host bundles of a bigger world, made from the recorded MTP-CP hang (tests/support/captures.py:tile).

The recorded 4-rank hang (cp=2, pp=2) is tiled over 16 dp replicas (64 ranks) and saved as 8 host
bundles, as ``collect`` on 8 nodes would write them. ``load_paths`` must merge them by rank, keep
each rank's host and file, and refuse a malformed frame even where an identical-looking valid one
came before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.errors import InputError
from mtpdiag.inputs import load_paths
from mtpdiag.inputs.bundle import save_bundle
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Snapshot, replace
from support.captures import load_scenario, tile

WORLD, PER_HOST = 64, 8


@pytest.fixture(scope="module")
def host_bundles(tmp_path_factory):
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    big = ParallelLayout.for_world(WORLD, cp=2, pp=2)
    tiled = tile(snapshot, layout, big)
    directory = tmp_path_factory.mktemp("hosts")
    paths = []
    for node in range(WORLD // PER_HOST):
        host = f"node-{node}"
        chunk = tiled.captures[node * PER_HOST : (node + 1) * PER_HOST]
        bundle = Snapshot(captures=tuple(replace(c, host=host, source=None) for c in chunk), host=host)
        paths.append(save_bundle(bundle, str(directory)))
    return directory, paths, big


def test_host_bundles_merge_by_rank_and_keep_host_and_file(host_bundles):
    directory, paths, big = host_bundles
    merged = load_paths([str(directory)])
    assert [c.rank for c in merged.captures] == list(range(WORLD))
    assert all(c.host == f"node-{c.rank // PER_HOST}" for c in merged.captures)
    assert all(c.source == paths[c.rank // PER_HOST] for c in merged.captures)
    report = diagnose(merged, big)
    ids = [f.id for f in report.findings]
    assert ids[0] == "mtp-cp-gated-reduce" and "missing-rank" not in ids


def test_a_rank_in_two_host_bundles_is_one_or_a_conflict_and_a_host_of_another_world_is_refused(host_bundles, tmp_path):
    _, paths, _ = host_bundles
    merged = load_paths(paths)
    assert merged.world_sizes == [WORLD] and merged.host == ",".join(f"node-{n}" for n in range(WORLD // PER_HOST))
    last = replace(merged.captures[WORLD - 1], source=None)
    again = tmp_path / "again.mtpdiag.json"  # the same capture saved twice: one rank
    save_bundle(Snapshot(captures=(last,), host="again"), str(again))
    twice = load_paths([*paths, str(again)])
    assert len(twice.captures) == WORLD and twice.conflicts == ()
    moved = tmp_path / "moved.mtpdiag.json"  # another process claims the rank: both kept, named
    save_bundle(Snapshot(captures=(replace(last, pid=(last.pid or 0) + 1),), host="moved"), str(moved))
    both = load_paths([*paths, str(moved)])
    assert len(both.captures) == WORLD + 1 and [c.rank for c in both.captures[-2:]] == [WORLD - 1, WORLD - 1]
    (conflict,) = both.conflicts
    assert conflict.rank == WORLD - 1 and conflict.sources == (paths[-1], str(moved))
    other = tmp_path / "other.mtpdiag.json"
    stray = replace(merged.captures[0], rank=WORLD, env=replace(merged.captures[0].env, WORLD_SIZE=str(2 * WORLD)))
    save_bundle(Snapshot(captures=(replace(stray, source=None),), host="other"), str(other))
    with pytest.raises(InputError, match=f"world sizes differ: {paths[0]} says {WORLD}, {other} says {2 * WORLD}"):
        load_paths([*paths, str(other)])


def test_a_missing_host_is_reported_as_its_missing_ranks(host_bundles):
    _, paths, big = host_bundles
    absent = 5
    report = diagnose(load_paths([p for i, p in enumerate(paths) if i != absent]), big)
    missing = next(f for f in report.findings if f.id == "missing-rank")
    assert missing.ranks == tuple(range(absent * PER_HOST, (absent + 1) * PER_HOST))


def test_ranks_with_the_same_stack_have_equal_frames_and_peers_stay_apart(host_bundles):
    _, paths, _ = host_bundles
    captures = load_paths([paths[0]]).captures
    rank1, rank3 = captures[1].main_thread.frames, captures[3].main_thread.frames
    assert rank1 == rank3 and hash(rank1) == hash(rank3) and rank1[0].function == "all_gather"
    sends = [c.main_thread.frames[0] for c in captures if c.main_thread.frames[0].function == "send"]
    assert len({f.arg("dst") for f in sends}) == len(sends)  # different peers stay different frames


@pytest.mark.parametrize("good_line,bad_line", [(1, True), (68, "68"), (68, None)])
def test_a_bad_frame_after_an_identical_good_one_is_still_refused(host_bundles, tmp_path, good_line, bad_line):
    """``True == 1`` and hashes alike: the decoder must still tell them apart."""
    _, paths, _ = host_bundles
    doc = json.loads(Path(paths[0]).read_text())
    good = doc["captures"][1]["threads"][0]["frames"][2]
    later = doc["captures"][3]["threads"][0]["frames"][2]
    assert later == good
    good["line"], later["line"] = good_line, bad_line
    broken = tmp_path / "node-0.mtpdiag.json"
    broken.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        load_paths([str(broken)])
    assert str(broken) in str(exc.value) and "line" in str(exc.value)


def test_paused_gc_hands_back_an_empty_young_generation_and_frees_cycles():
    """What analyze makes under the pause must not all sit in generation 0 afterwards (a young
    collection over it cost 0.1 s at 16k ranks), nor be frozen for good (cycles must stay collectable)."""
    import gc
    import weakref

    from mtpdiag.pipeline import paused_gc

    class Node:
        pass

    was_enabled = gc.isenabled()
    gc.enable()
    try:
        with paused_gc():
            assert not gc.isenabled()
            made = [[i] for i in range(50_000)]
            cycle = Node()
            cycle.self = cycle
            alive = weakref.ref(cycle)
            del cycle
        assert gc.isenabled()
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert id(made[0]) in oldest and id(made[-1]) in oldest  # not young: no collection walks them soon
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert alive() is None
    finally:
        if not was_enabled:
            gc.disable()
