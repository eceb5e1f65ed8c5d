"""Rank tests: the parts of a condition that depend on the calling rank, and the coordinates each one tests."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from mtpdiag.lint.groups import EVERY_COORD
from mtpdiag.lint.names import call_name, keyword_true, source_text

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

# "Am I a member of group G?" tests: around a collective on G itself they split nothing.
_MEMBERSHIP_TESTS = {
    "is_rank_in_embedding_group": "get_embedding_group",
    "is_rank_in_position_embedding_group": "get_position_embedding_group",
}
_MEMBER_CALL = re.compile(r"(^|_)in(_|$)")  # is_rank_in_embedding_group, is_current_rank_in_grid
_STAGE_CALL = re.compile(r"^is_\w*_stage$")
_RANK_WORD = re.compile(r"(^|_)rank(_|$)")
_TRACKER = re.compile(r"(^|_)tracker$")
TRACKER_WHY = (
    "a metric tracker holds what the layers of this rank's pipeline stage saved, so whether it "
    "is empty depends on the stage"
)
_RANK_VAR = re.compile(r"^(?:(tp|cp|dp|pp|ep)_|\w+_)?rank$")
_RANK_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}
)

# Calls in a condition that say nothing about the rank (used by ``mtpdiag check``).
RANK_FREE_CALLS = frozenset(
    {
        "len",
        "isinstance",
        "getattr",
        "hasattr",
        "bool",
        "callable",
        "any",
        "all",
        "get_world_size",
        "get_tensor_model_parallel_world_size",
        "get_context_parallel_world_size",
        "get_pipeline_model_parallel_world_size",
        "get_data_parallel_world_size",
        "get_virtual_pipeline_model_parallel_world_size",
    }
)


@dataclass(frozen=True)
class RankTest:
    """One piece of a condition that depends on the rank, and the coordinates it tests."""

    text: str
    coords: frozenset[str]
    name: str | None = None  # the called function, when the test is a call
    membership: bool = False  # "is this rank in <some set or group>?"
    why: str | None = None  # why it depends on the rank, when the name does not say


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
            out.append(RankTest(source_text(node, source), coords, name, bool(_MEMBER_CALL.search(name or ""))))
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
        if name == "get_data_parallel_rank" and keyword_true(call, "with_context_parallel"):
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
