"""The guard walk: every call that runs a collective, with every condition the code passes on the way to it
inside its function (if/while/ternaries, early exits, short-circuits), and what runs instead."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from mtpdiag.analysis import known_sites
from mtpdiag.analysis.known_sites import KnownSite
from mtpdiag.lint.names import dotted_name, import_aliases
from mtpdiag.vocabulary.ops import GROUP_CALLS, P2P_CALLS


@dataclass(frozen=True)
class Guard:
    """A condition the code passes (or, when ``negated``, fails) on the way to a call."""

    test: ast.expr
    negated: bool
    kind: str  # "if", "while", "ternary", "early-exit", "short-circuit", "comprehension"
    node: ast.AST  # the if/while/ifexp/boolop that carries the test
    line: int
    alternative: tuple[ast.AST, ...] = ()  # code that runs instead when the test goes the other way


Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda  # what a collective call can be inside


@dataclass(frozen=True)
class GuardedCall:
    """A call that runs a collective, with every condition that leads to it inside its function."""

    call: ast.Call
    collective: str  # torch's op name, or the known function's short name
    source: str  # "torch" or "known"
    guards: tuple[Guard, ...]
    function: Scope | None  # innermost enclosing def (or lambda), or None at module level
    rows: tuple[KnownSite, ...] = ()  # a known call: the table's rows for the function it calls
    qualname: str | None = None  # the enclosing def's qualified name (``Class.method``)


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
        self.function: Scope | None = None
        self.scope: tuple[tuple[str, bool], ...] = ()  # (name, is a function) of the enclosing defs

    def block(self, stmts: list[ast.stmt], guards: tuple[Guard, ...]) -> None:
        active = guards
        for i, stmt in enumerate(stmts):
            if not isinstance(stmt, ast.If):
                self.node(stmt, active)
                continue
            rest = tuple(stmts[i + 1 :])
            body_exits, else_exits = _exits(stmt.body), _exits(stmt.orelse)
            self.node(stmt.test, active)
            self.block(
                stmt.body,
                active
                + (
                    Guard(stmt.test, False, "if", stmt, stmt.lineno, tuple(stmt.orelse) + (rest if body_exits else ())),
                ),
            )
            self.block(
                stmt.orelse,
                active
                + (Guard(stmt.test, True, "if", stmt, stmt.lineno, tuple(stmt.body) + (rest if else_exits else ())),),
            )
            # After `if cond: ...; return`, the rest of the block runs only where cond is false.
            if body_exits and not else_exits:
                active = active + (Guard(stmt.test, True, "early-exit", stmt, stmt.lineno, tuple(stmt.body)),)
            elif else_exits and not body_exits:
                active = active + (Guard(stmt.test, False, "early-exit", stmt, stmt.lineno, tuple(stmt.orelse)),)

    def node(self, node: ast.AST, guards: tuple[Guard, ...]) -> None:
        """Walk ``node`` under ``guards``: constructs that make a condition have a reader of their own."""
        for kinds, read in self._READERS:
            if isinstance(node, kinds):
                read(self, node, guards)
                return
        self._other(node, guards)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, guards: tuple[Guard, ...]) -> None:
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

    def _class(self, node: ast.ClassDef, _guards: tuple[Guard, ...]) -> None:
        """A class body starts with no guard: it runs at import, not under the caller's conditions."""
        outer_scope = self.scope
        self.scope += ((node.name, False),)
        self.block(node.body, ())
        self.scope = outer_scope

    def _if(self, node: ast.If, guards: tuple[Guard, ...]) -> None:
        self.block([node], guards)

    def _while(self, node: ast.While, guards: tuple[Guard, ...]) -> None:
        self.node(node.test, guards)
        self.block(node.body, guards + (Guard(node.test, False, "while", node, node.lineno),))
        self.block(node.orelse, guards)

    def _ternary(self, node: ast.IfExp, guards: tuple[Guard, ...]) -> None:
        self.node(node.test, guards)
        self.node(node.body, guards + (Guard(node.test, False, "ternary", node, node.lineno, (node.orelse,)),))
        self.node(node.orelse, guards + (Guard(node.test, True, "ternary", node, node.lineno, (node.body,)),))

    def _short_circuit(self, node: ast.BoolOp, guards: tuple[Guard, ...]) -> None:
        active = guards
        for value in node.values:
            self.node(value, active)
            negated = isinstance(node.op, ast.Or)
            active = active + (Guard(value, negated, "short-circuit", node, value.lineno),)

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, guards: tuple[Guard, ...]
    ) -> None:
        active = guards
        for gen in node.generators:
            self.node(gen.iter, active)
            for cond in gen.ifs:
                self.node(cond, active)
                active = active + (Guard(cond, False, "comprehension", node, cond.lineno),)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            self.node(part, active)

    def _other(self, node: ast.AST, guards: tuple[Guard, ...]) -> None:
        """Any other node: a call may be a collective; its children are walked under the same guards."""
        if isinstance(node, ast.Call):
            found = _collective_of(node, self.aliases)
            if found:
                qualname = _qualname(self.scope) if self.function is not None else None
                self.found.append(GuardedCall(node, found[0], found[1], guards, self.function, found[2], qualname))
        for _field, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.block(value, guards)
                else:
                    for item in value:
                        if isinstance(item, ast.AST):
                            self.node(item, guards)
            elif isinstance(value, ast.AST):
                self.node(value, guards)

    _READERS: tuple[tuple[type | tuple[type, ...], Callable[..., None]], ...] = (
        ((ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda), _function),
        (ast.ClassDef, _class),
        (ast.If, _if),
        (ast.While, _while),
        (ast.IfExp, _ternary),
        (ast.BoolOp, _short_circuit),
        ((ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp), _comprehension),
    )
