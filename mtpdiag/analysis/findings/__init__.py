"""Findings: the diagnosed problems, each with a stable id (docs/design.md), in plain words.

Every finding comes from one rule of ``RULES``: its id, its place among the findings (``priority``: causes
first), whether it makes the verdict ``problem`` or only ``incomplete`` (a gap in the evidence, built only
when no problem was found), and the builder that reads the diagnosis's ``Facts``. Rules run in the order
they are listed, and each sees the findings made before it (``all-waiting`` only speaks when nothing else
did). Adding a finding is a builder in the module of its family and one line here:

* ``collectives``: root split collectives (``mtp-cp-gated-reduce``, ``gated-collective``) and collectives
  entered with different sizes or dtypes;
* ``p2p``: a send/recv whose peer is elsewhere (``p2p-unmatched``);
* ``blocked``: ranks others wait on (``straggler``, ``frozen-rank``);
* ``world``: ``missing-rank``, ``all-waiting``, ``unexplained-wait``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec

from mtpdiag.analysis.findings import blocked, collectives, p2p, world
from mtpdiag.analysis.findings.facts import Facts
from mtpdiag.analysis.findings.words import gate_source_phrase, group_source_phrase, provenance
from mtpdiag.model import Finding
from mtpdiag.vocabulary.states import FindingId, Verdict

Builder = Callable[[Facts, Sequence[Finding]], list[Finding]]


class Rule(msgspec.Struct, frozen=True):
    id: FindingId
    priority: int  # lower comes first in the report: the causes, then what they cause
    verdict: Verdict  # PROBLEM, or INCOMPLETE for a finding that says what the evidence cannot
    build: Builder


RULES: tuple[Rule, ...] = (
    Rule(FindingId.MTP_CP_GATED_REDUCE, 0, Verdict.PROBLEM, collectives.mtp_findings),
    Rule(FindingId.GATED_COLLECTIVE, 3, Verdict.PROBLEM, collectives.gated_findings),
    Rule(FindingId.P2P_UNMATCHED, 4, Verdict.PROBLEM, p2p.findings),
    Rule(FindingId.STRAGGLER, 2, Verdict.PROBLEM, blocked.stragglers),
    Rule(FindingId.FROZEN_RANK, 1, Verdict.PROBLEM, blocked.frozen),
    Rule(FindingId.SIZE_MISMATCH, 3, Verdict.PROBLEM, collectives.size_mismatches),
    Rule(FindingId.DTYPE_MISMATCH, 3, Verdict.PROBLEM, collectives.dtype_mismatches),
    Rule(FindingId.MISSING_RANK, 5, Verdict.PROBLEM, world.missing),
    Rule(FindingId.ALL_WAITING, 6, Verdict.PROBLEM, world.all_waiting),
    Rule(FindingId.UNEXPLAINED_WAIT, 7, Verdict.INCOMPLETE, world.unexplained),
)
RULE_OF = {rule.id: rule for rule in RULES}


def build(facts: Facts) -> tuple[Finding, ...]:
    """Every rule's findings, in the report's order (by priority, then first rank; ties in rule order)."""
    found: list[Finding] = []
    for rule in RULES:
        if rule.verdict == Verdict.INCOMPLETE and any(is_problem(f) for f in found):
            continue
        made = rule.build(facts, tuple(found))
        assert all(f.id == rule.id for f in made), f"rule {rule.id} built {[f.id for f in made]}"
        found += made
    return ordered(found)


def is_problem(finding: Finding) -> bool:
    return RULE_OF[FindingId(finding.id)].verdict == Verdict.PROBLEM


def ordered(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Causes first (by rule priority), then by first rank; otherwise in the order they were built."""
    return tuple(sorted(findings, key=lambda f: (RULE_OF[FindingId(f.id)].priority, f.ranks[:1])))


__all__ = [
    "RULES",
    "RULE_OF",
    "Facts",
    "Rule",
    "build",
    "gate_source_phrase",
    "group_source_phrase",
    "is_problem",
    "ordered",
    "provenance",
]
