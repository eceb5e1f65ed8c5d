"""json_report.render writes the document Report.to_dict describes: indented up to INDENT_MAX_RANKS ranks,
compact above (the same document), for every recorded scenario, and with hostile text in any field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from captures import load_scenario, scenarios, tile

from mtpdiag.analysis import diagnose
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Frame, Report, SchemaError, ThreadStack
from mtpdiag.report import json_report

HOSTILE = "nöde-é—中\x1b[31m\x00\x7f\u2028\ud800\"\\\n%s%%"  # non-ASCII, controls, a lone surrogate, escapes


def _small(name: str) -> Report:
    snapshot, layout, _ = load_scenario(name)
    return diagnose(snapshot, layout, "flags")


def _big(name: str) -> Report:
    """The recorded hang tiled over the smallest world of more than INDENT_MAX_RANKS ranks."""
    snapshot, layout, meta = load_scenario(name)
    sizes = meta["layout"]
    world = (json_report.INDENT_MAX_RANKS // layout.world_size + 1) * layout.world_size
    big = ParallelLayout.for_world(world, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1),
                                   pp=sizes.get("pp", 1), ep=sizes.get("ep", 1))
    return diagnose(tile(snapshot, layout, big), big, "flags")


@pytest.mark.parametrize("name", scenarios())
def test_small_reports_are_indented_json_dumps(name):
    report = _small(name)
    assert len(report.ranks) <= json_report.INDENT_MAX_RANKS
    assert json_report.render(report) == json.dumps(report.to_dict(), indent=2)


@pytest.mark.parametrize("name", ["mtp_cp_pp", "straggler"])
def test_big_reports_are_one_compact_line_of_the_same_document(name):
    report = _big(name)
    text = json_report.render(report)
    assert text.count("\n") == 0
    assert json.loads(text) == report.to_dict()


def test_hostile_text_in_a_rank_survives_the_round_trip():
    report = _small("mtp_cp_pp")
    first = replace(report.ranks[0], host=HOSTILE, error=HOSTILE)
    report = replace(report, ranks=(first, *report.ranks[1:]))
    back = json.loads(json_report.render(report))
    assert back["ranks"][0]["host"] == HOSTILE and back["ranks"][0]["error"] == HOSTILE


def test_native_frames_round_trip():
    """A C frame (py-spy --native) keeps its flag through a bundle's thread and the report."""
    native = Frame(function="cudaStreamSynchronize", file="libcudart.so.12", line=0, native=True)
    python = Frame(function="train_step", file="train.py", line=12)
    thread = ThreadStack(thread_id=1, name="MainThread", frames=(native, python), calls=("item",))
    back = ThreadStack.from_dict(thread.to_dict())
    assert back.frames == (native, python) and back.calls == ("item",)
    assert "native" not in python.to_dict() and native.to_dict()["native"] is True
    with pytest.raises(SchemaError):
        Frame.from_dict({"function": "f", "file": "x", "line": 1, "native": 1})
    with pytest.raises(SchemaError):
        ThreadStack.from_dict({"thread_id": 1, "frames": [], "calls": ["item()"]})
