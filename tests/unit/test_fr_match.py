"""Matching the ranks' records across each process group, on recorded real dumps and variants derived from them.

The three recorded gloo jobs (``tests/fixtures/fr``) hang for real: the verl MTP gate with cp=2 pp=2 and with
cp=2 dp=2, and a broadcast only tp rank 0 makes. Type, size and dtype mismatches cannot be recorded on gloo
(its all_reduce aborts the process on a size mismatch before any dump is written), so those tests derive a
variant from a real dump; each says which of torch's fields it changes.
"""

from __future__ import annotations

import msgspec
import pytest

from mtpdiag.analysis.flight_recorder import match_groups, mismatches
from mtpdiag.analysis.flight_recorder.order import program_order
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.model import Site
from support.fr_fixtures import FR_FIXTURES, entries_of, raw, write_set

DP_CP, CP, TP = "DATA_PARALLEL_GROUP_WITH_CP", "CONTEXT_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP"
REDUCE = "MTPLossLoggingHelper.reduce_loss_in_tracker"


def _analysis(scenario: str):
    return match_groups(load_fr_dumps(str(FR_FIXTURES / scenario / "rank_")))


def _group(analysis, desc: str, member: int):
    return next(g for g in analysis.groups if g.desc == desc and member in g.members)


# ---------------------------------------------------------------- the recorded hangs


def test_mtp_gate_cp2_pp2_the_dp_cp_all_reduce_is_the_root():
    a = _analysis("gloo_mtp_cp_pp")
    g = _group(a, DP_CP, 2)
    assert (g.members, g.members_from, g.kind, dict(g.last_entered)) == ((2, 3), "pg_config", "dp_cp", {2: 1, 3: 0})
    d = g.divergence
    assert (d.seq, d.problems, d.missing, d.culprits) == (1, ("missing_ranks",), (3,), (3,))
    [split] = d.calls
    assert (split.op, split.site.function, split.entered, split.absent, split.role) == (
        "all_reduce",
        REDUCE,
        (2,),
        (3,),
        "root",
    )
    why = split.why[3]
    assert (why.verdict, why.rule) == ("skipped", "stack-order")
    assert "all_gather #2 in CONTEXT_PARALLEL_GROUP at ring_attention" in split.absent_doing[3]
    assert d.rank(3).state == "not reached" and d.rank(2).state == "scheduled"
    # the CP all_gathers that wait on the far side are consequences: rank 2 will get there
    cp = _group(a, CP, 2).divergence
    [cp_split] = cp.calls
    assert (cp.seq, cp_split.entered, cp_split.absent, cp_split.role) == (2, (3,), (2,), "consequence")
    assert cp_split.why[2].verdict == "behind"


def test_mtp_gate_cp2_dp2_both_cp1_ranks_skipped_the_reduce():
    d = _group(_analysis("gloo_mtp_cp_dp"), DP_CP, 0).divergence
    [split] = d.calls
    assert (d.members, split.entered, split.absent, split.role) == ((0, 1, 2, 3), (0, 2), (1, 3), "root")
    assert {r: w.verdict for r, w in split.why.items()} == {1: "skipped", 3: "skipped"}


def test_a_broadcast_only_tp_rank_0_makes():
    a = _analysis("gloo_tp_broadcast")
    tp = _group(a, TP, 0).divergence
    [split] = tp.calls
    assert (split.op, split.site.function, split.entered, split.absent, split.role) == (
        "broadcast",
        "broadcast_vocab_stats",
        (0,),
        (1,),
        "root",
    )
    world = _group(a, "default_pg", 0).divergence
    [barrier] = world.calls
    assert (barrier.op, barrier.entered, barrier.absent, barrier.role) == ("barrier", (1, 3), (0, 2), "consequence")


def test_divergences_become_mtpdiag_mismatches():
    ms = mismatches(_analysis("gloo_mtp_cp_pp"))
    root = next(m for m in ms if m.role == "root")
    assert (root.op, root.group, root.members, root.entered, root.absent) == ("all_reduce", "dp_cp", (2, 3), (2,), (3,))
    assert root.site.function == REDUCE and 3 in root.absent_doing
    assert {m.role for m in ms} == {"root", "consequence"}


def test_the_json_form_without_membership_matches_by_the_ranks_seen_or_given():
    fr = load_fr_dumps(str(FR_FIXTURES / "gloo_mtp_cp_pp" / "json" / "rank_"))
    seen = _group(match_groups(fr), DP_CP, 2)
    assert (seen.members, seen.members_from, seen.divergence, seen.stuck) == ((2,), "entries", None, 1)
    given = _group(match_groups(fr, members={seen.name: [2, 3]}), DP_CP, 2)
    assert (given.members_from, given.divergence.missing) == ("given", (3,))


def test_a_member_without_a_dump_is_no_evidence(tmp_path):
    dumps = {r: raw("gloo_mtp_cp_pp", r) for r in (0, 1, 2)}
    g = _group(match_groups(load_fr_dumps(write_set(tmp_path, dumps))), DP_CP, 2)
    assert (g.no_dump, g.divergence, g.stuck) == ((3,), None, 1)


# ---------------------------------------------------------------- derived: what only NCCL can record


def _cp_dp(tmp_path, change) -> dict:
    dumps = {r: raw("gloo_mtp_cp_dp", r) for r in range(4)}
    change(dumps)
    return match_groups(load_fr_dumps(write_set(tmp_path, dumps)))


def test_a_size_mismatch_inside_one_collective(tmp_path):
    """Megatron-LM #3400: every member enters the same all_gather with 14 vs 15 elements. ``input_sizes`` /
    ``output_sizes`` are the tensors' sizes at record time (FlightRecorderDetail.hpp read_sizes); rank 1's
    CP all_gather #1 is given 15 elements where rank 0 recorded 14."""

    def change(dumps):
        for rank, n in ((0, 14), (1, 15)):
            first = entries_of(dumps[rank], CP)[0]
            first.update(input_sizes=[[n]], output_sizes=[[2, n]])

    d = _group(_cp_dp(tmp_path, change), CP, 0).divergence
    assert (d.seq, d.problems, d.missing) == (1, ("sizes",), ())
    [split] = d.calls
    assert (split.entered, split.absent, split.role) == ((0, 1), (), "root")
    assert (d.rank(0).input_numel, d.rank(1).input_numel) == (14, 15)
    assert (d.reference, d.culprits, d.culprits_against(1)) == (0, (1,), (0,))


def test_a_dtype_mismatch_and_the_first_divergence_wins(tmp_path):
    """``input_dtypes``/``output_dtypes`` are c10::toString of the tensors' dtypes: rank 1's CP all_gather #1
    is recorded as BFloat16. The same group also misses rank 0 at #2; the first divergence is #1."""

    def change(dumps):
        first = entries_of(dumps[1], CP)[0]
        first.update(input_dtypes=["BFloat16"], output_dtypes=["BFloat16"])

    g = _group(_cp_dp(tmp_path, change), CP, 0)
    assert (g.divergence.seq, g.divergence.problems) == (1, ("dtypes",))


def test_the_verl_bug_on_nccl_an_all_reduce_against_the_optimizers_all_gather(tmp_path):
    """On NCCL the host does not wait for a collective, so rank 3 (cp 1) goes on to the distributed
    optimizer's all-gather as DP_CP #1 while rank 2 (cp 0) issued the MTP all_reduce as #1 and the
    all-gather as #2. Derived from the real DP_CP all_reduce of rank 2: the optimizer's entry copies it with
    ``profiling_name`` ``nccl:_all_gather_base`` (ProcessGroupNCCL's title for all_gather_into_tensor), the
    group's next ``collective_seq_id``, a later ``record_id`` and the optimizer's frames."""
    dumps = {r: raw("gloo_mtp_cp_pp", r) for r in range(4)}
    reduce2 = entries_of(dumps[2], DP_CP)[0]
    reduce2["profiling_name"] = "nccl:all_reduce"
    step = next(i for i, f in enumerate(reduce2["frames"]) if f["name"] == "train_step")
    optimizer = "/x/site-packages/megatron/core/optimizer/"
    optimizer_frames = (
        reduce2["frames"][:2]
        + [
            {"name": "_dispatch_gather_model_params", "filename": optimizer + "distrib_optimizer.py", "line": 2300},
            {"name": "step", "filename": optimizer + "optimizer.py", "line": 480},
            dict(
                reduce2["frames"][step], line=reduce2["frames"][step]["line"] + 3
            ),  # the optimizer step, after the loss
        ]
        + reduce2["frames"][step + 1 :]
    )
    gather = dict(reduce2, profiling_name="nccl:_all_gather_base", frames=optimizer_frames)
    dumps[2]["entries"].append(dict(gather, record_id=reduce2["record_id"] + 1, collective_seq_id=2))
    dumps[3]["entries"].append(dict(gather, record_id=len(dumps[3]["entries"]), collective_seq_id=1))
    d = _group(match_groups(load_fr_dumps(write_set(tmp_path, dumps))), DP_CP, 2).divergence
    assert (d.seq, d.problems) == (1, ("op_type",))
    reduce, gathered = d.calls
    assert (reduce.op, reduce.site.function, reduce.entered, reduce.absent, reduce.role) == (
        "all_reduce",
        REDUCE,
        (2,),
        (3,),
        "root",
    )
    assert reduce.absent_doing[3].startswith("all_gather_into_tensor #1 at _dispatch_gather_model_params")
    assert (reduce.why[3].verdict, reduce.why[3].rule) == ("skipped", "same-group")
    assert (gathered.op, gathered.entered, gathered.absent, gathered.role) == (
        "all_gather_into_tensor",
        (3,),
        (2,),
        "consequence",
    )
    assert gathered.why[2].verdict == "shifted" and "#2" in gathered.why[2].reason
    assert (d.culprits_against(2), d.culprits_against(3)) == ((3,), (2,))


def test_call_sites_skip_torch_and_typing_extensions_wrappers(tmp_path):
    """A frame of typing_extensions' deprecated() wrapper or functools between torch and the caller is
    plumbing: the site is still the caller (classify's rule). Frames are inserted into a real stack."""
    data = raw("gloo_mtp_cp_pp", 2)
    entry = entries_of(data, DP_CP)[0]
    entry["frames"][2:2] = [
        {"name": "wrapper", "filename": "/x/site-packages/typing_extensions.py", "line": 2853},
        {"name": "wrapped", "filename": "/usr/lib/python3.11/functools.py", "line": 40},
    ]
    dump = load_fr_dumps(write_set(tmp_path, {2: data})).rank(2)
    [e] = [e for e in dump.entries if e.group_desc == DP_CP]
    assert e.site.function == REDUCE and e.frames[2].file == "typing_extensions.py"


def test_a_send_whose_peer_never_posted_its_recv(tmp_path):
    """Rank 3's last CP all_gather rewritten as NCCL records a pending send to group rank 0 (global 2):
    ``nccl:send 1->0``, ``is_p2p``, ``p2p_seq_id`` 1, not retired (see test_fr_reader). Rank 2 posted no recv."""
    dumps = {r: raw("gloo_mtp_cp_pp", r) for r in range(4)}
    entry = entries_of(dumps[3], CP)[-1]
    entry.update(profiling_name="nccl:send 1->0", collective_seq_id=0, p2p_seq_id=1, is_p2p=True)
    [m] = match_groups(load_fr_dumps(write_set(tmp_path, dumps))).p2p
    assert (m.kind, m.op, m.rank, m.peer, m.numel, m.desc) == ("unmatched", "send", 3, 2, 4, CP)
    assert m.peer_doing.startswith("all_reduce #1 in DATA_PARALLEL_GROUP_WITH_CP")


def test_program_order_of_two_stacks():
    def stack(*lines):
        return tuple(Site("train.py", n, f) for f, n in lines)

    step = ("main", 10)
    assert program_order(stack(step, ("train_step", 114)), stack(step, ("train_step", 117))) == "before"
    assert program_order(stack(step, ("train_step", 117)), stack(step, ("train_step", 114))) == "after"
    assert program_order(stack(step, ("a", 1)), stack(step, ("b", 1))) == "unknown"
    assert program_order(stack(step), stack(step)) == "same"


@pytest.mark.parametrize("scenario", ["gloo_mtp_cp_pp", "gloo_mtp_cp_dp", "gloo_tp_broadcast"])
def test_analysis_is_json_able(scenario):
    import json

    document = json.loads(msgspec.json.encode(_analysis(scenario)))
    assert any(g["divergence"] for g in document["groups"])
