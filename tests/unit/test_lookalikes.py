"""The hangs that look like the verl MTP/CP deadlock, and are not it, each named as itself (issue #10).

Recorded from examples/lookalikes (real megatron-core 0.16.1 trackers; tp 1, cp 2, pp 2 on 4 ranks, so the
pipeline groups are [0, 2] and [1, 3]) on gloo, where ranks block inside the collective, and on the
NCCL-behaviour backend, where every rank ends at the same host sync and only the Flight Recorder tells the
cases apart:

* the DeepSeek indexer's reduce returns early on an empty tracker, so stage 0 skips its PP all_reduce
  (Megatron-LM #4745);
* the MoE aux-loss tracker, created lazily, is empty on stage 0, which skips the PP all_reduce (#1444, #2418,
  NeMo-RL #3419);
* with MTP layers left out of ``force_initialize``, the aux-loss tracker holds 14 entries on stage 0 and 15 on
  stage 1: every member enters the PP all_reduce, with different sizes (#3400/#3401). Gloo aborts on unequal
  sizes, so this one is recorded on the NCCL-behaviour backend only.

And the verl bug itself on NCCL: the MTP reduce is the root, the optimizer's collectives its consequences.
"""

from __future__ import annotations

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.model import replace
from support.captures import load_scenario

PP_GROUPS = {(0, 2), (1, 3)}


def _report(name: str, stacks: bool = True):
    snapshot, layout, _ = load_scenario(name)
    if not stacks:
        snapshot = replace(snapshot, captures=())
    return diagnose(snapshot, layout, "scenario.json")


def _roots(report):
    return [m for m in report.mismatches if m.role == "root"]


@pytest.mark.parametrize(
    "name,site",
    [
        ("lookalike_dsa_indexer_gloo", "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker"),
        ("lookalike_moe_lazy_tracker_gloo", "reduce_aux_losses_tracker_across_ranks"),
        ("lookalike_dsa_indexer_nccl", "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker"),
        ("lookalike_moe_lazy_tracker_nccl", "reduce_aux_losses_tracker_across_ranks"),
    ],
)
def test_a_tracker_skipped_on_a_pipeline_stage_is_a_pp_split_never_the_mtp_deadlock(name, site):
    report = _report(name)
    ids = [f.id for f in report.findings]
    assert "mtp-cp-gated-reduce" not in ids
    first = report.findings[0]
    assert first.id == "gated-collective" and first.details.group == "pp"
    roots = _roots(report)
    assert {m.members for m in roots} == PP_GROUPS
    assert all(m.group == "pp" and m.gate == {"pp": 1} for m in roots)
    assert sorted(r for m in roots for r in m.entered) == [2, 3]
    assert sorted(r for m in roots for r in m.absent) == [0, 1]
    assert all(m.site is not None and m.site.function.endswith(site.rsplit(".", 1)[-1]) for m in roots)
    signature = "dsa-indexer" if "dsa" in name else "moe-aux-loss"
    assert first.details.signature == signature
    if signature == "dsa-indexer":
        assert "DeepSeek indexer" in first.summary and "#4745" in first.summary
        assert "#4518" in first.remedy
    else:
        assert "MoE aux-loss" in first.summary and "force_initialize" in first.remedy


@pytest.mark.parametrize("name", ["lookalike_dsa_indexer_nccl", "lookalike_moe_lazy_tracker_nccl"])
def test_on_nccl_the_stacks_alone_cannot_tell_and_the_flight_recorder_alone_can(name):
    """Every rank sits at ``found_inf.item()``, as in the MTP bug: stacks alone are incomplete. The dumps alone
    name the pipeline split."""
    stacks_only = diagnose(replace(load_scenario(name)[0], flight_recorder=None), load_scenario(name)[1])
    assert stacks_only.verdict == "incomplete"
    assert [f.id for f in stacks_only.findings] == ["unexplained-wait"]
    fr_only = _report(name, stacks=False)
    assert fr_only.findings[0].id == "gated-collective"
    assert {m.members for m in _roots(fr_only)} == PP_GROUPS
    assert all(m.source == "flight-recorder" for m in _roots(fr_only))


def test_every_member_in_one_collective_with_different_sizes_is_a_size_mismatch():
    report = _report("lookalike_aux_loss_sizes_nccl")
    ids = [f.id for f in report.findings]
    assert "mtp-cp-gated-reduce" not in ids and "gated-collective" not in ids
    sizes = [f for f in report.findings if f.id == "size-mismatch"]
    assert len(sizes) == 2 and report.findings[0].id == "size-mismatch"
    assert {f.ranks for f in sizes} == PP_GROUPS
    for f in sizes:
        assert f.details.group == "pp" and f.details.seq == 1
        assert f.details.values == {"14 elements": (f.ranks[0],), "15 elements": (f.ranks[1],)}
        assert "force_initialize" in f.remedy and "#3400" in f.remedy
    # The MTP reduce of stage 1 is pending too, entered by both members of its DP×CP group: nothing split
    assert not [m for m in report.mismatches if m.site and m.site.function.endswith("reduce_loss_in_tracker")]


@pytest.mark.parametrize("name", ["nccl_mtp_cp_pp_futex", "nccl_mtp_cp_pp_spin", "nccl_mtp_cp_pp_poll"])
def test_the_mtp_bug_on_nccl_leads_with_the_mtp_reduce_and_marks_what_follows_as_consequences(name):
    report = _report(name)
    assert [f.id for f in report.findings] == ["mtp-cp-gated-reduce"]
    (root,) = _roots(report)
    assert (root.group, root.entered, root.absent, root.gate) == ("dp_cp", (2,), (3,), {"cp": 0})
    consequences = {
        (m.op, m.site.function.rsplit(".", 1)[-1], m.entered) for m in report.mismatches if m.role == "consequence"
    }
    assert ("reduce_scatter_tensor", "finish_grad_sync", (3,)) in consequences
    assert ("all_reduce", "_unscale_main_grads_and_check_for_nan", (0, 1, 3)) in consequences
