"""The model's own contracts: the JSON is the type. What a bundle's fields may hold is checked as it is
decoded (``True`` is no line number, ``0`` no flag), and what is written reads back the same."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.analysis.flight_recorder.evidence import layout_members
from mtpdiag.analysis.flight_recorder.match import PROVISIONAL_ROLE, match_groups, mismatches
from mtpdiag.errors import InputError
from mtpdiag.inputs.bundle import bundle_text, snapshot_from_data, snapshot_from_json
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import (
    FINDING_TYPES,
    STATE_GONE,
    STATE_STOPPED,
    Frame,
    FrameArgs,
    Layout,
    MtpCpGatedReduce,
    Report,
    Snapshot,
    ThreadStack,
    replace,
)
from mtpdiag.vocabulary.matching import MatchRole
from mtpdiag.vocabulary.states import ProcessState, Role
from support.captures import load_scenario, scenarios

FR_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fr"


def _bundle(*frames: dict) -> dict:
    return {
        "schema": "mtpdiag.bundle/1",
        "captures": [
            {"rank": 0, "state": "S", "threads": [{"thread_id": 1, "name": "MainThread", "frames": list(frames)}]}
        ],
    }


def _frame(**extra) -> dict:
    return {"function": "send", "file": "torch/distributed/distributed_c10d.py", "line": 10, **extra}


@pytest.mark.parametrize(
    "good, bad",
    [
        ({"args": {"dst": 1}}, {"args": {"dst": True}}),
        ({"args": {"dst": 0}}, {"args": {"dst": False}}),
        ({"native": False}, {"native": 0}),
        ({"line": 1}, {"line": True}),
    ],
)
def test_a_bad_frame_is_refused_with_the_place_it_is_at(good, bad):
    """``True == 1`` in Python: the decoder must still refuse a boolean where the type says int, and back."""
    assert snapshot_from_data(_bundle(_frame(**good)), "good.json").captures[0].threads[0].frames
    for document in (_bundle(_frame(**bad)), _bundle(_frame(function="f", line=2), _frame(**good), _frame(**bad))):
        for read in (
            lambda d: snapshot_from_data(d, "bad.json"),
            lambda d: snapshot_from_json(json.dumps(d).encode(), "bad.json"),
        ):
            with pytest.raises(InputError) as exc:
                read(document)
            message = str(exc.value)
            assert message.startswith("bad.json: not a valid mtpdiag bundle") and "\n" not in message
            assert "$.captures[0].threads[0].frames[" in message  # msgspec says where


@pytest.mark.parametrize("name", scenarios())
def test_every_recorded_scenario_round_trips_through_a_bundle(name):
    snapshot, _, _ = load_scenario(name)
    again = snapshot_from_json(bundle_text(snapshot).encode(), "again.json")
    assert again.captures == snapshot.captures
    assert again.flight_recorder == (
        replace(
            snapshot.flight_recorder, ranks=tuple(replace(r, format="bundle") for r in snapshot.flight_recorder.ranks)
        )
        if snapshot.flight_recorder
        else None
    )


def test_text_from_outside_is_made_printable_wherever_it_sits():
    hostile = "node\x1b]0;owned\x07\u202e\n"
    document = _bundle(_frame(function=hostile))
    document["host"] = document["captures"][0]["host"] = hostile
    document["captures"][0]["error"] = hostile
    for snapshot in (
        snapshot_from_data(document, "x.json"),
        snapshot_from_json(json.dumps(document).encode(), "x.json"),
    ):
        capture = snapshot.captures[0]
        for text in (snapshot.host, capture.host, capture.error, capture.threads[0].frames[0].function):
            assert text.isprintable() and "owned" in text


def test_the_report_decodes_as_its_own_type():
    """report/2 is the Report type: a consumer with msgspec (or this test) gets the Structs back."""
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    report = diagnose(snapshot, layout, "flags")
    text = msgspec.json.encode(report)
    again = msgspec.json.decode(text, type=Report)
    assert again == report
    assert json.loads(text)["schema"] == "mtpdiag.report/2"


def test_frames_are_values():
    """Equal frames and stacks hash alike whichever reader made them: the stack table keys by value."""
    a = Frame(file="torch/distributed/distributed_c10d.py", line=3, function="send", args=FrameArgs(dst=2))
    b = msgspec.json.decode(msgspec.json.encode(a), type=Frame)
    assert a == b and hash(a) == hash(b) and a is not b
    assert {(a,): 0}[(b,)] == 0
    assert a.arg("dst") == 2 and a.arg("src") is None and a.args.items() == (("dst", 2),)
    assert "native" not in msgspec.json.encode(a).decode()
    thread = ThreadStack(thread_id=1, name="MainThread", frames=(a,), calls=("item",))
    assert msgspec.json.decode(msgspec.json.encode(thread), type=ThreadStack) == thread
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"thread_id": 1, "frames": [], "calls": ["item()"]}', type=ThreadStack)


def test_a_bundle_keeps_no_locals_hash_and_the_recorders_stacks_once():
    snapshot, _, _ = load_scenario("nccl_mtp_cp_pp_futex")
    capture = snapshot.captures[0]
    live = replace(
        snapshot,
        captures=(
            replace(capture, threads=tuple(replace(t, locals_key=123) for t in capture.threads)),
            *snapshot.captures[1:],
        ),
    )
    document = json.loads(bundle_text(live))
    assert "locals_key" not in json.dumps(document)
    rank = document["flight_recorder"]["ranks"][0]
    assert len(rank["stacks"]) < len(rank["entries"]) and all("frames" not in e for e in rank["entries"])


def test_each_finding_reads_back_as_its_ids_type_and_other_details_are_refused():
    """The findings are a tagged union on ``id``: the details of one id under another are a decode error that
    says where, as any wrong type is."""
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    report = diagnose(snapshot, layout, "flags")
    again = msgspec.json.decode(msgspec.json.encode(report), type=Report)
    assert [type(f) for f in again.findings] == [FINDING_TYPES[f.id] for f in report.findings]
    assert isinstance(again.findings[0], MtpCpGatedReduce) and again.findings[0].details.gate == {"cp": 0}
    document = json.loads(msgspec.json.encode(report))
    document["findings"][0]["details"] = {"missing": [3], "world_size": 4}  # missing-rank's, under the MTP id
    with pytest.raises(msgspec.ValidationError, match=r"\$\.findings\[0\]\.details"):
        msgspec.json.decode(json.dumps(document), type=Report)
    document["findings"][0]["id"] = "no-such-finding"
    with pytest.raises(msgspec.ValidationError, match="no-such-finding"):
        msgspec.json.decode(json.dumps(document), type=Report)


def test_the_layout_is_a_typed_record_with_vpp_and_etp_only_when_set():
    plain = ParallelLayout.for_world(4, cp=2, pp=2).record()
    assert json.loads(msgspec.json.encode(plain)) == {
        "tp": 1,
        "cp": 2,
        "ep": 1,
        "dp": 1,
        "pp": 2,
        "order": "tp-cp-ep-dp-pp",
    }
    moe = ParallelLayout.for_world(16, tp=2, pp=2, ep=2, etp=1, vpp=2).record()
    assert list(msgspec.to_builtins(moe))[-2:] == ["vpp", "etp"] and (moe.vpp, moe.etp, moe.world_size) == (2, 1, 16)
    assert moe.sizes() == {"tp": 2, "cp": 1, "ep": 2, "dp": 4, "pp": 2, "vpp": 2, "etp": 1}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"tp": 1, "cp": "2", "ep": 1, "dp": 1, "pp": 1, "order": "tp-cp-ep-dp-pp"}', type=Layout)


def test_the_matchers_unknown_role_is_its_own_word_and_the_wait_for_graph_decides_the_split():
    """Without stacks (torch's JSON dumps of the TP broadcast hang) the recorder cannot order the absent ranks:
    the matcher says ``unknown`` (in
    the report's ``flight_recorder`` section too), a split it cannot order is named a root candidate on
    purpose (``PROVISIONAL_ROLE``), and the diagnosis's own roles come from the wait-for graph."""
    fr = load_fr_dumps(str(FR_FIXTURES / "gloo_tp_broadcast" / "json"))  # the JSON dumps keep no stacks
    layout = ParallelLayout.for_world(4, tp=2)
    analysis = match_groups(fr, layout_members(fr, layout))  # gloo records no group membership
    assert {c.role for d in analysis.divergences for c in d.calls} == {MatchRole.UNKNOWN}
    assert PROVISIONAL_ROLE[MatchRole.UNKNOWN] == Role.ROOT
    assert {m.role for m in mismatches(analysis)} == {Role.ROOT}
    report = diagnose(Snapshot(captures=(), flight_recorder=fr), layout, "flags")
    assert {m.role for m in report.mismatches} == {Role.ROOT, Role.CONSEQUENCE}
    document = json.loads(msgspec.json.encode(report))
    assert {c["role"] for d in document["flight_recorder"]["divergences"] for c in d["calls"]} == {"unknown"}


def test_a_process_state_is_its_proc_letter_and_the_capture_keeps_any_other():
    """``RankCapture.state`` is a string: a kernel's letter mtpdiag does not list is read, not refused."""
    assert (STATE_STOPPED, STATE_GONE) == (ProcessState.STOPPED, ProcessState.GONE) == ("T", "gone")
    document = _bundle(_frame())
    document["captures"][0]["state"] = "I"  # an idle kernel thread's letter
    assert snapshot_from_data(document, "x.json").captures[0].state == "I"
