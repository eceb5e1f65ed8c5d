"""diagnose() on hangs recorded from real torchrun/gloo jobs (tests/fixtures/captures)."""

from __future__ import annotations

import json
import os

import msgspec
import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.analysis.diagnose import NO_LAYOUT_NOTE
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Env, Snapshot, replace
from support.captures import load_scenario, scenario_dir, scenarios, tile

ROOT_IDS = {"mtp-cp-gated-reduce", "gated-collective", "p2p-unmatched", "straggler", "frozen-rank"}
# The finding each recorded hang must lead with; a newly recorded scenario has to say what it shows.
FIRST_FINDING = {
    "mtp_cp_pp": "mtp-cp-gated-reduce",
    "mtp_cp_dp": "mtp-cp-gated-reduce",
    "tp_broadcast": "gated-collective",
    "p2p_count": "p2p-unmatched",
    "straggler": "straggler",
    "frozen": "frozen-rank",
    "network_loss": "all-waiting",
    # examples/nccl_behaviour: the stacks show host syncs only; the Flight Recorder names the split
    "nccl_mtp_cp_pp_spin": "mtp-cp-gated-reduce",
    "nccl_mtp_cp_pp_poll": "mtp-cp-gated-reduce",
    "nccl_mtp_cp_pp_futex": "mtp-cp-gated-reduce",
    "nccl_mtp_cp_dp_futex": "mtp-cp-gated-reduce",
    # examples/hangs
    "hang_comm_init": "gated-collective",
    "hang_data_loader": "straggler",
    "hang_lock_wait": "straggler",
    "hang_side_thread": "gated-collective",
    "hang_unreadable": "frozen-rank",
    # examples/lookalikes: tracker hangs on the pipeline group that are not the verl bug
    "lookalike_dsa_indexer_gloo": "gated-collective",
    "lookalike_dsa_indexer_nccl": "gated-collective",
    "lookalike_moe_lazy_tracker_gloo": "gated-collective",
    "lookalike_moe_lazy_tracker_nccl": "gated-collective",
    "lookalike_aux_loss_sizes_nccl": "size-mismatch",
    # root cause by program order (issue #20): the indexer's early return, then the job's own world all_reduce;
    # a tracker of the job's own in a loop body, with the Flight Recorder that decides it
    "lookalike_dsa_step_sync_gloo": "gated-collective",
    "tracker_loop_gloo_fr": "gated-collective",
}


def _report(name: str, **kwargs):
    snapshot, layout, meta = load_scenario(name, **kwargs)
    return diagnose(snapshot, layout, "scenario.json"), layout


def _root_findings(report):
    return [f for f in report.findings if f.id in ROOT_IDS]


def test_mtp_cp_pp_names_the_gated_reduce_as_the_root():
    report, layout = _report("mtp_cp_pp")
    assert report.verdict == "problem"
    assert report.findings[0].id == "mtp-cp-gated-reduce"
    assert [f.id for f in _root_findings(report)] == ["mtp-cp-gated-reduce"]
    assert "verl #5895" in report.findings[0].summary
    assert report.findings[0].remedy.endswith("mtpdiag verify --cp 2")
    root = [m for m in report.mismatches if m.role == "root"]
    assert len(root) == 1
    m = root[0]
    assert (m.op, m.group, m.members, m.entered, m.absent) == ("all_reduce", "dp_cp", (2, 3), (2,), (3,))
    assert m.gate == {"cp": 0}
    assert m.site.function == "MTPLossLoggingHelper.reduce_loss_in_tracker"
    assert "ring_attention" in m.absent_doing[3]
    others = [x for x in report.mismatches if x is not m]
    assert others and all(x.role == "consequence" for x in others)
    assert {(x.op, x.group, x.members) for x in others} == {("all_gather", "cp", (0, 1)), ("all_gather", "cp", (2, 3))}
    coords = {v.rank: v.coords for v in report.ranks}
    assert coords[2] == {"tp": 0, "cp": 0, "ep": 0, "dp": 0, "pp": 1}
    assert coords[3] == {"tp": 0, "cp": 1, "ep": 0, "dp": 0, "pp": 1}
    assert [v.rank for v in report.ranks] == [0, 1, 2, 3]
    rank0 = report.ranks[0]
    assert (rank0.state, rank0.op, rank0.peer, rank0.site.function) == ("collective", "send", 2, "send_forward")
    assert report.layout == layout.record() and report.layout_source == "scenario.json"
    assert report.world_size == 4


def test_mtp_cp_dp_splits_the_whole_dp_cp_group():
    report, _ = _report("mtp_cp_dp")
    assert report.findings[0].id == "mtp-cp-gated-reduce"
    assert len(_root_findings(report)) == 1
    (m,) = [m for m in report.mismatches if m.role == "root"]
    assert (m.group, m.members, m.entered, m.absent) == ("dp_cp", (0, 1, 2, 3), (0, 2), (1, 3))
    assert m.gate == {"cp": 0}
    assert report.findings[0].details.gate == {"cp": 0}


def test_tp_broadcast_is_a_collective_gated_on_tp_rank_0():
    report, _ = _report("tp_broadcast")
    first = report.findings[0]
    assert first.id == "gated-collective"
    assert first.details.gate == {"tp": 0}
    assert first.details.group == "tp"
    assert len(_root_findings(report)) == 1
    roots = [m for m in report.mismatches if m.role == "root"]
    assert {m.members for m in roots} == {(0, 1), (2, 3)}
    assert all(m.op == "broadcast" and m.entered == (m.members[0],) for m in roots)
    barrier = [m for m in report.mismatches if m.op == "barrier"]
    assert barrier and all(m.role == "consequence" for m in barrier)


def test_p2p_count_is_an_unmatched_send():
    report, _ = _report("p2p_count")
    assert [f.id for f in report.findings] == ["p2p-unmatched"]
    finding = report.findings[0]
    assert finding.ranks == (0, 1, 2, 3)
    assert "send(dst=2)" in finding.summary and "rank 2" in finding.summary
    assert report.mismatches == ()


def test_straggler_is_the_rank_outside_any_collective_while_its_group_waits():
    """Rank 3 polls for its data with time.sleep (a C call): py-spy sees it idle at load_batch's line. It is
    waiting, but on nothing of the group's: it holds the group up (a straggler), unlike a rank at a host sync."""
    report, _ = _report("straggler")
    assert report.findings[0].id == "straggler"
    assert report.findings[0].ranks == (3,)
    assert "load_batch" in report.findings[0].summary
    (m,) = report.mismatches
    assert (m.role, m.absent, m.absent_doing[3]) == ("consequence", (3,), "blocked in a C call in load_batch")
    view = report.ranks[3]
    assert (view.state, view.op, view.wait.kind) == ("waiting", None, "unknown")
    assert "idle" in view.wait.evidence[0]


def test_frozen_rank_is_the_stopped_one():
    report, _ = _report("frozen")
    assert [f.id for f in report.findings] == ["frozen-rank"]
    assert report.findings[0].ranks == (1,)
    assert report.ranks[1].state == "stopped"
    (m,) = report.mismatches
    assert (m.entered, m.absent, m.absent_doing) == ((0, 2, 3), (1,), {1: "stopped"})


@pytest.mark.parametrize("name", scenarios())
def test_a_missing_rank_file_is_named_with_its_coords(name):
    report, layout = _report(name, drop_ranks=(3,))
    assert report.verdict == "problem"
    missing = [f for f in report.findings if f.id == "missing-rank"]
    assert len(missing) == 1
    assert missing[0].ranks == (3,)
    assert missing[0].details.coords == {3: layout.coords(3)}
    assert layout.describe(3) in missing[0].summary
    assert [v.rank for v in report.ranks] == [0, 1, 2]


@pytest.mark.parametrize("name", scenarios())
def test_every_recorded_hang_is_a_problem_and_serializes(name):
    report, _ = _report(name)
    assert report.verdict == "problem"
    assert report.findings[0].id == FIRST_FINDING[name]
    data = json.loads(msgspec.json.encode(report))
    assert data["schema"] == "mtpdiag.report/2"
    assert all(r["ranks"] == sorted(r["ranks"]) for r in data["sites"])
    # report/2: each distinct stack once, each rank naming its own
    assert len(data["stacks"]) == len({tuple(s) for s in report.stacks}) <= len(report.ranks)
    for view, row in zip(report.ranks, data["ranks"], strict=True):
        assert row["stack"] == view.stack and report.stack_of(view) == (
            report.stacks[row["stack"]] if row["stack"] is not None else ()
        )
    assert sum(len(s.ranks) for s in report.sites) == len(report.ranks) - sum(
        1 for v in report.ranks if v.state in ("unreadable", "gone")
    )
    recorded_fr = os.path.isdir(os.path.join(scenario_dir(name), "fr"))
    assert (report.flight_recorder is not None) == recorded_fr and report.watchdog is None


@pytest.mark.parametrize("name", ["mtp_cp_pp", "tp_broadcast", "p2p_count", "hang_side_thread"])
def test_without_a_layout_ranks_and_sites_stay_right(name):
    snapshot, layout, _ = load_scenario(name)
    with_layout = diagnose(snapshot, layout)
    report = diagnose(snapshot, None)
    assert report.verdict == "incomplete"
    assert NO_LAYOUT_NOTE in report.notes
    assert report.layout is None and report.mismatches == ()
    assert all(v.coords is None for v in report.ranks)
    assert [(v.rank, v.op, v.site) for v in report.ranks] == [(v.rank, v.op, v.site) for v in with_layout.ranks]
    assert report.sites == with_layout.sites


def test_without_a_layout_a_straggler_or_frozen_rank_is_still_found():
    snapshot, _, _ = load_scenario("straggler")
    assert [f.id for f in diagnose(snapshot).findings] == ["straggler"]
    snapshot, _, _ = load_scenario("frozen")
    assert [f.id for f in diagnose(snapshot).findings] == ["frozen-rank"]


def test_every_rank_in_one_complete_collective_is_all_waiting():
    # examples/network_loss: a healthy job whose network was cut; every rank in the same all_reduce
    snapshot, layout, _ = load_scenario("network_loss")
    assert sorted(c.rank for c in snapshot.captures) == [0, 1, 2, 3]
    assert len({c.pid for c in snapshot.captures}) == 4  # four recorded processes, none replicated
    report = diagnose(snapshot, layout)
    assert [f.id for f in report.findings] == ["all-waiting"]
    assert report.findings[0].ranks == (0, 1, 2, 3)
    assert "TORCH_FR_BUFFER_SIZE" in report.findings[0].remedy
    assert report.mismatches == ()
    assert [(s.op, s.site.function, s.ranks) for s in report.sites] == [
        ("all_reduce", "reduce_gradients", (0, 1, 2, 3))
    ]
    assert [f.id for f in diagnose(snapshot).findings] == ["all-waiting"]  # no layout needed for this


def test_a_world_of_ranks_blocked_outside_collectives_is_incomplete_never_ok():
    """Every rank idle in a C call at its own line (rank 3 of the straggler hang, replicated): nothing is split
    and nobody is in a collective, but every rank is stuck. Not ok: incomplete, with what they wait on."""
    snapshot, layout, _ = load_scenario("straggler")
    sleeping = next(c for c in snapshot.captures if c.rank == 3)  # idle at time.sleep in load_batch
    world = tuple(replace(sleeping, rank=r, pid=(sleeping.pid or 0) + r) for r in range(4))
    report = diagnose(Snapshot(captures=world), layout)
    assert (report.verdict, report.mismatches) == ("incomplete", ())
    (finding,) = report.findings
    assert finding.id == "unexplained-wait" and finding.ranks == (0, 1, 2, 3)
    assert "load_batch" in finding.summary and "Flight Recorder" in finding.remedy
    unreadable = replace(world[2], state="unreadable", threads=(), error="py-spy timed out")
    report = diagnose(Snapshot(captures=world[:2] + (unreadable,) + world[3:]), layout)
    assert report.verdict == "incomplete"
    assert report.ranks[2].state == "unreadable"
    assert any("could not be read" in n for n in report.notes)


def test_unknown_world_size_with_waiting_ranks_is_incomplete():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    bare = replace(snapshot, captures=tuple(replace(c, env=Env()) for c in snapshot.captures))
    report = diagnose(bare)
    assert report.world_size is None
    assert report.verdict == "incomplete"
    assert any("WORLD_SIZE unknown" in n for n in report.notes)
    assert diagnose(bare, layout).world_size == 4  # the layout supplies it


def test_conflicting_world_sizes_take_the_largest_with_a_note():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    caps = list(snapshot.captures)
    caps[0] = replace(caps[0], env=Env(WORLD_SIZE="2"))
    report = diagnose(replace(snapshot, captures=tuple(caps)), layout)
    assert report.world_size == 4
    assert any("disagree on WORLD_SIZE" in n for n in report.notes)


@pytest.mark.parametrize(
    "env, expected",
    [
        ((("SLURM_NTASKS", "8"), ("WORLD_SIZE", "4")), 4),  # torch's own variable wins
        ((("SLURM_NTASKS", "8"), ("WORLD_SIZE", "four")), 8),  # a WORLD_SIZE that is no number is passed over
        ((("SLURM_NTASKS", "8"),), 8),
        ((("SLURM_NTASKS", "²"), ("WORLD_SIZE", " 16 ")), 16),
        ((("RANK", "3"), ("WORLD_SIZE", "1" * 10)), None),  # longer than any real world
        ((), None),
    ],
)
def test_world_size_comes_from_world_size_then_slurm_ntasks(env, expected):
    snapshot, _, _ = load_scenario("mtp_cp_pp")
    assert replace(snapshot.captures[0], env=Env.of(dict(env))).world_size == expected


def test_a_stopped_process_state_makes_a_frozen_rank_even_inside_the_collective():
    snapshot, layout, _ = load_scenario("straggler")
    caps = tuple(replace(c, state="D") if c.rank == 0 else c for c in snapshot.captures)
    report = diagnose(replace(snapshot, captures=caps), layout)
    frozen = [f for f in report.findings if f.id == "frozen-rank"]
    assert frozen and frozen[0].ranks == (0,)
    assert "uninterruptible" in report.ranks[0].error
    assert report.ranks[0].op == "all_reduce"  # where it was is kept


def test_mtp_tiled_over_16384_ranks_gives_one_mismatch_per_split_instance():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    big = ParallelLayout.for_world(16384, cp=2, pp=2)  # dp = 4096
    report = diagnose(tile(snapshot, layout, big), big)
    assert report.world_size == 16384
    assert report.findings[0].id == "mtp-cp-gated-reduce"
    assert [f.id for f in report.findings] == ["mtp-cp-gated-reduce"]
    roots = [m for m in report.mismatches if m.role == "root"]
    assert len(roots) == 1
    (root,) = roots
    last_stage = [r for r in range(16384) if big.coords(r)["pp"] == 1]
    assert root.members == tuple(last_stage)
    assert root.entered == tuple(r for r in last_stage if big.coords(r)["cp"] == 0)
    assert root.gate == {"cp": 0}
    ring = [m for m in report.mismatches if m.op == "all_gather"]
    assert len(ring) == 2 * 4096  # every CP pair of both stages is split
    assert all(m.group == "cp" and len(m.entered) == 1 and m.role == "consequence" for m in ring)
    assert len(report.mismatches) == 1 + 2 * 4096


def test_pipeline_peers_are_inferred_from_known_sites_when_torch_frames_lack_them():
    snapshot, layout, _ = load_scenario("p2p_count")
    stripped = []
    for c in snapshot.captures:
        thread = c.main_thread
        frames = tuple(replace(f, args=None) for f in thread.frames)
        stripped.append(replace(c, threads=(replace(thread, frames=frames),)))
    report = diagnose(replace(snapshot, captures=tuple(stripped)), layout)
    assert {v.rank: v.peer for v in report.ranks} == {0: 2, 1: 3, 2: 0, 3: 1}
    assert [f.id for f in report.findings] == ["p2p-unmatched"]
    without_layout = diagnose(replace(snapshot, captures=tuple(stripped)))
    assert all(v.peer is None for v in without_layout.ranks)
    assert any("peer" in n for n in without_layout.notes)


def test_wait_graph_links_a_split_to_an_uncaptured_absent_rank():
    """A split instance's absent rank may be in no capture; its node must not take the instance's id."""
    from mtpdiag.analysis.causes import _Graph

    graph = _Graph()
    graph.rank(0)
    graph.add_mismatch(entered=[0], absent=[5])  # rank 5 was never captured
    split = graph.mismatch_nodes[0]
    assert graph.edges[split] == [graph.rank_nodes[5]]
    assert graph.edges[graph.rank_nodes[0]] == [split]
    assert graph.edges[graph.rank_nodes[5]] == []


def test_a_diagnosis_of_stacks_alone_loads_neither_the_recorders_nor_the_logs_analysis():
    """``diagnose`` imports nothing on a condition (``analysis.recorded`` is its typed boundary): the Flight
    Recorder's and the watchdog log's analyses load only when such a record is there."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from mtpdiag.analysis import diagnose\n"
        "from mtpdiag.model import Snapshot\n"
        "from mtpdiag.model.watchdog import WatchdogLog\n"
        "from support.captures import load_scenario\n"
        "snapshot, layout, _ = load_scenario('mtp_cp_pp')\n"
        "recorded = load_scenario('nccl_mtp_cp_pp_spin')[0].flight_recorder\n"
        "heavy = ('mtpdiag.analysis.flight_recorder.evidence', 'mtpdiag.analysis.log_evidence')\n"
        "assert diagnose(snapshot, layout).findings\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "diagnose(Snapshot(captures=()), layout, fr=recorded)\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "diagnose(Snapshot(captures=()), layout, log=WatchdogLog())\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tests)
    assert done.returncode == 0, done.stderr
    stacks_alone, with_dumps, with_log = done.stdout.splitlines()
    assert stacks_alone == "[]"
    assert with_dumps == "['mtpdiag.analysis.flight_recorder.evidence']"  # the controls: each loads with its record
    assert with_log == "['mtpdiag.analysis.flight_recorder.evidence', 'mtpdiag.analysis.log_evidence']"
