"""The finding rules (analysis.findings.RULES): one per stable id, in the order the report lists them."""

from __future__ import annotations

from mtpdiag.analysis import diagnose
from mtpdiag.analysis.findings import RULES, ordered
from mtpdiag.model import FINDING_TYPES, AllWaitingDetails, SplitDetails
from mtpdiag.vocabulary.states import FindingId, GroupFrom, Source, Verdict
from support.captures import load_scenario

# The stable ids of docs/design.md, as users script against them.
DOCUMENTED = {
    "mtp-cp-gated-reduce",
    "gated-collective",
    "p2p-unmatched",
    "straggler",
    "frozen-rank",
    "missing-rank",
    "all-waiting",
    "size-mismatch",
    "dtype-mismatch",
    "unexplained-wait",
}


def test_every_documented_id_has_exactly_one_rule():
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids)) and set(ids) == set(FindingId) == DOCUMENTED


def test_only_the_evidence_gap_is_incomplete():
    assert {r.id for r in RULES if r.verdict == Verdict.INCOMPLETE} == {FindingId.UNEXPLAINED_WAIT}


SPLIT = SplitDetails(
    op="all_reduce",
    site=None,
    group="dp_cp",
    gate={"cp": 0},
    members=(0, 1),
    entered=(0,),
    absent=(1,),
    instances=1,
    group_from=GroupFrom.KNOWN_SITE,
    group_candidates=("dp_cp",),
    gate_strength=None,
    source=Source.STACKS,
)
DETAILS = {
    "all-waiting": AllWaitingDetails(),
    "gated-collective": SPLIT,
    "mtp-cp-gated-reduce": SPLIT,
    "frozen-rank": None,
}


def test_every_id_has_its_own_finding_type():
    assert set(FINDING_TYPES) == set(FindingId)
    assert all(kind(ranks=(0,), summary="", remedy=None, details=None).id == i for i, kind in FINDING_TYPES.items())


def test_causes_come_first_then_by_rank():
    made = [
        FINDING_TYPES[FindingId(i)](ranks=(r,), summary="", remedy=None, details=DETAILS[i])
        for i, r in (
            ("all-waiting", 0),
            ("gated-collective", 5),
            ("frozen-rank", 9),
            ("gated-collective", 1),
            ("mtp-cp-gated-reduce", 3),
        )
    ]
    assert [(f.id, f.ranks[0]) for f in ordered(made)] == [
        ("mtp-cp-gated-reduce", 3),
        ("frozen-rank", 9),
        ("gated-collective", 1),
        ("gated-collective", 5),
        ("all-waiting", 0),
    ]


def test_a_recorded_hang_is_found_through_the_rules():
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    report = diagnose(snapshot, layout)
    assert [f.id for f in report.findings][:1] == ["mtp-cp-gated-reduce"] and report.verdict == "problem"


def test_the_evidence_gap_is_a_finding_only_while_no_problem_is_found():
    """NCCL's picture: every rank at a host sync. The stacks alone cannot say why (``unexplained-wait``,
    incomplete); with the recorder's dumps of the same hang the split is found and the gap is no finding."""
    from mtpdiag.model import replace

    snapshot, layout, _ = load_scenario("nccl_mtp_cp_pp_futex")
    alone = diagnose(replace(snapshot, flight_recorder=None), layout)
    assert alone.verdict == "incomplete" and [f.id for f in alone.findings] == ["unexplained-wait"]
    both = diagnose(snapshot, layout)
    assert both.verdict == "problem" and "unexplained-wait" not in [f.id for f in both.findings]
