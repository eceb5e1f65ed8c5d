"""Find verl's Megatron engine and tell whether its MTP-loss block has the context-parallel deadlock.

verl 0.7.1 collects the multi-token-prediction loss in ``forward_backward_batch`` only where
``is_mp_src_rank_with_outputs()`` holds (tp 0, last pp stage, cp 0). The collection ends in an
all_reduce over the DP×CP group, which the cp > 0 ranks never enter: training hangs (verl PR #5895).
verl 0.8.0 gates the collection on the last pipeline stage, a test every member of a DP×CP group
agrees on, and keeps the src-rank test only around the metric write.

The verdict comes from the source alone (``ast``): verl is never imported.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mtpdiag import lint
from mtpdiag.analysis import known_sites
from mtpdiag.errors import InputError
from mtpdiag.model import Record
from mtpdiag.vocabulary.states import CheckStatus, EngineGate

ENGINE_PARTS = tuple((known_sites.engine_row().file_suffix or "").split("/"))
ENGINE_FUNCTION = known_sites.engine_row().short_name
# Calls that collect the MTP loss, each ending in the DP×CP all_reduce: verl's get_megatron_mtp_loss and
# megatron's MTPLossLoggingHelper (track_mtp_metrics, reduce_loss_in_tracker, reduce_metrics_in_tracker),
# matched by qualified name from the known-site table (never the DeepSeek indexer's reduce_loss_in_tracker).
MTP_COLLECTIONS = frozenset(known_sites.collection_rows("mtp"))
DP_CP = lint.group_coords("dp_cp")
PR = "verl PR #5895"

CHECK_SCHEMA = "mtpdiag.check/1"
Status = CheckStatus
Gate = EngineGate
# The gate an engine of each status uses: the buggy one where it is affected, the fixed one where it is fixed.
GATE_OF: dict[CheckStatus, EngineGate] = {CheckStatus.AFFECTED: EngineGate.BUGGY, CheckStatus.FIXED: EngineGate.FIXED}


class EngineCheck(Record, frozen=True, kw_only=True, omit_defaults=False, tag_field="schema", tag=CHECK_SCHEMA):
    """The verdict on one engine file (``mtpdiag.check/1``): the file, verl's version beside it (None when
    unknown), the status, the first and last line of the MTP-loss block (None when there is none), and why."""

    path: str
    verl_version: str | None
    status: Status
    lines: tuple[int, int] | None
    reason: str

    @property
    def gate(self) -> Gate | None:
        """The gate the engine uses: buggy (affected), fixed (fixed), or None."""
        return GATE_OF.get(self.status)


@dataclass(frozen=True)
class Verdict:
    """What the source says, before any file or version is attached."""

    status: Status
    lines: tuple[int, int] | None
    reason: str
    gate: Gate | None = None
    collection: lint.GuardedCall | None = None
    block: ast.stmt | None = None


def check_text(result: EngineCheck, explicit_path: bool) -> str:
    """A few plain lines: what was checked, the verdict, and the next step."""
    version = f"verl {result.verl_version}" if result.verl_version else "verl (version unknown)"
    where = f" (lines {result.lines[0]}-{result.lines[1]})" if result.lines else ""
    headline = {
        CheckStatus.AFFECTED: "AFFECTED: the MTP loss collection deadlocks with context parallelism",
        CheckStatus.FIXED: "fixed: the MTP loss collection is safe with context parallelism",
        CheckStatus.NOT_APPLICABLE: "not applicable: no MTP loss collection to fix",
        CheckStatus.UNKNOWN: "unknown: mtpdiag does not recognise this engine's MTP block",
    }[result.status]
    lines = [f"{version}: {result.path}", f"{headline}{where}", f"  {result.reason}"]
    if result.status == CheckStatus.AFFECTED:
        flag = f" --path {shlex.quote(result.path)}" if explicit_path else ""
        lines.append(f"next step: mtpdiag apply{flag}   (preview with --dry-run; undo with --revert)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ locating verl


def installed_verl_dirs() -> list[Path]:
    """Where ``import verl`` would look, without running verl (a top-level find_spec imports nothing)."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin).parent] if spec.origin else []


def locate_engine() -> Path | None:
    """The installed verl's Megatron engine file; None when verl is installed without one.
    Raises InputError when verl is not installed."""
    dirs = installed_verl_dirs()
    if not dirs:
        raise InputError("verl is not installed in this Python; pass --path to verl's " + "/".join(ENGINE_PARTS))
    for d in dirs:
        candidate = d.joinpath(*ENGINE_PARTS[1:])
        if candidate.is_file():
            return candidate
    return None


def verl_version(engine: Path) -> str | None:
    """verl's version from the dist-info beside the ``verl`` package (installed or an unpacked wheel),
    else from the installed distribution when the file belongs to it."""
    engine = Path(engine).absolute()
    if engine.parts[-len(ENGINE_PARTS) :] != ENGINE_PARTS:
        return None
    root = engine.parents[len(ENGINE_PARTS) - 1]
    for dist in importlib.metadata.distributions(name="verl", path=[str(root)]):
        return dist.version
    installed = [d.resolve() for d in installed_verl_dirs()]
    if engine.parents[len(ENGINE_PARTS) - 2].resolve() in installed:
        try:
            return importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            return None
    return None


def read_source(path: Path) -> bytes:
    """The file's bytes; an InputError (one line) when it cannot be read."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a Python file")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse_source(data: bytes, path: Path) -> tuple[str, ast.Module]:
    """Decoded text and its AST; an InputError when the file is not Python."""
    try:
        text = data.decode("utf-8")
        return text, ast.parse(text, filename=str(path))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a Python file (not UTF-8 text)") from None
    except (SyntaxError, ValueError) as exc:
        lineno = getattr(exc, "lineno", None)
        where = f", line {lineno}" if lineno else ""
        raise InputError(f"{path}: not a Python file ({getattr(exc, 'msg', exc)}{where})") from None


# ------------------------------------------------------------------------------------ classification


def check_engine(path: Path) -> EngineCheck:
    """Classify an engine file. Raises InputError when it is missing, unreadable or not Python."""
    path = Path(path)
    text, tree = parse_source(read_source(path), path)
    verdict = classify(text, tree)
    return EngineCheck(
        path=str(path),
        verl_version=verl_version(path),
        status=verdict.status,
        lines=verdict.lines,
        reason=verdict.reason,
    )


def classify_text(text: str) -> Verdict:
    """``classify`` for source text (SyntaxError when it is not Python)."""
    return classify(text, ast.parse(text))


def classify(text: str, tree: ast.Module) -> Verdict:
    """Find the MTP-loss collection in forward_backward_batch and judge the condition that gates it."""
    functions = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == ENGINE_FUNCTION
    ]
    collections = [gc for gc in lint.guarded_calls(tree) if is_mtp_collection(gc)]
    inside = [gc for gc in collections if gc.function in functions]
    if not functions:
        if collections:
            first = collections[0]
            return Verdict(
                CheckStatus.UNKNOWN,
                None,
                f"no {ENGINE_FUNCTION}, but the MTP loss is collected at line "
                f"{first.call.lineno}; not a layout mtpdiag knows",
            )
        return Verdict(CheckStatus.UNKNOWN, None, f"no {ENGINE_FUNCTION} in this file: is it verl's Megatron engine?")
    if not inside:
        nested = [gc for gc in collections if gc.function is not None and _within(gc.call, functions)]
        if nested or collections:
            where = (nested or collections)[0].call.lineno
            return Verdict(
                CheckStatus.UNKNOWN,
                None,
                f"the MTP loss is collected at line {where}, outside the body of "
                f"{ENGINE_FUNCTION}; not a layout mtpdiag knows",
            )
        return Verdict(
            CheckStatus.NOT_APPLICABLE,
            None,
            f"{ENGINE_FUNCTION} collects no MTP loss, so the MTP/CP deadlock of {PR} cannot happen here",
        )
    if len(inside) > 1:
        lines = ", ".join(str(gc.call.lineno) for gc in inside)
        return Verdict(
            CheckStatus.UNKNOWN,
            None,
            f"{ENGINE_FUNCTION} collects the MTP loss {len(inside)} times (lines "
            f"{lines}); mtpdiag knows the single-collection layout",
        )
    return _judge_collection(inside[0], text)


def is_mtp_collection(gc: lint.GuardedCall) -> bool:
    """Does the call collect the MTP loss (a row of the table's MTP collection)?"""
    return any(row in MTP_COLLECTIONS for row in gc.rows)


def _within(node: ast.expr, functions: Sequence[ast.FunctionDef | ast.AsyncFunctionDef]) -> bool:
    return any(f.lineno <= node.lineno <= (f.end_lineno or f.lineno) for f in functions)


def _judge_collection(gc: lint.GuardedCall, text: str) -> Verdict:
    block = _block_of(gc)
    lines = (block.lineno, block.end_lineno or block.lineno)
    name = gc.collective
    splitting: list[tuple[lint.Guard, lint.RankTest]] = []
    unclear: list[str] = []
    stage_only: list[str] = []
    for guard in gc.guards:
        tests = lint.rank_tests(guard.test, text)
        splitting += [(guard, t) for t in tests if lint.splits(t.coords, DP_CP)]
        stage_only += [t.text for t in tests if not lint.splits(t.coords, DP_CP)]
        unclear += lint.unclassified_calls(guard.test, text)
    if splitting:
        guard, test = splitting[0]
        cond = lint.guard_text(guard, text)
        return Verdict(
            CheckStatus.AFFECTED,
            lines,
            f"{name} (an all_reduce over DP×CP) runs only where `{cond}` holds, and {test.text} "
            f"is false on some ranks of that group (e.g. cp > 0): they never join and training "
            f"hangs with context parallelism ({PR})",
            gate=EngineGate.BUGGY,
            collection=gc,
            block=block,
        )
    if unclear:
        return Verdict(
            CheckStatus.UNKNOWN,
            lines,
            f"{name} is gated by {unclear[0]}, which mtpdiag cannot classify as rank-free or rank-dependent",
            collection=gc,
            block=block,
        )
    if stage_only:
        reason = (
            f"{name} runs on every rank of the DP×CP group that reaches it: its gate tests only "
            f"{', '.join(dict.fromkeys(stage_only))}, which all members of that group share"
        )
    else:
        reason = f"{name} runs on every rank that reaches it (no rank-dependent gate)"
    return Verdict(CheckStatus.FIXED, lines, reason, gate=EngineGate.FIXED, collection=gc, block=block)


def _block_of(gc: lint.GuardedCall) -> ast.stmt:
    """The outermost statement of the function body that holds the collection."""
    function = gc.function
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise AssertionError("a collection judged inside the engine function is inside a def")
    for stmt in function.body:
        if stmt.lineno <= gc.call.lineno <= (stmt.end_lineno or stmt.lineno):
            if any(node is gc.call for node in ast.walk(stmt)):
                return stmt
    raise AssertionError("a collection inside the function is in one of its statements")
