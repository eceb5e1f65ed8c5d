"""json_report.render writes the document Report.to_dict describes, at both sizes.

Up to INDENT_MAX_RANKS ranks it is ``json.dumps(to_dict, indent=2)``; above, a compact writer builds the
text from cached pieces (big jobs share their stacks, sites and hosts) instead of encoding 16k rank dicts.
That writer must write exactly what ``json.dumps(to_dict, separators=(",", ":"))`` would, for every
recorded scenario tiled over more than 1024 ranks, and for the rare values too: ranks without a rank,
coords, site or stack, peers, errors, unusual coords, non-ASCII and control characters, progress, extra
keys. The variants are recorded views changed with dataclasses.replace.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import pytest
from captures import load_scenario, scenarios, tile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpdiag.analysis import diagnose
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Report, SchemaError, Site
from mtpdiag.progress import StallTracker
from mtpdiag.report import json_report

HOSTILE = "nöde-é—中\x1b[31m\x00\x7f\u2028\ud800\"\\\n%s%%"  # non-ASCII, controls, a lone surrogate, escapes


def _compact(report: Report) -> str:
    return json.dumps(report.to_dict(), separators=(",", ":"))


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


@pytest.fixture(scope="module")
def big_mtp() -> Report:
    return _big("mtp_cp_pp")


def _assert_same_text(got: str, want: str) -> None:
    """``got == want``, failing with the first difference (pytest's own diff of megabytes would take hours)."""
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        pytest.fail(f"texts differ at {at}: {got[max(0, at - 60):at + 60]!r} != {want[max(0, at - 60):at + 60]!r}")


def _assert_compact_is_exact(report: Report) -> None:
    assert len(report.ranks) > json_report.INDENT_MAX_RANKS
    text = json_report.render(report)
    newlines = text.count("\n")  # not `"\n" not in text`: pytest would diff megabytes on failure
    assert newlines == 0
    parses_to_the_report = json.loads(text) == report.to_dict()
    assert parses_to_the_report
    _assert_same_text(text, _compact(report))  # character for character, key order included


def test_the_compact_writer_knows_every_field_of_the_model():
    """A field added to RankView, Mismatch, Frame or Site sends big reports down the slow generic path."""
    assert json_report.FAST_PATH_MATCHES_MODEL


@pytest.mark.parametrize("name", scenarios())
def test_small_reports_are_indented_json_dumps(name):
    report = _small(name)
    assert len(report.ranks) <= json_report.INDENT_MAX_RANKS
    text = json_report.render(report)
    _assert_same_text(text, json.dumps(report.to_dict(), indent=2))
    assert text.startswith('{\n  "schema"')
    parses_to_the_report = json.loads(text) == report.to_dict()
    assert parses_to_the_report


@pytest.mark.parametrize("name", scenarios())
def test_big_reports_are_exactly_the_compact_json_dumps(name):
    report = _big(name)
    assert report.ranks and report.findings
    _assert_compact_is_exact(report)


def _with_ranks(report: Report, change) -> Report:
    """``report`` with ``change(views)`` applied to a list of its rank views."""
    views = list(report.ranks)
    change(views)
    return replace(report, ranks=tuple(views))


def _with_mismatches(report: Report, change) -> Report:
    mismatches = list(report.mismatches)
    change(mismatches)
    return replace(report, mismatches=tuple(mismatches))


def _sender(views) -> int:
    return next(i for i, v in enumerate(views) if v.peer is not None)


def _waiter(views) -> int:
    return next(i for i, v in enumerate(views) if v.site is not None and v.peer is None)


def _unsorted_doing(mismatches) -> dict:
    """Five of the root mismatch's absent ranks, highest first (to_dict writes them sorted)."""
    root = mismatches[0].absent_doing
    doing = {k: root[k] for k in sorted(root, reverse=True)[:5]}
    assert len(doing) == 5
    return doing


def _replace_at(items, at, **changes):
    items[at] = replace(items[at], **changes)


def _hostile_names(views):
    at = _waiter(views)
    first, *rest = views[at].stack
    _replace_at(views, at, host=HOSTILE, state=HOSTILE, op=HOSTILE, site=Site(HOSTILE, 7, HOSTILE),
                stack=(replace(first, function=HOSTILE, file=HOSTILE), *rest))


def _empty_rank(views):
    _replace_at(views, _waiter(views), rank=None, pid=None, coords=None, site=None, stack=(), op=None, error="")


def _peers_and_errors(views):
    _replace_at(views, _sender(views), error="py-spy: " + HOSTILE)
    _replace_at(views, _waiter(views), peer=0)


def _first_frames(views, change):
    """Each sender's innermost (send) frame changed by ``change(index among senders, frame)``."""
    senders = [i for i, v in enumerate(views) if v.peer is not None]
    for n, at in enumerate(senders):
        first, *rest = views[at].stack
        _replace_at(views, at, stack=(change(n, first), *rest))


def _args_renamed_on_one_frame(views):
    _first_frames(views, lambda n, f: replace(f, args=(("src", 1), *f.args[1:])) if n == 1 else f)


def _args_not_int_on_one_frame(views):
    _first_frames(views, lambda n, f: replace(f, args=(*f.args[:-1], (f.args[-1][0], True))) if n == 1 else f)


def _args_name_with_percent(views):
    _first_frames(views, lambda n, f: replace(f, args=(("d%st%%", n), *f.args[1:])))


def _coords_mapping_proxy(views):
    at = _waiter(views)
    _replace_at(views, at, coords=MappingProxyType(dict(views[at].coords)))


def _coords_in_another_order(views):
    at = _waiter(views)
    _replace_at(views, at, coords=dict(reversed(views[at].coords.items())))


def _coords_key_with_percent(views):
    views[:] = [replace(v, coords={**v.coords, "x%sy%%": 1}) for v in views]


def _coords_value_not_int(views):
    at = _waiter(views)
    _replace_at(views, at, coords={**views[at].coords, "tp": True})


def _no_layout(report):
    return replace(report, ranks=tuple(replace(v, coords=None) for v in report.ranks), mismatches=(), layout=None)


def _mismatch_without_gate_site_or_doing(mismatches):
    _replace_at(mismatches, 1, gate=None, site=None, absent_doing={})


def _mismatch_doing_unsorted(mismatches):
    _replace_at(mismatches, 2, absent_doing={**_unsorted_doing(mismatches), 0: HOSTILE + "},{"})


def _mismatch_doing_not_text(mismatches):
    """A value to_dict writes as it is, unsorted, where an encoder with sort_keys would sort it."""
    _replace_at(mismatches, 2, absent_doing={0: {"z": 1, "a": 2}})


def _mismatch_doing_mapping_proxy(mismatches):
    _replace_at(mismatches, 2, absent_doing=MappingProxyType(_unsorted_doing(mismatches)))


def _mismatch_lists_and_names(mismatches):
    _replace_at(mismatches, 3, members=list(mismatches[3].members), group=HOSTILE, role=HOSTILE, op=HOSTILE,
                gate={**(mismatches[3].gate or {}), "pp": 1})


def _mismatch_members_not_int(mismatches):
    _replace_at(mismatches, 3, members=(*mismatches[3].members, "],["), absent=[[1], [2]])


def _progress_and_extra(report):
    progress = StallTracker.start(0.0).progress(now=12.5, interval_s=0.5, stall_s=10.0)
    extra = {"flight_recorder": {"groups": [{"name": HOSTILE, "seq": [1, 2]}], "ok": False},
             "ranks": "a key to_dict already has: setdefault keeps the real one", "zz": 1.5}
    return replace(report, progress=progress, extra=extra)


VARIANTS = {
    "hostile names": lambda r: _with_ranks(r, _hostile_names),
    "rank without rank, pid, coords, site, stack": lambda r: _with_ranks(r, _empty_rank),
    "peers and errors": lambda r: _with_ranks(r, _peers_and_errors),
    "args renamed on one frame": lambda r: _with_ranks(r, _args_renamed_on_one_frame),
    "args not int on one frame": lambda r: _with_ranks(r, _args_not_int_on_one_frame),
    "args name with percent": lambda r: _with_ranks(r, _args_name_with_percent),
    "coords mapping proxy": lambda r: _with_ranks(r, _coords_mapping_proxy),
    "coords in another order": lambda r: _with_ranks(r, _coords_in_another_order),
    "coords key with percent": lambda r: _with_ranks(r, _coords_key_with_percent),
    "coords value not int": lambda r: _with_ranks(r, _coords_value_not_int),
    "no layout": _no_layout,
    "mismatch without gate, site, doing": lambda r: _with_mismatches(r, _mismatch_without_gate_site_or_doing),
    "mismatch doing unsorted": lambda r: _with_mismatches(r, _mismatch_doing_unsorted),
    "mismatch doing mapping proxy": lambda r: _with_mismatches(r, _mismatch_doing_mapping_proxy),
    "mismatch doing not text": lambda r: _with_mismatches(r, _mismatch_doing_not_text),
    "mismatch members not int": lambda r: _with_mismatches(r, _mismatch_members_not_int),
    "mismatch lists and names": lambda r: _with_mismatches(r, _mismatch_lists_and_names),
    "progress and extra": _progress_and_extra,
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_big_reports_with_rare_values(big_mtp, variant):
    _assert_compact_is_exact(VARIANTS[variant](big_mtp))


def test_what_the_rare_values_parse_to(big_mtp):
    report = _progress_and_extra(_with_ranks(big_mtp, lambda views: (_empty_rank(views), _hostile_names(views))))
    parsed = json.loads(json_report.render(report))
    at = _waiter(big_mtp.ranks)
    assert parsed["ranks"][at]["rank"] is None and parsed["ranks"][at]["stack"] == []
    assert "error" not in parsed["ranks"][at]  # an empty error is left out, as to_dict does
    assert [r["host"] for r in parsed["ranks"]].count(HOSTILE) == 1
    assert parsed["progress"] == report.progress
    assert parsed["flight_recorder"] == report.extra["flight_recorder"]
    assert list(parsed)[-3:] == ["progress", "flight_recorder", "zz"]


def test_values_of_other_types_are_written_as_the_encoder_writes_them(big_mtp):
    """The model declares str hosts and int lines, but nothing enforces it: a True must stay true even next
    to a 1 (they hash alike), a 1 must not be taken for "1", a float line stays a float."""
    views = list(big_mtp.ranks)
    odd = [True, 1, "1", None, "None", 1.0, "True", False, 0]
    for i, value in enumerate(odd):
        view = views[i]
        site = replace(view.site, line=value) if view.site else None
        views[i] = replace(view, host=value, state=value, op=value, rank=value, site=site, peer=value,
                           error=value, stack=tuple(replace(f, line=value) for f in view.stack))
    _assert_compact_is_exact(replace(big_mtp, ranks=tuple(views)))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(host=st.text(max_size=12), function=st.text(max_size=12), error=st.none() | st.text(max_size=12),
       peer=st.none() | st.integers(min_value=0, max_value=2**40), at=st.integers(min_value=0, max_value=1027))
def test_any_text_in_a_rank_is_written_as_the_encoder_writes_it(big_mtp, host, function, error, peer, at):
    views = list(big_mtp.ranks)
    view = views[at]
    stack = tuple(replace(f, function=function) if i == 0 else f for i, f in enumerate(view.stack))
    views[at] = replace(view, host=host, stack=stack, error=error, peer=peer)
    _assert_compact_is_exact(replace(big_mtp, ranks=tuple(views)))


def test_native_frames_round_trip_and_render_as_the_model_does():
    """A C frame (py-spy --native) keeps its flag through a bundle and the compact JSON writer."""
    from mtpdiag.model import Frame, ThreadStack

    native = Frame(function="cudaStreamSynchronize", file="libcudart.so.12", line=0, native=True)
    python = Frame(function="train_step", file="train.py", line=12)
    thread = ThreadStack(thread_id=1, name="MainThread", frames=(native, python))
    back = ThreadStack.from_dict(thread.to_dict())
    assert back.frames == (native, python)
    assert "native" not in python.to_dict() and native.to_dict()["native"] is True
    with pytest.raises(SchemaError):
        Frame.from_dict({"function": "f", "file": "x", "line": 1, "native": 1})
