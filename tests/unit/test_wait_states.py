"""Wait states on recorded captures: what a rank in no collective waits on, and the evidence it rests on.

The captures are real: py-spy and pystack dumps recorded from the CPU reproducers
(``tests/fixtures/record.py``, ``tests/fixtures/record_pastes.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.analysis.wait import is_stuck
from mtpdiag.inputs import load_paths
from mtpdiag.layout import ParallelLayout

PASTES = Path(__file__).resolve().parent.parent / "fixtures" / "pastes"
STRAGGLER = ParallelLayout.for_world(4, cp=2)


def _report(pattern: str, layout=STRAGGLER):
    return diagnose(load_paths(sorted(str(p) for p in PASTES.glob(pattern))), layout, "flags")


def test_pystack_source_lines_say_the_straggler_sleeps():
    """pystack prints each frame's source line: ``time.sleep(0.5)`` makes rank 3's wait a sleep, and it
    holds its group up (a straggler), named with what it does."""
    report = _report("straggler/rank?.pystack.txt")
    rank3 = report.ranks[3]
    assert (rank3.state, rank3.wait.kind, rank3.wait.confidence) == ("waiting", "sleep", "likely")
    assert "the line calls sleep()" in rank3.wait.evidence
    assert report.findings[0].id == "straggler" and "sleeping in load_batch" in report.findings[0].summary


def test_py_spy_text_alone_knows_only_that_the_straggler_is_blocked():
    """Without source lines or /proc, an idle rank at its own line is blocked in a C call: still the one the
    group waits on, never a healthy or running rank."""
    report = _report("straggler/rank?.pyspy.txt")
    rank3 = report.ranks[3]
    assert (rank3.state, rank3.wait.kind) == ("waiting", "unknown")
    assert is_stuck(rank3.wait)
    assert report.findings[0].id == "straggler"


@pytest.mark.parametrize("form", ["native", "pystack-native"])
def test_native_frames_are_evidence_never_the_call_site(form):
    """--native dumps put C frames (pthread_cond_wait, futex) innermost: the call site and the op still come
    from the Python frames, and the diagnosis is the one of the plain dumps."""
    layout = ParallelLayout.for_world(4, cp=2, pp=2)
    plain = diagnose(load_paths(sorted(str(p) for p in PASTES.glob("mtp_cp_pp/rank?.pyspy.txt"))), layout)
    native = diagnose(load_paths(sorted(str(p) for p in PASTES.glob(f"mtp_cp_pp/rank?.{form}.txt"))), layout)
    assert any(f.native for v in native.ranks for f in native.stack_of(v))
    assert [(v.rank, v.op, v.site.function.rsplit(".", 1)[-1]) for v in native.ranks] == [
        (v.rank, v.op, v.site.function.rsplit(".", 1)[-1]) for v in plain.ranks
    ]
    assert [f.id for f in native.findings] == [f.id for f in plain.findings] == ["mtp-cp-gated-reduce"]


def test_a_failed_capture_is_the_suspect_it_was():
    """py-spy --native could not read the SIGSTOPped rank 1 ("Failed to suspend process"): the file holds
    that error. The rank is unreadable, with py-spy's reason, and it leads the report as the frozen rank."""
    report = _report("frozen/rank?.native.txt", ParallelLayout.for_world(4))
    rank1 = report.ranks[1]
    assert rank1.state == "unreadable" and "Failed to suspend process" in rank1.error
    first = report.findings[0]
    assert (first.id, first.ranks) == ("frozen-rank", (1,))
    assert "Failed to suspend process" in first.summary
