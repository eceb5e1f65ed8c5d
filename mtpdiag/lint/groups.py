"""Which coordinates vary inside the group a collective runs on: a rank test of any other coordinate splits
nothing (docs/design.md, "When is a rank-dependent gate harmless?")."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from mtpdiag.analysis import known_sites
from mtpdiag.analysis.known_sites import KnownSite
from mtpdiag.layout import GROUP_KINDS
from mtpdiag.lint.guards import GuardedCall
from mtpdiag.lint.names import call_name, dotted_name, keyword_true, source_text
from mtpdiag.vocabulary.groups import GroupKind

ANY = "*"  # a coordinate set holding ANY means "every coordinate, or one we cannot name"
EVERY_COORD = frozenset({ANY})

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

_GROUP_TOKENS = {
    "tp": "tp",
    "tensor": "tp",
    "cp": "cp",
    "context": "cp",
    "dp": "dp",
    "data": "dp",
    "pp": "pp",
    "pipeline": "pp",
    "embedding": "pp",
    "ep": "ep",
    "expert": "ep",
}


def group_coords(kind: str) -> frozenset[str]:
    """Coordinates that vary inside a group of this kind (``pp+dp_cp`` unions kinds)."""
    coords: set[str] = set()
    for part in kind.split("+"):
        if part == GroupKind.WORLD or part not in GROUP_KINDS:
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
    if isinstance(group, ast.Call) and (called := call_name(group)) in _GROUP_CALL_KINDS:
        kind = _GROUP_CALL_KINDS[called]
        coords = group_coords(kind)
        if keyword_true(group, "with_context_parallel"):
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
