"""json_report.render writes the ``Report`` type as ``mtpdiag.report/2``: indented up to INDENT_MAX_RANKS ranks,
compact above (the same document), each distinct stack once, for every recorded scenario and with hostile
text in any field."""

from __future__ import annotations

import json

import msgspec
import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Frame, Report, ThreadStack, replace
from mtpdiag.report import json_report
from support.captures import load_scenario, scenarios, tile

HOSTILE = 'nöde-é—中\x1b[31m\x00\x7f\u2028"\\\n%s%%'  # non-ASCII, controls, escapes
SURROGATE = "rank\udcff.json"  # what os.fsdecode makes of a file name that is not UTF-8


def _small(name: str) -> Report:
    snapshot, layout, _ = load_scenario(name)
    return diagnose(snapshot, layout, "flags")


def _big(name: str) -> Report:
    """The recorded hang tiled over the smallest world of more than INDENT_MAX_RANKS ranks."""
    snapshot, layout, meta = load_scenario(name)
    sizes = meta["layout"]
    world = (json_report.INDENT_MAX_RANKS // layout.world_size + 1) * layout.world_size
    big = ParallelLayout.for_world(
        world, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), pp=sizes.get("pp", 1), ep=sizes.get("ep", 1)
    )
    return diagnose(tile(snapshot, layout, big), big, "flags")


@pytest.mark.parametrize("name", scenarios())
def test_small_reports_are_the_indented_document(name):
    report = _small(name)
    assert len(report.ranks) <= json_report.INDENT_MAX_RANKS
    text = json_report.render(report)
    assert text.startswith('{\n  "schema": "mtpdiag.report/2",\n  "verdict": ')
    assert json.loads(text) == json.loads(json_report.encode(report))
    assert msgspec.json.decode(text, type=Report) == report  # the document reads back as its type


@pytest.mark.parametrize("name", ["mtp_cp_pp", "straggler"])
def test_big_reports_are_one_compact_line_listing_each_stack_once(name):
    report = _big(name)
    text = json_report.render(report)
    assert text.count("\n") == 0
    document = json.loads(text)
    assert document == json.loads(json_report.document(report))
    assert len({json.dumps(s) for s in document["stacks"]}) == len(document["stacks"])  # each one once
    # A handful of stacks serve every rank; only a send's or recv's own peer (its ``dst``) tells two apart.
    assert len({json.dumps([{k: v for k, v in f.items() if k != "args"} for f in s]) for s in document["stacks"]}) <= 8
    assert len(document["stacks"]) <= len(document["ranks"]) // 3
    for row in document["ranks"]:
        assert row["stack"] is None or 0 <= row["stack"] < len(document["stacks"])


def test_hostile_text_in_a_rank_survives_the_round_trip():
    report = _small("mtp_cp_pp")
    first = replace(report.ranks[0], host=HOSTILE, error=HOSTILE)
    report = replace(report, ranks=(first, *report.ranks[1:]))
    back = json.loads(json_report.render(report))
    assert back["ranks"][0]["host"] == HOSTILE and back["ranks"][0]["error"] == HOSTILE


@pytest.mark.parametrize("size", [_small, _big])
def test_a_lone_surrogate_is_replaced_rather_than_failing_the_report(size):
    report = size("mtp_cp_pp")
    report = replace(report, notes=(*report.notes, f"not captured: {SURROGATE}: not a text file"))
    for printed in (json_report.render(report).encode(), json_report.document(report)):  # --json prints the second
        assert printed.endswith(b"}\n") or printed.endswith(b"}")
        back = json.loads(printed)
        assert back["notes"][-1] == "not captured: rank\ufffd.json: not a text file"
        assert back == json.loads(json_report.document(replace(report, notes=report.notes[:-1]))) | {
            "notes": back["notes"]
        }


def test_native_frames_round_trip():
    """A C frame (py-spy --native) keeps its flag through a bundle's thread and the report."""
    native = Frame(function="cudaStreamSynchronize", file="libcudart.so.12", line=0, native=True)
    python = Frame(function="train_step", file="train.py", line=12)
    thread = ThreadStack(thread_id=1, name="MainThread", frames=(native, python), calls=("item",))
    back = msgspec.json.decode(msgspec.json.encode(thread), type=ThreadStack)
    assert back.frames == (native, python) and back.calls == ("item",)
    assert "native" not in msgspec.to_builtins(python) and msgspec.to_builtins(native)["native"] is True
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"function": "f", "file": "x", "line": 1, "native": 1}', type=Frame)
