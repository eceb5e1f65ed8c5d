"""Static finder of collectives that only some ranks can reach.

A collective hangs when part of its process group skips it. In source code that shows up as a
collective (a ``torch.distributed`` call, or a function known to run one) under a condition that
depends on the rank. The condition is harmless when the coordinate it tests is constant across the
collective's group -- a pipeline-stage test around a DP×CP all_reduce splits nothing, because every
member of a DP×CP group sits on the same stage. This module applies that rule with the group kinds of
``mtpdiag.layout``, and ``mtpdiag check`` reuses its guard analysis for verl's MTP block.

Which functions run a collective, and on which group, comes from the known-site table
(``mtpdiag.analysis.known_sites``): a call is matched by its qualified name
(``MTPLossLoggingHelper.reduce_metrics_in_tracker``), never by its short name alone, and inside a
function of the table a ``group=tracker["avg_group"]`` is the group the table says fills that slot.
A test of whether a metric tracker holds something is a pipeline-stage test: a layer-wise tracker is
filled only by the layers a rank holds, so it is empty on the stages without them (Megatron-LM #4745).

Everything here is pure ``ast`` work except ``lint_paths``, the one edge that reads files.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

from mtpdiag.analysis import known_sites
from mtpdiag.analysis.known_sites import KnownSite
from mtpdiag.errors import InputError
from mtpdiag.layout import GROUP_KINDS
from mtpdiag.vocabulary.ops import GROUP_CALLS, P2P_CALLS, P2P_PARTNER

SCHEMA = "mtpdiag.lint/1"

ANY = "*"  # a coordinate set holding ANY means "every coordinate, or one we cannot name"
EVERY_COORD = frozenset({ANY})

# Calls whose result depends on the calling rank, and the coordinates they test.
_RANK_CALL_COORDS: dict[str, frozenset[str]] = {
    "is_pipeline_last_stage": frozenset({"pp"}),
    "is_pipeline_first_stage": frozenset({"pp"}),
    "get_pipeline_model_parallel_rank": frozenset({"pp"}),
    "get_virtual_pipeline_model_parallel_rank": frozenset({"pp"}),
    "is_rank_in_embedding_group": frozenset({"pp"}),
    "is_rank_in_position_embedding_group": frozenset({"pp"}),
    "is_inside_encoder": frozenset({"pp"}),
    "is_inside_decoder": frozenset({"pp"}),
    "get_tensor_model_parallel_rank": frozenset({"tp"}),
    "get_context_parallel_rank": frozenset({"cp"}),
    "get_data_parallel_rank": frozenset({"dp"}),
    "get_expert_model_parallel_rank": frozenset({"ep"}),
    "get_expert_tensor_parallel_rank": frozenset({"tp"}),
    "get_tensor_and_context_parallel_rank": frozenset({"tp", "cp"}),
    # verl: tp == 0 and last pp stage and cp == 0
    "is_mp_src_rank_with_outputs": frozenset({"tp", "pp", "cp"}),
}
# Group-returning calls (megatron parallel_state) and the coordinates their members differ in.
_GROUP_CALL_KINDS: dict[str, str] = {
    "get_data_parallel_group": "dp",
    "get_context_parallel_group": "cp",
    "get_tensor_model_parallel_group": "tp",
    "get_pipeline_model_parallel_group": "pp",
    "get_model_parallel_group": "mp",
    "get_embedding_group": "pp",
    "get_position_embedding_group": "pp",
    "get_tensor_and_context_parallel_group": "tp_cp",
    "get_tensor_and_data_parallel_group": "tp_dp",
    "get_expert_model_parallel_group": "ep",
}
# "Am I a member of group G?" tests: around a collective on G itself they split nothing.
_MEMBERSHIP_TESTS = {"is_rank_in_embedding_group": "get_embedding_group",
                     "is_rank_in_position_embedding_group": "get_position_embedding_group"}
_MEMBER_CALL = re.compile(r"(^|_)in(_|$)")  # is_rank_in_embedding_group, is_current_rank_in_grid
_STAGE_CALL = re.compile(r"^is_\w*_stage$")
_RANK_WORD = re.compile(r"(^|_)rank(_|$)")
_TRACKER = re.compile(r"(^|_)tracker$")
TRACKER_WHY = ("a metric tracker holds what the layers of this rank's pipeline stage saved, so whether it "
               "is empty depends on the stage")
_RANK_VAR = re.compile(r"^(?:(tp|cp|dp|pp|ep)_|\w+_)?rank$")
_RANK_ENV = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID",
                       "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
_GROUP_TOKENS = {"tp": "tp", "tensor": "tp", "cp": "cp", "context": "cp", "dp": "dp", "data": "dp",
                 "pp": "pp", "pipeline": "pp", "embedding": "pp", "ep": "ep", "expert": "ep"}
# Calls in a condition that say nothing about the rank (used by ``mtpdiag check``).
RANK_FREE_CALLS = frozenset({"len", "isinstance", "getattr", "hasattr", "bool", "callable", "any", "all",
                             "get_world_size", "get_tensor_model_parallel_world_size",
                             "get_context_parallel_world_size", "get_pipeline_model_parallel_world_size",
                             "get_data_parallel_world_size", "get_virtual_pipeline_model_parallel_world_size"})


@dataclass(frozen=True)
class Guard:
    """A condition the code passes (or, when ``negated``, fails) on the way to a call."""

    test: ast.expr
    negated: bool
    kind: str  # "if", "while", "ternary", "early-exit", "short-circuit", "comprehension"
    node: ast.AST  # the if/while/ifexp/boolop that carries the test
    line: int
    alternative: tuple[ast.AST, ...] = ()  # code that runs instead when the test goes the other way


@dataclass(frozen=True)
class GuardedCall:
    """A call that runs a collective, with every condition that leads to it inside its function."""

    call: ast.Call
    collective: str  # torch's op name, or the known function's short name
    source: str  # "torch" or "known"
    guards: tuple[Guard, ...]
    function: ast.AST | None  # innermost enclosing def, or None at module level
    rows: tuple[KnownSite, ...] = ()  # a known call: the table's rows for the function it calls
    qualname: str | None = None  # the enclosing def's qualified name (``Class.method``)


@dataclass(frozen=True)
class RankTest:
    """One piece of a condition that depends on the rank, and the coordinates it tests."""

    text: str
    coords: frozenset[str]
    name: str | None = None  # the called function, when the test is a call
    membership: bool = False  # "is this rank in <some set or group>?"
    why: str | None = None  # why it depends on the rank, when the name does not say


@dataclass(frozen=True)
class LintFinding:
    """A collective that part of its group can skip."""

    file: str
    line: int
    collective: str
    condition: str
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "collective": self.collective,
                "condition": self.condition, "reason": self.reason}


@dataclass(frozen=True)
class LintResult:
    findings: tuple[LintFinding, ...]
    files: int
    skipped: tuple[str, ...]  # "path: why" for files under a directory that could not be parsed

    def to_dict(self) -> dict[str, object]:
        return {"schema": SCHEMA, "findings": [f.to_dict() for f in self.findings]}


# ---------------------------------------------------------------------------------------------- naming

def dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain (calls in the chain are skipped: ``x().y`` -> ``x.y``)."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts))
        else:
            return ".".join(reversed(parts)) if parts else None


def call_name(call: ast.Call) -> str | None:
    """The last name of the callee: ``mpu.get_rank()`` -> ``get_rank``."""
    name = dotted_name(call.func)
    return name.rsplit(".", 1)[-1] if name else None


def import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted origin for every import in the file (any scope: good enough for lint)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".", 1)[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _collective_of(call: ast.Call, aliases: dict[str, str]) -> tuple[str, str, tuple[KnownSite, ...]] | None:
    """(op name, "torch" | "known", the table's rows for a known call) when the call runs a collective."""
    name = dotted_name(call.func)
    if not name:
        return None
    head, _, rest = name.partition(".")
    resolved = aliases.get(head, head) + ("." + rest if rest else "")
    last = resolved.rsplit(".", 1)[-1]  # `from torch.distributed import all_reduce as ar`: ar -> all_reduce
    from_torch = resolved.startswith("torch.distributed.") or (head == "dist" and rest and "." not in rest)
    if from_torch and (last in GROUP_CALLS or last in P2P_CALLS):
        return last, "torch", ()
    rows = known_sites.rows_named(resolved)
    if rows:
        return last, "known", rows
    return None


# ------------------------------------------------------------------------------------------ guard walk

def guarded_calls(tree: ast.AST) -> list[GuardedCall]:
    """Every collective call in the tree with the conditions that lead to it, in source order."""
    walker = _GuardWalker(import_aliases(tree))
    if isinstance(tree, ast.Module):
        walker.block(tree.body, ())
    else:
        walker.node(tree, ())
    return sorted(walker.found, key=lambda g: (g.call.lineno, g.call.col_offset))


def _qualname(scope: tuple[tuple[str, bool], ...]) -> str:
    """``co_qualname``: ``Class.method``, ``outer.<locals>.inner``."""
    parts: list[str] = []
    for name, is_function in scope:
        parts.append(name)
        if is_function:
            parts.append("<locals>")
    return ".".join(parts[:-1] if scope[-1][1] else parts)


def _exits(stmts: list[ast.stmt]) -> bool:
    """True when a statement list always leaves its block (return/raise/continue/break)."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.If):
        return bool(last.orelse) and _exits(last.body) and _exits(last.orelse)
    return False


class _GuardWalker:
    def __init__(self, aliases: dict[str, str]):
        self.aliases = aliases
        self.found: list[GuardedCall] = []
        self.function: ast.AST | None = None
        self.scope: tuple[tuple[str, bool], ...] = ()  # (name, is a function) of the enclosing defs

    def block(self, stmts: list[ast.stmt], guards: tuple[Guard, ...]) -> None:
        active = guards
        for i, stmt in enumerate(stmts):
            if not isinstance(stmt, ast.If):
                self.node(stmt, active)
                continue
            rest = tuple(stmts[i + 1:])
            body_exits, else_exits = _exits(stmt.body), _exits(stmt.orelse)
            self.node(stmt.test, active)
            self.block(stmt.body, active + (Guard(stmt.test, False, "if", stmt, stmt.lineno,
                                                  tuple(stmt.orelse) + (rest if body_exits else ())),))
            self.block(stmt.orelse, active + (Guard(stmt.test, True, "if", stmt, stmt.lineno,
                                                    tuple(stmt.body) + (rest if else_exits else ())),))
            # After `if cond: ...; return`, the rest of the block runs only where cond is false.
            if body_exits and not else_exits:
                active = active + (Guard(stmt.test, True, "early-exit", stmt, stmt.lineno, tuple(stmt.body)),)
            elif else_exits and not body_exits:
                active = active + (Guard(stmt.test, False, "early-exit", stmt, stmt.lineno, tuple(stmt.orelse)),)

    def node(self, node: ast.AST, guards: tuple[Guard, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                self.node(default, guards)
            outer, self.function = self.function, node
            outer_scope = self.scope
            self.scope += (("<lambda>" if isinstance(node, ast.Lambda) else node.name, True),)
            if isinstance(node, ast.Lambda):
                self.node(node.body, ())
            else:
                self.block(node.body, ())
            self.function, self.scope = outer, outer_scope
        elif isinstance(node, ast.ClassDef):
            outer_scope = self.scope
            self.scope += ((node.name, False),)
            self.block(node.body, ())
            self.scope = outer_scope
        elif isinstance(node, ast.If):
            self.block([node], guards)
        elif isinstance(node, ast.While):
            self.node(node.test, guards)
            self.block(node.body, guards + (Guard(node.test, False, "while", node, node.lineno),))
            self.block(node.orelse, guards)
        elif isinstance(node, ast.IfExp):
            self.node(node.test, guards)
            self.node(node.body, guards + (Guard(node.test, False, "ternary", node, node.lineno, (node.orelse,)),))
            self.node(node.orelse, guards + (Guard(node.test, True, "ternary", node, node.lineno, (node.body,)),))
        elif isinstance(node, ast.BoolOp):
            active = guards
            for value in node.values:
                self.node(value, active)
                negated = isinstance(node.op, ast.Or)
                active = active + (Guard(value, negated, "short-circuit", node, value.lineno),)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            active = guards
            for gen in node.generators:
                self.node(gen.iter, active)
                for cond in gen.ifs:
                    self.node(cond, active)
                    active = active + (Guard(cond, False, "comprehension", node, cond.lineno),)
            for part in ((node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)):
                self.node(part, active)
        else:
            if isinstance(node, ast.Call):
                found = _collective_of(node, self.aliases)
                if found:
                    qualname = _qualname(self.scope) if self.function is not None else None
                    self.found.append(GuardedCall(node, found[0], found[1], guards, self.function, found[2],
                                                  qualname))
            for field, value in ast.iter_fields(node):
                if isinstance(value, list):
                    if value and isinstance(value[0], ast.stmt):
                        self.block(value, guards)
                    else:
                        for item in value:
                            if isinstance(item, ast.AST):
                                self.node(item, guards)
                elif isinstance(value, ast.AST):
                    self.node(value, guards)


# --------------------------------------------------------------------------------- rank dependence

def rank_tests(expr: ast.AST, source: str) -> list[RankTest]:
    """The parts of a condition whose value depends on the calling rank."""
    out: list[RankTest] = []
    _collect_rank_tests(expr, source, out)
    return out


def _collect_rank_tests(node: ast.AST, source: str, out: list[RankTest]) -> None:
    if _tests_tracker(node):
        out.append(RankTest(source_text(node, source), frozenset({"pp"}), why=TRACKER_WHY))
        return
    if isinstance(node, ast.Call):
        coords = _rank_call_coords(node)
        if coords is not None:
            name = call_name(node)
            out.append(RankTest(source_text(node, source), coords, name, bool(_MEMBER_CALL.search(name))))
            return
    elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        inner: list[RankTest] = []
        _collect_rank_tests(node.left, source, inner)
        if inner:  # `rank in ranks`: a membership test
            coords = frozenset().union(*(t.coords for t in inner))
            out.append(RankTest(source_text(node, source), coords, None, True))
            for part in node.comparators:
                _collect_rank_tests(part, source, out)
            return
    elif isinstance(node, (ast.Name, ast.Attribute)):
        ident = node.id if isinstance(node, ast.Name) else node.attr
        match = _RANK_VAR.match(ident)
        if match:
            coord = match.group(1)
            out.append(RankTest(source_text(node, source), frozenset({coord}) if coord else EVERY_COORD))
            return
    elif isinstance(node, ast.Subscript) and _is_rank_env(node):
        out.append(RankTest(source_text(node, source), EVERY_COORD))
        return
    for child in ast.iter_child_nodes(node):
        _collect_rank_tests(child, source, out)


def _tests_tracker(node: ast.AST) -> bool:
    """``"values" in tracker``, ``not tracker``, ``len(tracker)``: does a metric tracker hold anything?"""
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return any(_is_tracker(part) for part in node.comparators)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _is_tracker(node.operand)
    if isinstance(node, ast.Call) and call_name(node) == "len" and len(node.args) == 1:
        return _is_tracker(node.args[0])
    return False


def _is_tracker(node: ast.AST) -> bool:
    """``tracker``, ``MTPLossLoggingHelper.tracker``, ``tracker[name]``, ``get_moe_layer_wise_logging_tracker()``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call):
        name = call_name(node)
        return bool(name and name.startswith("get_") and _TRACKER.search(name))
    ident = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return bool(ident and _TRACKER.search(ident))


def _rank_call_coords(call: ast.Call) -> frozenset[str] | None:
    name = call_name(call)
    if not name:
        return None
    if name in _RANK_CALL_COORDS:
        coords = _RANK_CALL_COORDS[name]
        if name == "get_data_parallel_rank" and _keyword_true(call, "with_context_parallel"):
            coords = coords | {"cp"}
        return coords
    if _STAGE_CALL.match(name):
        return frozenset({"pp"})
    if _RANK_WORD.search(name) or name in ("is_main_process", "is_local_main_process"):
        return EVERY_COORD
    if name in ("getenv", "get") and call.args and _is_rank_string(call.args[0]):
        return EVERY_COORD  # os.getenv("RANK"), os.environ.get("LOCAL_RANK")
    return None


def _is_rank_env(node: ast.Subscript) -> bool:
    return _is_rank_string(node.slice)


def _is_rank_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _RANK_ENV


def _keyword_true(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in call.keywords)


def unclassified_calls(expr: ast.AST, source: str) -> list[str]:
    """Calls in a condition that are neither rank tests nor known to be rank-free (check's 'unknown')."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            if _rank_call_coords(node) is not None:
                return
            if call_name(node) not in RANK_FREE_CALLS:
                out.append(source_text(node, source))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr)
    return out


def group_coords(kind: str) -> frozenset[str]:
    """Coordinates that vary inside a group of this kind (``pp+dp_cp`` unions kinds)."""
    coords: set[str] = set()
    for part in kind.split("+"):
        if part == "world" or part not in GROUP_KINDS:
            return EVERY_COORD
        coords.update(GROUP_KINDS[part][1])
    return frozenset(coords)


def splits(test_coords: frozenset[str], span: frozenset[str]) -> bool:
    """Does a test of these coordinates take different values inside a group spanning ``span``?"""
    return ANY in test_coords or ANY in span or bool(test_coords & span)


def kinds_coords(kinds: Iterable[str]) -> frozenset[str]:
    """Coordinates that vary inside any group of these kinds."""
    return frozenset().union(*(group_coords(kind) for kind in kinds))


def known_function_rows(gc: GuardedCall, filename: str | None = None) -> tuple[KnownSite, ...]:
    """The table's rows for the function that makes the call, when the table knows it (by its qualified
    name, in its file; a class-qualified name also in a copy of the file elsewhere)."""
    if gc.qualname is None:
        return ()
    rows = known_sites.rows_defined(gc.qualname, filename)
    if not rows and "." in gc.qualname:
        rows = known_sites.rows_defined(gc.qualname)
    return rows


_TRACKER_SLOTS = frozenset({"avg_group", "reduce_group"})  # what every tracker of megatron-core has


def _tracker_slot(group: ast.AST, rows: tuple[KnownSite, ...]) -> str | None:
    """The tracker slot a group expression reads (``tracker["avg_group"]``, ``entry.reduce_group``)."""
    slots = {c.group for row in rows for c in row.collectives if c.group.isidentifier()} | _TRACKER_SLOTS
    for node in ast.walk(group):
        if isinstance(node, ast.Constant) and node.value in slots:
            return node.value
        if isinstance(node, ast.Attribute) and node.attr in slots:
            return node.attr
        if isinstance(node, ast.Name) and node.id in slots:
            return node.id
    return None


def _collective_group(gc: GuardedCall, source: str, filename: str | None = None) -> tuple[str, frozenset[str]]:
    """(label, coordinates) of the group a collective call runs over."""
    if gc.source == "known":
        kinds = tuple(dict.fromkeys(k for row in gc.rows for k in row.kinds))
        return " and ".join(kinds), kinds_coords(kinds)
    group = next((k.value for k in gc.call.keywords if k.arg == "group"), None)
    if group is None or (isinstance(group, ast.Constant) and group.value is None):
        return "default (world)", EVERY_COORD
    label = source_text(group, source)
    if isinstance(group, ast.Call) and call_name(group) in _GROUP_CALL_KINDS:
        kind = _GROUP_CALL_KINDS[call_name(group)]
        coords = group_coords(kind)
        if _keyword_true(group, "with_context_parallel"):
            coords = coords | {"cp"}
        return label, coords
    rows = known_function_rows(gc, filename)
    slot = _tracker_slot(group, rows) if rows else None
    if slot is not None:
        # The code that saves into the tracker fills the slot; the table says with which group.
        kinds = tuple(dict.fromkeys(k for row in rows for c in row.collectives if c.group == slot for k in c.kinds))
        if not kinds:
            return f"{label} (never set by megatron-core's own callers)", frozenset()
        return f"{label} ({' and '.join(kinds)})", kinds_coords(kinds)
    ident = (dotted_name(group) or "").rsplit(".", 1)[-1].lower()
    tokens = set(ident.split("_"))
    if "dcp" in tokens:
        return label, frozenset({"dp", "cp"})
    if "mp" in tokens:
        return label, group_coords("mp")
    coords = frozenset(_GROUP_TOKENS[t] for t in tokens if t in _GROUP_TOKENS)
    return label, coords or EVERY_COORD


# ------------------------------------------------------------------------------------------ findings

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
    by_node = {}
    for gc in calls:
        by_node.setdefault(id(gc.function), set()).add(gc.collective)
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            direct.setdefault(fn.name, set()).update(by_node.get(id(fn), ()))
            callees.setdefault(fn.name, set()).update(
                call_name(n) for n in ast.walk(fn) if isinstance(n, ast.Call) and call_name(n))
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


def _judge(gc: GuardedCall, source: str, filename: str,
           summaries: dict[str, frozenset[str]] | None = None) -> LintFinding | None:
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
            bad = [] if _partner_in_function(gc) else \
                [t for t in tests if t.coords != frozenset({"pp"}) and not t.membership]
        else:
            bad = [t for t in tests if splits(t.coords, span)]
        if bad:
            culprits.append((guard, bad))
    if not culprits:
        return None
    condition = " and ".join(guard_text(g, source) for g, _ in culprits)
    first = culprits[0][1][0]
    if p2p:
        reason = (f"{gc.collective} runs only where {first.text} holds, and nothing in this function posts the "
                  f"matching {P2P_PARTNER.get(gc.collective, 'partner call')}: unless the peer's side is gated "
                  f"the same way, one of them waits forever")
    else:
        varying = "every coordinate" if ANY in first.coords else "/".join(sorted(first.coords))
        if gc.source == "known" and ANY not in first.coords:  # name the group of the call it splits
            label = next((k for row in gc.rows for k in row.kinds if splits(first.coords, group_coords(k))), label)
        because = f" ({first.why})" if first.why else ""
        reason = (f"{first.text} depends on {varying}{because}, which differs inside the {label} group of "
                  f"{gc.collective}; ranks that skip it leave the others waiting in it forever")
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
    return any(isinstance(n, ast.Call) and call_name(n) in (partner, "batch_isend_irecv")
               for n in ast.walk(scope))


def guard_text(guard: Guard, source: str) -> str:
    test = guard.test
    if guard.negated and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        text = source_text(test.operand, source)
    elif guard.negated and isinstance(test, ast.Compare) and len(test.ops) == 1 and \
            isinstance(test.ops[0], (ast.In, ast.NotIn)):  # not (a not in b) -> a in b
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
                if name in wanted or wanted & summaries.get(name, frozenset()):
                    return True
    return False


def source_text(node: ast.AST, source: str) -> str:
    """The node's source on one line (``ast.get_source_segment``, with the file split into lines once
    rather than on every call: a large file has hundreds of conditions)."""
    lines = _source_lines(source)
    try:
        first, last = node.lineno - 1, node.end_lineno - 1
        if node.end_lineno is None or node.end_col_offset is None or not 0 <= first <= last < len(lines):
            raise ValueError
        head, tail = lines[first].encode(), lines[last].encode()  # offsets count UTF-8 bytes
        if first == last:
            text = head[node.col_offset:node.end_col_offset].decode()
        else:
            text = head[node.col_offset:].decode() + "".join(lines[first + 1:last]) + \
                tail[:node.end_col_offset].decode()
    except (AttributeError, TypeError, ValueError):  # no position (a built node), or a bad one
        text = ast.unparse(node)
    return " ".join(text.split())


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # the line breaks of the tokenizer, as ast uses


@lru_cache(maxsize=4)
def _source_lines(source: str) -> list[str]:
    return _LINE.findall(source)


# ------------------------------------------------------------------------------------- the file edge

def iter_python_files(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[Path, bool]]:
    """(file, named explicitly) for each path; directories are walked for ``*.py``, hidden ones skipped."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                for name in sorted(files):
                    if name.endswith(".py"):
                        yield Path(root) / name, False
        elif path.exists():
            yield path, True
        else:
            raise InputError(f"{path}: no such file or directory")


def lint_paths(paths: Iterable[str | os.PathLike]) -> LintResult:
    """Lint files and directories. A named file that cannot be read or parsed is an InputError; one found
    while walking a directory is skipped and listed in ``skipped``."""
    findings: list[LintFinding] = []
    skipped: list[str] = []
    count = 0
    for path, explicit in iter_python_files(paths):
        try:
            source = path.read_bytes().decode("utf-8")
            findings.extend(lint_source(source, str(path)))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
            why = _why(exc)
            if explicit:
                raise InputError(f"{path}: {why}") from None
            skipped.append(f"{path}: {why}")
            continue
        count += 1
    return LintResult(tuple(findings), count, tuple(skipped))


def _why(exc: Exception) -> str:
    if isinstance(exc, SyntaxError):
        return f"not Python ({exc.msg}, line {exc.lineno})"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
