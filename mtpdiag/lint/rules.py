"""The judgement: a collective that part of its group can skip, because a rank test that differs inside that
group guards it and nothing on the other branch makes the same call (or its point-to-point partner)."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from mtpdiag.lint.groups import _GROUP_CALL_KINDS, ANY, _collective_group, group_coords, known_function_rows, splits
from mtpdiag.lint.guards import Guard, GuardedCall, guarded_calls
from mtpdiag.lint.names import call_name, source_text
from mtpdiag.lint.rank_tests import _MEMBERSHIP_TESTS, TRACKER_WHY, RankTest, rank_tests
from mtpdiag.model import Record
from mtpdiag.vocabulary.ops import P2P_CALLS, P2P_PARTNER

SCHEMA = "mtpdiag.lint/1"


class LintFinding(Record, frozen=True, omit_defaults=False):
    """A collective that part of its group can skip."""

    file: str
    line: int
    collective: str
    condition: str
    reason: str


class LintReport(Record, frozen=True, tag_field="schema", tag=SCHEMA):
    """What ``lint --json`` prints (``mtpdiag.lint/1``)."""

    findings: tuple[LintFinding, ...]


@dataclass(frozen=True)
class LintResult:
    findings: tuple[LintFinding, ...]
    files: int
    skipped: tuple[str, ...]  # "path: why" for files under a directory that could not be parsed

    @property
    def document(self) -> LintReport:
        return LintReport(findings=self.findings)


def lint_source(source: str, filename: str) -> list[LintFinding]:
    """Findings for one file's text. Raises SyntaxError when it is not Python."""
    tree = ast.parse(source, filename=filename)
    calls = guarded_calls(tree)
    summaries = collectives_by_function(tree, calls)
    findings = []
    for gc in calls:
        finding = _judge(gc, source, filename, summaries)
        if finding:
            findings.append(finding)
    return findings


def collectives_by_function(tree: ast.AST, calls: list[GuardedCall]) -> dict[str, frozenset[str]]:
    """Function name -> collectives it runs, directly or through other functions of the same file
    (matched by bare name, so a method and a function of one name are merged: good enough here)."""
    direct: dict[str, set[str]] = {}
    callees: dict[str, set[str]] = {}
    by_node: dict[int, set[str]] = {}
    for gc in calls:
        by_node.setdefault(id(gc.function), set()).add(gc.collective)
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            direct.setdefault(fn.name, set()).update(by_node.get(id(fn), ()))
            callees.setdefault(fn.name, set()).update(
                name for n in ast.walk(fn) if isinstance(n, ast.Call) and (name := call_name(n))
            )
    summary = {name: set(ops) for name, ops in direct.items()}
    changed = True
    while changed:
        changed = False
        for name, called in callees.items():
            for callee in called & summary.keys():
                if not summary[callee] <= summary[name]:
                    summary[name] |= summary[callee]
                    changed = True
    return {name: frozenset(ops) for name, ops in summary.items()}


def _judge(
    gc: GuardedCall, source: str, filename: str, summaries: dict[str, frozenset[str]] | None = None
) -> LintFinding | None:
    label, span = _collective_group(gc, source, filename)
    p2p = gc.collective in P2P_CALLS
    culprits: list[tuple[Guard, list[RankTest]]] = []
    for guard in gc.guards:
        tests = [t for t in rank_tests(guard.test, source) if not _tests_own_group(t, gc)]
        if not tests or _matched_on_other_branch(gc, guard, summaries or {}):
            # Both sides of the branch make the call (a broadcast's src and receivers, a send and its recv).
            continue
        if p2p:
            # Pipelines gate send/recv on the stage, rings on the position, bridges on membership; pairing
            # is a runtime matter, so only a p2p call whose partner appears nowhere in its function counts.
            bad = (
                []
                if _partner_in_function(gc)
                else [t for t in tests if t.coords != frozenset({"pp"}) and not t.membership]
            )
        else:
            bad = [t for t in tests if splits(t.coords, span)]
        if bad:
            culprits.append((guard, bad))
    if not culprits:
        return None
    condition = " and ".join(guard_text(g, source) for g, _ in culprits)
    first = culprits[0][1][0]
    if p2p:
        reason = (
            f"{gc.collective} runs only where {first.text} holds, and nothing in this function posts the "
            f"matching {P2P_PARTNER.get(gc.collective, 'partner call')}: unless the peer's side is gated "
            f"the same way, one of them waits forever"
        )
    else:
        varying = "every coordinate" if ANY in first.coords else "/".join(sorted(first.coords))
        if gc.source == "known" and ANY not in first.coords:  # name the group of the call it splits
            label = next((k for row in gc.rows for k in row.kinds if splits(first.coords, group_coords(k))), label)
        because = f" ({first.why})" if first.why else ""
        reason = (
            f"{first.text} depends on {varying}{because}, which differs inside the {label} group of "
            f"{gc.collective}; ranks that skip it leave the others waiting in it forever"
        )
        if gc.source == "known":
            reason += f" ({gc.rows[0].function}: {gc.rows[0].why})"
        elif first.why == TRACKER_WHY:
            skip = next((row.skip for row in known_function_rows(gc, filename) if row.skip), None)
            if skip:
                reason += f"; {gc.qualname} {skip}"
    return LintFinding(filename, gc.call.lineno, gc.collective, condition, reason)


def _tests_own_group(test: RankTest, gc: GuardedCall) -> bool:
    """A membership test around a collective on that same group splits nothing: non-members are not in it.
    Known pairs are matched by name; an unresolved explicit group is assumed to be the one tested."""
    group = next((k.value for k in gc.call.keywords if k.arg == "group"), None)
    if group is None or not test.membership:
        return False
    group_call = call_name(group) if isinstance(group, ast.Call) else None
    if test.name in _MEMBERSHIP_TESTS:
        return _MEMBERSHIP_TESTS[test.name] == group_call
    return group_call not in _GROUP_CALL_KINDS


def _partner_in_function(gc: GuardedCall) -> bool:
    partner = P2P_PARTNER.get(gc.collective, gc.collective)
    scope = gc.function if gc.function is not None else gc.call
    return any(isinstance(n, ast.Call) and call_name(n) in (partner, "batch_isend_irecv") for n in ast.walk(scope))


def guard_text(guard: Guard, source: str) -> str:
    test = guard.test
    if guard.negated and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        text = source_text(test.operand, source)
    elif (
        guard.negated
        and isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.In, ast.NotIn))
    ):  # not (a not in b) -> a in b
        word = "in" if isinstance(test.ops[0], ast.NotIn) else "not in"
        text = f"{source_text(test.left, source)} {word} {source_text(test.comparators[0], source)}"
    elif guard.negated:
        text = f"not ({source_text(test, source)})"
    else:
        text = source_text(test, source)
    if guard.kind == "early-exit":
        text += f" [after the early exit at line {guard.line}]"
    return text


def _matched_on_other_branch(gc: GuardedCall, guard: Guard, summaries: dict[str, frozenset[str]]) -> bool:
    """Does the code that runs when the test goes the other way make the same call (or the p2p partner),
    itself or through a function of the same file?"""
    wanted = {gc.collective, P2P_PARTNER.get(gc.collective, gc.collective)}
    for root in guard.alternative:
        for node in ast.walk(root):
            if isinstance(node, ast.Call):
                name = call_name(node)
                if name is not None and (name in wanted or wanted & summaries.get(name, frozenset())):
                    return True
    return False
