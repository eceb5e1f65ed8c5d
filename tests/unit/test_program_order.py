"""Root cause by program order, and what a known site says without a layout (issue #20), on recorded hangs.

* ``lookalike_dsa_step_sync_gloo`` (examples/lookalikes ``--step-sync``, real megatron-core 0.16.1; tp 1, cp 2,
  pp 2): stage 0's DeepSeek-indexer tracker is empty, so ``reduce_loss_in_tracker`` returns before its pipeline
  all_reduce, and stage 0 waits in the job's own world all_reduce (``step_sync``) at a later line of ``main``;
  stage 1 waits in the indexer's pipeline all_reduce. Before issue #20, ``--pp 2`` made the later all_reduce the
  root on a guessed pipeline group.
* ``tracker_loop_gloo_fr`` (examples/gated_collectives ``tracker-loop``, with the Flight Recorder a stall
  watcher dumped, in ``fr_gloo/``): a tracker of the job's own returns early on stage 0 inside ``log_metrics``'
  loop, and stage 0 goes round into the next tracker's world all_reduce, at an *earlier* line of the loop body
  than the pipeline all_reduce stage 1 waits in. Line order alone points the wrong way; the recorder's sequence
  numbers decide.
* ``mtp_cp_pp`` and ``mtp_cp_dp`` without a layout: the MTP reduce is a known site, and the headline says so.
"""

from __future__ import annotations

import os

import msgspec
import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.analysis.program_order import StackOrders, part, program_order
from mtpdiag.analysis.views import StackReader
from mtpdiag.inputs import load_paths
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import replace
from support.captures import load_scenario, scenario_dir
from support.jobs_e2e import run_cli_here

STEP_SYNC = "lookalike_dsa_step_sync_gloo"
TRACKER_LOOP = "tracker_loop_gloo_fr"
PP_GROUPS = {(0, 2), (1, 3)}
PASTES = os.path.join(os.path.dirname(scenario_dir("mtp_cp_pp")), os.pardir, "pastes", "mtp_cp_pp")


def _details(finding) -> dict:
    """A finding's details as its JSON reads them."""
    return msgspec.json.decode(msgspec.json.encode(finding.details))


def _report(name: str, layout: ParallelLayout | None = None, fr: bool = True):
    """The recorded hang diagnosed, with its gloo Flight Recorder dumps (``fr_gloo/``) unless ``fr`` is off."""
    snapshot, recorded, _ = load_scenario(name)
    dumps = os.path.join(scenario_dir(name), "fr_gloo")
    snapshot = replace(
        snapshot, flight_recorder=load_fr_dumps(os.path.join(dumps, "rank_")) if fr and os.path.isdir(dumps) else None
    )
    return diagnose(snapshot, layout or recorded, "scenario.json")


def _roots(report):
    return [m for m in report.mismatches if m.role == "root"]


def _function(m) -> str:
    return m.site.function.rsplit(".", 1)[-1] if m.site else ""


# ---------------------------------------------------------------- the DSA early return and a later world all_reduce


@pytest.mark.parametrize(
    "layout",
    [None, ParallelLayout.for_world(4, pp=2)],  # the recorded tp 1 cp 2 pp 2, and `inspect --pp 2`'s dp 2
    ids=["cp2-pp2", "pp2-only"],
)
def test_the_dsa_reduce_is_the_root_and_the_later_world_all_reduce_its_consequence(layout):
    report = _report(STEP_SYNC, layout)
    roots = _roots(report)
    assert {_function(m) for m in roots} == {"reduce_loss_in_tracker"}
    assert {m.members for m in roots} == PP_GROUPS
    assert all(m.group == "pp" and m.group_from == "known-site" for m in roots)
    assert sorted(r for m in roots for r in m.entered) == [2, 3]
    assert sorted(r for m in roots for r in m.absent) == [0, 1]
    later = [m for m in report.mismatches if _function(m) == "step_sync"]
    assert later and all(m.role == "consequence" for m in later)
    # a guessed group lists every kind that fits, the world among them
    assert all(m.group_from == "guess" and "world" in m.group_candidates for m in later)
    first = report.findings[0]
    assert first.id == "gated-collective" and _details(first)["signature"] == "dsa-indexer"
    order = _details(first)["order"]
    assert order["source"] == "stacks+known-site" and order["confidence"] == "likely"
    assert order["skipped_by"] == [0, 1]
    assert order["instead"]["site"]["function"] == "step_sync"
    assert order["frame"]["function"] == "main" and order["frame"]["their_line"] > order["frame"]["line"]
    assert "returned before this all_reduce and wait at all_reduce in step_sync" in first.summary
    assert "a later line of main" in first.summary and "#4745" in first.summary
    assert report.verdict == "problem"


def test_the_step_sync_split_exists_only_because_a_fully_entered_cp_group_cannot_be_waited_for():
    """With cp 2, the world all_reduce of stage 0 fills its CP group [0, 1]: that reading has nobody to wait for,
    so the pipeline and world kinds that leave every instance partly entered are read instead (a guess)."""
    report = _report(STEP_SYNC)
    later = [m for m in report.mismatches if _function(m) == "step_sync"]
    assert {m.members for m in later} == PP_GROUPS
    assert set(later[0].group_candidates) == {"pp", "world"}


def test_every_input_form_of_the_step_sync_hang_names_the_same_root():
    folder = scenario_dir(STEP_SYNC)
    for files in (
        [os.path.join(folder, f"rank{r}.json") for r in range(4)],
        [os.path.join(folder, f"rank{r}.txt") for r in range(4)],
        [os.path.join(folder, "bundle.json")],
    ):
        done = run_cli_here("analyze", *files, "--pp", "2", "--json")
        assert done.returncode == 1, done.stderr
        assert '"reduce_loss_in_tracker (dsa.py:99)' not in done.stdout  # the JSON names sites, not phrases
        assert "returned before this all_reduce" in done.stdout, files[0]


# ---------------------------------------------------------------- a tracker of the job's own in a loop body


def test_in_a_loop_body_the_flight_recorder_decides():
    report = _report(TRACKER_LOOP)
    roots = _roots(report)
    assert {_function(m) for m in roots} == {"reduce"}
    assert {m.members for m in roots} == PP_GROUPS
    assert sorted(r for m in roots for r in m.entered) == [2, 3]
    assert sorted(r for m in roots for r in m.absent) == [0, 1]
    assert all(m.role == "consequence" for m in report.mismatches if _function(m) == "sync_counts")
    first = report.findings[0]
    assert _details(first)["order"]["source"] == "flight-recorder"
    assert _details(first)["order"]["confidence"] == "certain"
    assert "skipped this all_reduce: the Flight Recorder shows" in first.summary


def test_in_a_loop_body_line_order_alone_is_possible_and_says_so():
    """Stage 0 went round the loop to an earlier line: line order alone points at the world all_reduce, and the
    report must say that it rests on line order only, which a loop reverses, and that the recorder decides."""
    report = _report(TRACKER_LOOP, fr=False)
    first = report.findings[0]
    order = _details(first)["order"]
    assert order["source"] == "stacks" and order["confidence"] == "possible" and order["loop_caveat"]
    assert order["frame"]["function"] == "log_metrics"
    assert "(line order only: if log_metrics loops, ranks 0, 1 may instead be an iteration ahead" in first.summary
    assert "the Flight Recorder's sequence numbers decide" in first.summary
    with_fr = _report(TRACKER_LOOP).findings[0]
    assert _details(with_fr)["order"]["confidence"] == "certain"
    assert _details(with_fr)["site"] != _details(first)["site"]  # the recorder overturned line order


# ---------------------------------------------------------------- the stacks' comparison itself


def test_stacks_part_at_the_deepest_shared_frame_outermost_first():
    snapshot, layout, _ = load_scenario(STEP_SYNC)
    reader = StackReader(layout)
    views = {v.rank: v for v in reader.views(snapshot.captures)}
    stacks = reader.stacks()
    outer = {r: tuple(reversed(stacks[views[r].stack])) for r in views}
    parting = part(outer[2], outer[0])
    assert parting is not None and parting.function == "main"
    assert parting.first < parting.second  # stage 0 stands at a later line of main
    assert program_order(outer[2], outer[0]) == "before"
    assert program_order(outer[0], outer[2]) == "after"
    assert program_order(outer[0], outer[0]) == "same"
    assert program_order(outer[0], outer[1]) == "same"  # the two ranks of a stage share their stack
    passing = StackOrders(stacks, views).passing((2,), (0,))
    assert passing.passed == (0,) and passing.behind == ()
    assert passing.early_return is not None and "#4745" in passing.early_return


def test_the_lookalike_with_a_barrier_keeps_its_root_and_says_what_stage_0_did_instead():
    report = _report("lookalike_dsa_indexer_gloo")
    first = report.findings[0]
    assert {_function(m) for m in _roots(report)} == {"reduce_loss_in_tracker"}
    assert _details(first)["order"]["source"] == "stacks+known-site"
    assert "wait at barrier in interval_time_elapsed" in first.summary


def test_the_mtp_signature_still_leads_and_carries_no_program_order():
    """In mtp_cp_pp the cp 1 rank went round the training loop: line order alone would point at its all_gather.
    The known signature names itself first."""
    report = _report("mtp_cp_pp")
    assert report.findings[0].id == "mtp-cp-gated-reduce"
    assert "order" not in _details(report.findings[0])


# ---------------------------------------------------------------- a known site speaks without a layout


def _mtp_inputs():
    json_files = [os.path.join(scenario_dir("mtp_cp_pp"), f"rank{r}.json") for r in range(4)]
    faulthandler = [os.path.join(PASTES, f"rank{r}.faulthandler.txt") for r in range(4)]
    pystack = [os.path.join(PASTES, f"rank{r}.pystack.txt") for r in range(4)]
    return [json_files, faulthandler, pystack]


@pytest.mark.parametrize("files", _mtp_inputs(), ids=["pyspy-json", "faulthandler", "pystack"])
def test_without_a_layout_the_mtp_reduce_names_the_verl_deadlock_and_stays_incomplete(files):
    done = run_cli_here("analyze", *files)
    assert done.returncode == 4, done.stderr
    text = " ".join(done.stdout.split())  # the console wraps at its width
    assert text.startswith(
        "INCOMPLETE: rank 2 is in megatron-core's MTP-loss all_reduce over DP×CP (multi_token_prediction.py:359), "
        "and ranks 0, 1, 3 are elsewhere"
    ), text[:300]
    headline = text.split(" layout: ")[0]
    assert headline.endswith("This is the verl #5895 deadlock when CP > 1: pass --cp"), headline
    markdown = run_cli_here("analyze", *files, "--markdown")
    assert markdown.returncode == 4
    assert "**INCOMPLETE: rank 2 is in megatron-core's MTP-loss all_reduce over DP×CP" in markdown.stdout


def test_without_a_layout_the_known_sites_are_in_the_details():
    report = diagnose(load_paths(_mtp_inputs()[0]))
    assert report.verdict == "incomplete"
    first = report.findings[0]
    assert first.id == "unexplained-wait"
    assert _details(first)["known_sites"] == [
        {
            "op": "all_reduce",
            "site": {
                "file": _details(first)["known_sites"][0]["site"]["file"],
                "line": 359,
                "function": "MTPLossLoggingHelper.reduce_loss_in_tracker",
            },
            "ranks": [2],
            "group": "dp_cp",
        }
    ]
    assert "mtpdiag apply" in (first.remedy or "")


def test_without_a_layout_the_mtp_dp_hang_names_both_cp0_ranks():
    files = [os.path.join(scenario_dir("mtp_cp_dp"), f"rank{r}.json") for r in range(4)]
    report = diagnose(load_paths(files))
    assert report.verdict == "incomplete"
    assert report.findings[0].summary.startswith("ranks 0, 2 are in megatron-core's MTP-loss all_reduce over DP×CP")


def test_without_a_layout_the_indexer_reduce_asks_for_the_pipeline_size():
    files = [os.path.join(scenario_dir(STEP_SYNC), f"rank{r}.json") for r in range(4)]
    report = diagnose(load_paths(files))
    assert report.verdict == "incomplete"
    summary = report.findings[0].summary
    assert summary.startswith("ranks 2, 3 are in megatron-core's DeepSeek-indexer loss all_reduce over PP")
    assert "Megatron-LM #4745" in summary and summary.endswith("pass --pp")
