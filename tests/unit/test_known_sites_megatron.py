"""The known-site table's metric-tracker rows against the released megatron-core and verl wheels.

For every release a row claims, its function must be defined in its file and issue the stated
collectives, in order, with the stated reduce op, on a group the source spells the stated way and that
traces to the stated kinds: a ``parallel_state`` getter, a local variable assigned from one, or a
tracker slot (``tracker["avg_group"]``) filled by the ``avg_group=`` argument of every call that saves
into the tracker anywhere in the package. A tracker slot no saver fills never runs and is not stated.
For every release a row does not claim, that form must be absent. The source is parsed with ``ast``;
megatron and verl are never imported.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from mtpdiag import lint
from mtpdiag.analysis.known_sites import TRACKER_ROWS, Collective, KnownSite
from mtpdiag.layout import GROUP_KINDS
from support.megatron_wheels import RELEASES, megatron_root
from support.verl_wheels import VERSIONS as VERL_VERSIONS
from support.verl_wheels import verl_root

pytestmark = pytest.mark.verl  # needs real wheels from PyPI (megatron-core and verl)

MEGATRON_ROWS = [row for row in TRACKER_ROWS if row.package == "megatron-core"]
VERL_ROWS = [row for row in TRACKER_ROWS if row.package == "verl"]
# Signatures whose tracker slots are traced to the code that saves into the tracker. The MoE routers
# pass their groups through several calls (router -> attach_and_log -> save), beyond this tracer.
TRACED = {"mtp": "MTPLossLoggingHelper", "dsa-indexer": "DSAIndexerLossLoggingHelper"}
_TOKENS = {
    "tp": "tp",
    "tensor": "tp",
    "dp": "dp",
    "data": "dp",
    "cp": "cp",
    "context": "cp",
    "pp": "pp",
    "pipeline": "pp",
    "ep": "ep",
    "expert": "ep",
}
_GETTERS = {
    "get_pipeline_model_parallel_group": "pp",
    "get_context_parallel_group": "cp",
    "get_tensor_model_parallel_group": "tp",
    "get_tensor_and_context_parallel_group": "tp_cp",
}


# ------------------------------------------------------------------------------------- reading source


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


class _Defs(ast.NodeVisitor):
    """Every def by qualified name, and the innermost def around every call."""

    def __init__(self) -> None:
        self.scope: tuple[tuple[str, bool], ...] = ()
        self.defs: dict[str, ast.FunctionDef] = {}
        self.call_scope: dict[int, tuple[ast.FunctionDef | None, str | None]] = {}
        self.function: ast.FunctionDef | None = None

    def _enter(self, node, is_function: bool) -> None:
        outer, outer_function = self.scope, self.function
        self.scope += ((node.name, is_function),)
        if is_function:
            self.defs[_qualname(self.scope)] = node
            self.function = node
        self.generic_visit(node)
        self.scope, self.function = outer, outer_function

    def visit_ClassDef(self, node):
        self._enter(node, False)

    def visit_FunctionDef(self, node):
        self._enter(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node):
        owner = next((name for name, is_function in reversed(self.scope) if not is_function), None)
        self.call_scope[id(node)] = (self.function, owner)
        self.generic_visit(node)


def _qualname(scope) -> str:
    parts = []
    for name, is_function in scope:
        parts += [name, "<locals>"] if is_function else [name]
    return ".".join(parts[:-1] if scope[-1][1] else parts)


@cache
def defs_of(path: Path) -> _Defs:
    defs = _Defs()
    defs.visit(parsed(path))
    return defs


def function_at(root: Path, row: KnownSite) -> ast.FunctionDef | None:
    path = root / row.file_suffix
    return defs_of(path).defs.get(row.function) if path.is_file() else None


def _literal_count(loop: ast.For) -> int:
    """How many times a ``for`` over a literal list/tuple runs; 1 for any other iterable (per item)."""
    return len(loop.iter.elts) if isinstance(loop.iter, (ast.List, ast.Tuple)) else 1


def source_collectives(fn: ast.FunctionDef) -> list[tuple[str, ast.expr | None, str, int]]:
    """(op, group expression, reduce op, line) of each torch collective the function runs itself, in
    order, a call inside a ``for`` over a literal list repeated once per element."""
    calls = [gc for gc in lint.guarded_calls(fn) if gc.source == "torch" and gc.function is fn]
    parents = {id(child): parent for parent in ast.walk(fn) for child in ast.iter_child_nodes(parent)}
    out = []
    for gc in calls:
        times, node = 1, gc.call
        while id(node) in parents:
            node = parents[id(node)]
            if isinstance(node, ast.For):
                times *= _literal_count(node)
        keywords = {k.arg: k.value for k in gc.call.keywords}
        reduce = (lint.dotted_name(keywords["op"]) or "?").rsplit(".", 1)[-1] if "op" in keywords else "SUM"
        out += [(gc.collective, keywords.get("group"), reduce, gc.call.lineno)] * times
    return out


def spelled_as(group: ast.expr | None, spelling: str) -> bool:
    """Does the group expression spell ``spelling``: a getter call (with those keyword values), or a
    variable / tracker slot of that name?"""
    if group is None:
        return False
    if "(" in spelling:
        want = ast.parse(spelling, mode="eval").body
        return (
            isinstance(group, ast.Call)
            and (lint.dotted_name(group.func) or "").endswith(lint.dotted_name(want.func))
            and all(
                any(k.arg == w.arg and ast.dump(k.value) == ast.dump(w.value) for k in group.keywords)
                for w in want.keywords
            )
        )
    return any(
        (isinstance(n, ast.Constant) and n.value == spelling)
        or (isinstance(n, ast.Attribute) and n.attr == spelling)
        or (isinstance(n, ast.Name) and n.id == spelling)
        for n in ast.walk(group)
    )


def kinds_of_expr(expr: ast.expr | None, fn: ast.FunctionDef | None, depth: int = 0) -> set[str]:
    """Group kinds an expression can evaluate to ("?" when it cannot be told; none for None)."""
    if expr is None or depth > 4 or (isinstance(expr, ast.Constant) and expr.value is None):
        return set()
    if isinstance(expr, ast.IfExp):
        return kinds_of_expr(expr.body, fn, depth + 1) | kinds_of_expr(expr.orelse, fn, depth + 1)
    if isinstance(expr, ast.BoolOp):
        return set().union(*(kinds_of_expr(v, fn, depth + 1) for v in expr.values))
    if isinstance(expr, ast.Call):
        name = lint.call_name(expr)
        if name == "get_data_parallel_group":
            with_cp = any(
                k.arg == "with_context_parallel" and isinstance(k.value, ast.Constant) and k.value.value
                for k in expr.keywords
            )
            return {"dp_cp" if with_cp else "dp"}
        if name in _GETTERS:
            return {_GETTERS[name]}
        if name == "getattr" and len(expr.args) >= 2 and isinstance(expr.args[1], ast.Constant):
            default = expr.args[2] if len(expr.args) > 2 else None
            return _kind_of_name(expr.args[1].value) | kinds_of_expr(default, fn, depth + 1)
        return {"?"}
    if isinstance(expr, ast.Attribute):
        return _kind_of_name(expr.attr)
    if isinstance(expr, ast.Name) and fn is not None:
        values = [
            node.value
            for node in ast.walk(fn)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name) and target.id == expr.id
        ]
        if values:
            return set().union(*(kinds_of_expr(v, fn, depth + 1) for v in values))
        return _kind_of_name(expr.id)
    return {"?"}


def _kind_of_name(name: str) -> set[str]:
    """``tp_cp_group`` -> tp_cp, ``pp`` -> pp, ``dp_cp_gtp_remat`` -> dp_cp."""
    tokens = {_TOKENS[t] for t in name.lower().split("_") if t in _TOKENS}
    kind = "_".join(t for t in ("tp", "dp", "cp", "pp", "ep") if t in tokens)
    return {kind} if kind in GROUP_KINDS else {"?"}


# ----------------------------------------------------------------------------------------- savers


@cache
def saver_calls(root: Path, helper: str) -> tuple[tuple[ast.Call, ast.FunctionDef | None], ...]:
    """Every call of ``helper.save*`` in the package, with the def around it."""
    out = []
    for path in sorted((root / "megatron").rglob("*.py")):
        if helper not in path.read_text(encoding="utf-8"):
            continue
        defs = defs_of(path)
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Call):
                name = lint.dotted_name(node.func) or ""
                head, _, method = name.rpartition(".")
                if head.endswith(helper) and method.startswith(("save", "_save")):
                    out.append((node, defs.call_scope.get(id(node), (None, None))[0]))
    return tuple(out)


def _argument(call: ast.Call, name: str, position: int) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return call.args[position] if len(call.args) > position else None


def slot_kinds(root: Path, helper: str, slot: str) -> set[str]:
    """What the savers of ``helper`` put in a tracker slot (empty: no saver fills it)."""
    kinds: set[str] = set()
    for call, fn in saver_calls(root, helper):
        kinds |= kinds_of_expr(_argument(call, slot, 99), fn)
    return kinds


# -------------------------------------------------------------------------------------------- forms


def form_mismatches(root: Path, row: KnownSite, fn: ast.FunctionDef | None) -> list[str]:
    """Why the source does not have the row's form (empty: it has)."""
    if fn is None:
        return [f"{row.function} is not defined in {row.file_suffix}"]
    wrong = []
    if row.calls and not any(_calls(root, fn, callee, row.function) for callee in row.calls):
        wrong.append(f"{row.function} calls none of {', '.join(row.calls)}")
    helper = TRACED.get(row.signature) if row.package == "megatron-core" else None
    found = source_collectives(fn)
    if helper is not None:  # a slot no saver fills never runs
        found = [c for c in found if not _unfilled_slot(root, helper, c[1])]
    stated = [(c.op, c.reduce) for c in row.collectives]
    if [(op, reduce) for op, _, reduce, _ in found] != stated:
        wrong.append(f"issues {[(op, r) for op, _, r, _ in found]}, not {stated}")
        return wrong
    for collective, (_, group, _, line) in zip(row.collectives, found, strict=True):
        wrong += _group_mismatches(root, row, fn, collective, group, line, helper)
    return wrong


def _calls(root: Path, fn: ast.FunctionDef, callee: str, own: str) -> bool:
    """Does ``fn`` call ``callee``: by its qualified name, through ``self``/``cls`` within its class, or
    through a local bound to what a function annotated to return that class returns
    (``tracker = get_moe_metrics_tracker(); tracker._sync_metrics()``)?"""
    own_class = own.rpartition(".")[0]
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            name = lint.dotted_name(node.func) or ""
            head, _, rest = name.partition(".")
            receiver = own_class if head in ("self", "cls") else _class_of_local(root, fn, head)
            if name == callee or name.endswith("." + callee) or (receiver and f"{receiver}.{rest}" == callee):
                return True
    return False


def _class_of_local(root: Path, fn: ast.FunctionDef, name: str) -> str | None:
    values = [
        node.value
        for node in ast.walk(fn)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id == name
    ]
    factories = {lint.call_name(v) for v in values if isinstance(v, ast.Call)}
    classes = {returns_of(root, f) for f in factories if f}
    return classes.pop() if len(classes) == 1 else None


@cache
def returns_of(root: Path, function: str) -> str | None:
    """The class a module-level function of the package is annotated to return."""
    for path in sorted(root.rglob("*.py")):
        if f"def {function}(" not in path.read_text(encoding="utf-8"):
            continue
        for node in parsed(path).body:
            if isinstance(node, ast.FunctionDef) and node.name == function and node.returns is not None:
                value = node.returns.value if isinstance(node.returns, ast.Constant) else ast.unparse(node.returns)
                return str(value).strip("'\"")
    return None


def _unfilled_slot(root: Path, helper: str, group: ast.expr | None) -> bool:
    slot = next((s for s in ("acceptance_avg_group", "avg_group", "reduce_group") if spelled_as(group, s)), None)
    return slot is not None and not slot_kinds(root, helper, slot)


def _group_mismatches(
    root: Path,
    row: KnownSite,
    fn: ast.FunctionDef,
    collective: Collective,
    group: ast.expr | None,
    line: int,
    helper: str | None,
) -> list[str]:
    where = f"{row.function} line {line}"
    if not spelled_as(group, collective.group):
        return [f"{where}: group {ast.unparse(group) if group is not None else None} is not {collective.group}"]
    if collective.group.isidentifier() and not any(
        isinstance(n, ast.Name) and n.id == collective.group for n in ast.walk(group)
    ):
        if helper is None:
            return []  # a tracker slot of a signature whose savers are not traced
        kinds = slot_kinds(root, helper, collective.group)
        wrong = (
            []
            if kinds == set(collective.kinds)
            else [f"{where}: the savers put {sorted(kinds)} in {collective.group}, not {list(collective.kinds)}"]
        )
        return wrong + _element_mismatches(root, row, collective, helper)
    kinds = kinds_of_expr(group, fn)
    wrong = (
        []
        if kinds == set(collective.kinds)
        else [f"{where}: group {ast.unparse(group)} is {sorted(kinds)}, not {list(collective.kinds)}"]
    )
    return wrong + (_element_mismatches(root, row, collective, helper) if helper else [])


def _element_mismatches(root: Path, row: KnownSite, collective: Collective, helper: str) -> list[str]:
    """``L``: the savers size the tracker by the MTP layer count; ``num_layers``: by the model's layers."""
    if collective.elements not in ("L", "num_layers"):
        return []
    wrong = []
    for call, _ in saver_calls(root, helper):
        size = _argument(call, "num_layers", 2 if "metrics" not in lint.call_name(call) else 4)
        text = ast.unparse(size) if size is not None else ""
        mtp = "mtp_num_layers" in text
        if "num_layers" not in text or mtp != (collective.elements == "L"):
            wrong.append(
                f"{row.function}: a saver at line {call.lineno} sizes the tracker by {text or None}, "
                f"not {collective.elements}"
            )
    return wrong


def skip_mismatches(root: Path, row: KnownSite, fn: ast.FunctionDef) -> list[str]:
    """A row with ``skip`` must show it: its first collective after an early exit on an empty tracker
    (the indexer), or inside a loop over the names in the rank's own tracker (MoE)."""
    calls = [gc for gc in lint.guarded_calls(fn) if gc.source == "torch" and gc.function is fn]
    if not calls:
        return [f"{row.function} runs no collective itself"]
    first = calls[0]
    text = (root / row.file_suffix).read_text(encoding="utf-8")
    on_empty = any(
        g.kind == "early-exit" and any(t.why == lint.TRACKER_WHY for t in lint.rank_tests(g.test, text))
        for g in first.guards
    )
    looped = any(isinstance(n, ast.For) and any(c is first.call for c in ast.walk(n)) for n in ast.walk(fn))
    if row.signature == "dsa-indexer" and not on_empty:
        return [f"{row.function}: no early exit on an empty tracker before line {first.call.lineno}"]
    if row.signature == "moe-aux-loss" and not looped:
        return [f"{row.function}: line {first.call.lineno} is not in a loop over the tracked names"]
    return []


# -------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("minor", sorted(RELEASES))
def test_rows_claiming_a_megatron_release_have_their_form_there(minor):
    root = megatron_root(minor)
    claimed = [row for row in MEGATRON_ROWS if minor in row.versions]
    assert claimed
    for row in claimed:
        fn = function_at(root, row)
        assert form_mismatches(root, row, fn) == [], (minor, row.function, row.versions)
        if row.skip:
            assert skip_mismatches(root, row, fn) == [], (minor, row.function)


@pytest.mark.parametrize("minor", sorted(RELEASES))
def test_rows_not_claiming_a_megatron_release_are_absent_there(minor):
    root = megatron_root(minor)
    for row in MEGATRON_ROWS:
        if minor not in row.versions:
            assert form_mismatches(root, row, function_at(root, row)), (minor, row.function, row.versions)


@pytest.mark.parametrize("version", VERL_VERSIONS)
def test_verl_rows_match_each_release(version):
    root = verl_root(version)
    for row in VERL_ROWS:
        wrong = form_mismatches(root, row, function_at(root, row))
        if version in row.versions:
            assert wrong == [], (version, row.function)
        else:
            assert wrong, (version, row.function, row.versions)


def test_the_table_speaks_of_every_release_tested():
    """Every megatron release a row names (other than the main/dev branches) is one this file tests,
    and the releases the task requires are among them."""
    named = {v for row in MEGATRON_ROWS for v in row.versions} - {"main", "dev"}
    assert named == set(RELEASES)
    assert {"0.13", "0.16", "0.18", "0.19"} <= set(RELEASES)
    assert {v for row in VERL_ROWS for v in row.versions} <= set(VERL_VERSIONS)
