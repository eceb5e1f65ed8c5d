"""Flight Recorder dumps of a real hung gloo job: loading, per-group progress, correlation, bad input.

One real job: the session's canonical hang (``support/canonical_hang.py``), the MTP-CP reproducer (4 ranks,
cp=2 pp=2, buggy gate) run by ``examples/flight_recorder/worker.py``, which writes torch's Flight Recorder pickle
per rank once the collectives stall. The stacks of the same hang are captured with py-spy and diagnosed.
"""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from mtpdiag.analysis.flight_recorder import correlate, group_progress
from mtpdiag.errors import InputError
from mtpdiag.inputs.flight_recorder import load_fr_dumps, op_name
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Report, replace
from mtpdiag.model.flight_recorder import FRDump
from support.frtrace import assert_agreement

LAYOUT = ParallelLayout.for_world(4, cp=2, pp=2)
DP_CP = "DATA_PARALLEL_GROUP_WITH_CP"


@dataclass(frozen=True)
class HungJob:
    prefix: str  # TORCH_FR_DUMP_TEMP_FILE: the dumps are <prefix><rank>
    report: Report  # the stack diagnosis of the same hang


def _diagnose_live(agent_pid: int) -> Report:
    from mtpdiag.analysis import diagnose
    from mtpdiag.capture import capture

    snapshot = capture(pids=[agent_pid])
    return diagnose(snapshot, LAYOUT, "flags")


@pytest.fixture(scope="module")
def hung(canonical_hang) -> HungJob:
    """The session's canonical hang (``support/canonical_hang.py``), which runs the reproducer through
    ``examples/flight_recorder``: every rank has dumped by the time it is handed out."""
    return HungJob(prefix=canonical_hang.fr_prefix, report=_diagnose_live(canonical_hang.pid))


@pytest.fixture(scope="module")
def fr(hung) -> FRDump:
    return load_fr_dumps(hung.prefix)


def _progress(fr: FRDump, desc: str, member: int):
    return next(g for g in group_progress(fr) if g.desc == desc and member in g.members)


# ---------------------------------------------------------------- the recorded hang


def test_every_rank_dumped_and_the_directory_loads_the_same(fr, hung):
    assert [d.rank for d in fr.ranks] == [0, 1, 2, 3]
    by_dir = load_fr_dumps(str(Path(hung.prefix).parent))
    assert [(d.rank, d.entries) for d in by_dir.ranks] == [(d.rank, d.entries) for d in fr.ranks]
    assert all(e.profiling_name.startswith("gloo:") for d in fr.ranks for e in d.entries)


def test_pg_config_gives_the_exact_dp_cp_membership(fr):
    for rank in (2, 3):
        groups = [g for g in fr.rank(rank).groups if g.desc == DP_CP]
        assert [g.ranks for g in groups] == [(2, 3)]
    assert [g.ranks for g in fr.rank(0).groups if g.desc == DP_CP] == [(0, 1)]
    assert _progress(fr, DP_CP, 2).members_from == "pg_config"


def test_rank2_waits_in_the_dp_cp_all_reduce_that_rank3_never_started(fr):
    g = _progress(fr, DP_CP, 2)
    assert g.members == (2, 3)
    [pending] = g.pending[2]
    assert (pending.op, pending.done, pending.is_p2p) == ("all_reduce", False, False)
    assert pending.site is not None and pending.site.function == "MTPLossLoggingHelper.reduce_loss_in_tracker"
    assert 3 not in g.pending
    assert g.last_entered[3] < g.last_entered[2] == pending.collective_seq_id
    assert g.behind == (3,)


def test_in_the_cp_group_rank3_waits_in_all_gather_and_rank2_is_behind(fr):
    g = _progress(fr, "CONTEXT_PARALLEL_GROUP", 2)
    assert g.members == (2, 3)
    assert [e.op for e in g.pending[3]] == ["all_gather"]
    assert g.pending[3][0].site.function == "ring_attention"
    assert g.behind == (2,)


def test_pg_config_catches_a_wrong_layout(fr):
    right = Report(
        verdict="ok",
        world_size=4,
        layout=LAYOUT.record(),
        layout_source=None,
        ranks=(),
        stacks=(),
        sites=(),
        mismatches=(),
        findings=(),
        notes=(),
    )
    assert correlate(right, fr).disagreements == ()
    wrong = replace(right, layout=ParallelLayout.for_world(4, pp=2).record())  # cp forgotten
    found = correlate(wrong, fr).disagreements
    assert any("CONTEXT_PARALLEL_GROUP" in line and "[2, 3]" in line for line in found)


def test_correlation_with_the_stack_diagnosis_agrees_on_the_split_group(fr, hung):
    result = correlate(hung.report, fr)
    [root] = [m for m in result.mismatches if m.op == "all_reduce"]
    assert (root.group, root.fr_desc, root.fr_members) == ("dp_cp", DP_CP, (2, 3))
    assert (root.fr_entered, root.fr_absent, root.agrees) == ((2,), (3,), True)
    assert not [d for d in result.disagreements if DP_CP in d]
    assert any(line.startswith("FR agrees with the stacks on all_reduce") for line in result.lines)
    document = json.loads(msgspec.json.encode(replace(hung.report, flight_recorder=result)))
    assert document["flight_recorder"]["groups"][0]["members"] == [2, 3]


def test_a_mislabelled_dump_shows_up_as_disagreements(hung, tmp_path):
    """Rank 2's dump filed as rank 3's: FR and the stacks now tell different stories about rank 3."""
    for rank, source in ((0, 0), (1, 1), (2, 2), (3, 2)):
        shutil.copy(f"{hung.prefix}{source}", tmp_path / f"rank_{rank}")
    result = correlate(hung.report, load_fr_dumps(str(tmp_path)))
    [root] = [m for m in result.mismatches if m.op == "all_reduce"]
    assert (root.fr_entered, root.fr_absent, root.agrees) == ((2, 3), (), False)
    assert any(
        d.startswith("FR says rank 3 waits in all_reduce") and d.endswith("stacks say it waits in all_gather")
        for d in result.disagreements
    )
    assert any(line.startswith("disagreement: ") for line in result.lines)


def test_without_pg_config_the_layout_supplies_the_members(fr, hung, tmp_path):
    """torch 2.13's gloo files every group under an empty name in pg_config; dumps written so still work."""
    for dump in fr.ranks:
        data = pickle.loads(Path(dump.path).read_bytes())  # our own job's dump
        data["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        (tmp_path / f"rank_{dump.rank}").write_bytes(pickle.dumps(data))
    bare = load_fr_dumps(str(tmp_path))
    assert all(d.groups == () for d in bare.ranks)
    g = _progress(bare, DP_CP, 2)
    assert (g.members, g.members_from, g.behind) == ((2,), "entries", ())
    [root] = [m for m in correlate(hung.report, bare).mismatches if m.op == "all_reduce"]
    assert (root.fr_members, root.fr_members_from, root.fr_absent, root.agrees) == ((2, 3), "entries", (3,), True)


def test_torchfrtrace_agrees_with_the_matcher_on_the_live_dumps(hung):
    """torch's own analyzer on this job's dumps names the same collectives and culprits (test_fr_torchfrtrace)."""
    files = sorted(Path(hung.prefix).parent.glob(Path(hung.prefix).name + "[0-9]*"))
    ours = assert_agreement(files)
    [root] = [c for d in ours.values() for c in d.calls if c.role == "root"]
    assert (root.op, root.entered, root.absent) == ("all_reduce", (2,), (3,))


def test_op_names_follow_the_stack_analysis():
    assert op_name("gloo:all_reduce") == "all_reduce"
    assert op_name("nccl:send 0->1") == "send"
    assert op_name("nccl:_allgather_base") == "all_gather_into_tensor"


# ---------------------------------------------------------------- bad input


def test_a_truncated_dump_is_an_input_error_naming_the_file(hung, tmp_path):
    data = Path(f"{hung.prefix}2").read_bytes()
    (tmp_path / "rank_0").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"rank_0: not a readable Flight Recorder dump"):
        load_fr_dumps(str(tmp_path / "rank_"))


class _OpensAFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_with_a_class_or_callable_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "was_run"
    (tmp_path / "dump0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_OpensAFile(str(marker))]}))
    with pytest.raises(InputError, match=r"dump0: .*refuses to load \w+\.open"):
        load_fr_dumps(str(tmp_path / "dump"))
    assert not marker.exists()


def test_a_plain_pickle_that_is_not_a_dump_is_an_input_error(tmp_path):
    (tmp_path / "rank_1").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(InputError, match=r"rank_1: not a Flight Recorder dump"):
        load_fr_dumps(str(tmp_path))


def test_an_empty_directory_or_unknown_prefix_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no Flight Recorder dumps"):
        load_fr_dumps(str(tmp_path))
    with pytest.raises(InputError, match="no Flight Recorder dumps"):
        load_fr_dumps(str(tmp_path / "nccl_trace_rank_"))
    with pytest.raises(InputError, match="is not a directory"):
        load_fr_dumps(str(tmp_path / "missing" / "rank_"))


def test_two_families_in_one_directory_need_a_prefix(hung, tmp_path):
    for name in ("a_0", "b_0"):
        shutil.copy(f"{hung.prefix}0", tmp_path / name)
    with pytest.raises(InputError, match="several dump prefixes"):
        load_fr_dumps(str(tmp_path))
    assert [d.rank for d in load_fr_dumps(str(tmp_path / "a_")).ranks] == [0]
