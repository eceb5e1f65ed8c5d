"""Rewrite verl's affected MTP block into the fixed form, and put the original back.

The rewrite (pure, libcst, format-preserving) turns verl 0.7.1's

    if self.model_config.mtp.enable and self.is_mp_src_rank_with_outputs():
        metrics = get_megatron_mtp_loss(n_micro_batch)
        <metric write>

into the shape verl 0.8.0 ships (PR #5895):

    if self.model_config.mtp.enable and mpu.is_pipeline_last_stage(ignore_virtual=True):
        metrics = get_megatron_mtp_loss(n_micro_batch)
        if self.is_mp_src_rank_with_outputs():
            <metric write>

Everything else in the file keeps its bytes. The file edge writes atomically (temp file in the same
directory, fsync, ``os.replace``) after saving the original bytes as a backup, so a kill at any moment
leaves either the original or the fixed file. ``MTPDIAG_APPLY_SLOW_WRITE=<seconds>`` pauses between
the temp file and the rename; the tests use it to kill ``apply`` inside that window.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import libcst as cst

from mtpdiag import atomic, lint
from mtpdiag.errors import InputError
from mtpdiag.fix import engine
from mtpdiag.vocabulary.states import CheckStatus

SRC_RANK_TEST = "is_mp_src_rank_with_outputs"
STAGE_TEST = "mpu.is_pipeline_last_stage(ignore_virtual=True)"
MPU_IMPORT = "from megatron.core import parallel_state as mpu\n"
BACKUP_SUFFIX = ".mtpdiag.bak"
TEMP_SUFFIX = ".mtpdiag-tmp"
SLOW_WRITE_ENV = "MTPDIAG_APPLY_SLOW_WRITE"
FIX_COMMENT = (
    "# mtpdiag apply (verl PR #5895): the MTP loss collection all-reduces over the DP x CP group, so",
    "# every rank of the last pipeline stage has to reach it, cp > 0 included; only the rank that",
    "# owns the outputs records the metric.",
)


class UnsupportedShape(InputError):
    """The file is not in a shape mtpdiag can rewrite; it is left untouched (exit 2)."""


@dataclass(frozen=True)
class Rewrite:
    """The outcome of rewriting one engine source (no I/O)."""

    status: str  # the original's status: affected (rewritten), fixed or not-applicable (unchanged)
    original: bytes
    fixed: bytes
    lines: tuple[int, int] | None
    added_import: bool

    @property
    def changed(self) -> bool:
        return self.fixed != self.original


@dataclass(frozen=True)
class ApplyOutcome:
    path: Path
    action: Literal["patched", "would-patch", "already-fixed", "not-applicable"]
    diff: str
    backup: Path | None
    lines: tuple[int, int] | None
    added_import: bool


# ------------------------------------------------------------------------------------------- pure part


def rewrite_engine(data: bytes, name: str = "<engine>") -> Rewrite:
    """Fix the MTP block of an engine's source. Raises UnsupportedShape for unknown or odd shapes."""
    text, tree = engine.parse_source(data, Path(name))
    verdict = engine.classify(text, tree)
    if verdict.status in (CheckStatus.FIXED, CheckStatus.NOT_APPLICABLE):
        return Rewrite(verdict.status, data, data, verdict.lines, False)
    if verdict.status != CheckStatus.AFFECTED or verdict.collection is None or verdict.lines is None:
        raise UnsupportedShape(f"{name}: left unchanged: {verdict.reason}")
    if_node, removed = _rewritable_if(verdict.collection, verdict.lines, text, name)
    needs_import = _mpu_binding(tree, name)
    fixer = _MtpBlockFixer(verdict.collection.collective, removed)
    new_module = cst.parse_module(data).visit(fixer)
    if fixer.done != 1:
        raise UnsupportedShape(
            f"{name}: left unchanged: the MTP block's `if` at line {if_node.lineno} is not "
            f"an indented block mtpdiag can rewrite"
        )
    if needs_import:
        new_module = _with_mpu_import(new_module)
    fixed = new_module.bytes
    after = engine.classify_text(fixed.decode("utf-8"))
    if after.status != CheckStatus.FIXED:  # never write something the checker itself would not call fixed
        raise UnsupportedShape(f"{name}: left unchanged: the rewrite did not produce the fixed shape ({after.reason})")
    return Rewrite("affected", data, fixed, verdict.lines, needs_import)


def _rewritable_if(gc: lint.GuardedCall, lines: tuple[int, int], text: str, name: str) -> tuple[ast.If, list[int]]:
    """The gating ``if`` of the collection ``gc`` (at ``lines``) and which of its ``and``-terms to remove, or
    UnsupportedShape."""

    def refuse(why: str) -> NoReturn:
        raise UnsupportedShape(
            f"{name}: affected (lines {lines[0]}-{lines[1]}) but left "
            f"unchanged: {why}; fix it by hand after {engine.PR}"
        )

    node = gc.guards[0].node if len(gc.guards) == 1 else None
    if not isinstance(node, ast.If) or gc.guards[0].kind != "if" or gc.guards[0].negated:
        refuse("the MTP collection is not gated by exactly one plain `if`")
    if node.orelse:
        refuse("the gating `if` has an else branch")
    first = node.body[0]
    if not isinstance(first, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr)) or not any(
        n is gc.call for n in ast.walk(first)
    ):
        refuse(f"{gc.collective} is not the first statement of the gating `if`")
    terms = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) else [node.test]
    removed = [i for i, t in enumerate(terms) if isinstance(t, ast.Call) and lint.call_name(t) == SRC_RANK_TEST]
    keep = [i for i in range(len(terms)) if i not in removed]
    if not removed:
        refuse(f"the gate does not use {SRC_RANK_TEST}()")
    for i in keep:
        if any(lint.splits(t.coords, engine.DP_CP) for t in lint.rank_tests(terms[i], text)):
            refuse(f"the gate also tests {lint.source_text(terms[i], text)}")
    return node, removed


def _mpu_binding(tree: ast.Module, name: str) -> bool:
    """True when ``mpu`` must be imported; UnsupportedShape when ``mpu`` means something else."""
    good = bad = False
    for node in _module_level(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == "mpu":
                    if node.module == "megatron.core" and alias.name == "parallel_state" and not node.level:
                        good = True
                    else:
                        bad = True
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == "mpu":
                    good, bad = (True, bad) if alias.name == "megatron.core.parallel_state" else (good, True)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == "mpu" for t in targets for n in ast.walk(t)):
                bad = True
    if bad:
        raise UnsupportedShape(
            f"{name}: left unchanged: `mpu` is bound to something other than megatron.core.parallel_state"
        )
    return not good


def _module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Module-level statements, including those inside top-level if/try blocks."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            stack[0:0] = (
                node.body
                + node.orelse
                + getattr(node, "finalbody", [])
                + [s for h in getattr(node, "handlers", []) for s in h.body]
            )


def _flatten_and(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And) and not expr.lpar:
        return _flatten_and(expr.left) + _flatten_and(expr.right)
    return [expr]


def _and_chain(terms: list[cst.BaseExpression]) -> cst.BaseExpression:
    out = terms[0]
    for term in terms[1:]:
        out = cst.BooleanOperation(left=out, operator=cst.And(), right=term)
    return out


def _calls(node: cst.CSTNode, name: str) -> bool:
    """Does the node contain a call of ``name`` (``name(...)`` or ``x.name(...)``)? A walk of its children, not
    ``libcst.matchers``, whose import alone was ~0.3 of the 1.05 CPU-s an ``apply`` cost."""
    if isinstance(node, cst.Call) and _cst_call_name(node) == name:
        return True
    return any(_calls(child, name) for child in node.children)


def _cst_call_name(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute):
            return func.attr.value
        if isinstance(func, cst.Name):
            return func.value
    return None


class _MtpBlockFixer(cst.CSTTransformer):
    """Rewrites the MTP ``if`` of forward_backward_batch: stage gate outside, src-rank gate around the write.

    The target is found by shape (the one ``if`` whose first statement calls the collection and whose
    test has the src-rank terms ``rewrite_engine`` found by AST), not by position: position metadata
    costs more than the whole rest of the rewrite."""

    def __init__(self, collective: str, removed: list[int]):
        super().__init__()
        self.collective = collective
        self.removed = removed
        self.depth = 0  # > 0 inside forward_backward_batch
        self.done = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value == engine.ENGINE_FUNCTION:
            self.depth += 1
            return True
        return self.depth > 0

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value == engine.ENGINE_FUNCTION:
            self.depth -= 1
        return updated

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.BaseStatement:  # noqa: ARG002 - libcst's callback
        if (
            not self.depth
            or not isinstance(updated.body, cst.IndentedBlock)
            or not _calls(updated.body.body[0], self.collective)
        ):
            return updated
        terms = _flatten_and(updated.test.with_changes(lpar=[], rpar=[]))
        if [i for i, t in enumerate(terms) if _cst_call_name(t) == SRC_RANK_TEST] != self.removed:
            return updated
        self.done += 1
        removed = [terms[i].with_changes(lpar=[], rpar=[]) for i in self.removed]
        kept = [t for i, t in enumerate(terms) if i not in self.removed]
        has_stage = any(_cst_call_name(t) == "is_pipeline_last_stage" for t in kept)
        stage = cst.parse_expression(STAGE_TEST).with_changes(
            lpar=terms[self.removed[0]].lpar, rpar=terms[self.removed[0]].rpar
        )
        if len(terms) == 1:
            test = stage.with_changes(lpar=updated.test.lpar, rpar=updated.test.rpar)
        elif len(self.removed) == 1 and not has_stage:  # swap the one term in place: layout kept as it was
            test = updated.test.deep_replace(terms[self.removed[0]], stage)
        else:
            if not has_stage:
                kept.insert(self.removed[0], stage)
            test = _and_chain(kept)
            if len(kept) > 1 and updated.test.lpar:  # keep the parentheses of a wrapped condition
                test = test.with_changes(lpar=updated.test.lpar, rpar=updated.test.rpar)
        body = list(updated.body.body)
        head = body[0]
        if not isinstance(head, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return updated
        first = head.with_changes(
            leading_lines=[
                *head.leading_lines,
                *(cst.EmptyLine(comment=cst.Comment(line)) for line in FIX_COMMENT),
            ]
        )
        new_body = [first]
        if body[1:]:
            new_body.append(cst.If(test=_and_chain(removed), body=cst.IndentedBlock(body=body[1:])))
        return updated.with_changes(test=test, body=updated.body.with_changes(body=new_body))


def _with_mpu_import(module: cst.Module) -> cst.Module:
    """Add the parallel_state import after the module's leading imports."""
    body = list(module.body)
    insert_at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
        ):
            insert_at = i + 1
    if insert_at == 0:  # no imports: after a module docstring, if any
        if (
            body
            and isinstance(body[0], cst.SimpleStatementLine)
            and isinstance(body[0].body[0], cst.Expr)
            and isinstance(body[0].body[0].value, cst.SimpleString)
        ):
            insert_at = 1
    body.insert(insert_at, cst.parse_statement(MPU_IMPORT))
    return module.with_changes(body=body)


def unified_diff(original: bytes, fixed: bytes, path: Path) -> str:
    a = original.decode("utf-8").splitlines(keepends=True)
    b = fixed.decode("utf-8").splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, fromfile=f"{path} (original)", tofile=f"{path} (mtpdiag apply)"))


# ------------------------------------------------------------------------------------------ file edge


def backup_path(path: Path, backup_dir: Path | None = None) -> Path:
    """``FILE.mtpdiag.bak`` beside the file, or ``DIR/<name>.mtpdiag.bak``."""
    path = Path(path)
    name = path.name + BACKUP_SUFFIX
    return (Path(backup_dir) / name) if backup_dir is not None else path.with_name(name)


def apply_fix(path: Path, *, dry_run: bool = False, backup_dir: Path | None = None) -> ApplyOutcome:
    """Rewrite the engine file in place (backup first, atomic replace). Idempotent."""
    path = Path(path)
    original = engine.read_source(path)
    rewrite = rewrite_engine(original, str(path))
    if not rewrite.changed:
        action: Literal["already-fixed", "not-applicable"] = (
            "already-fixed" if rewrite.status == CheckStatus.FIXED else "not-applicable"
        )
        return ApplyOutcome(path, action, "", None, rewrite.lines, False)
    diff = unified_diff(original, rewrite.fixed, path)
    if dry_run:
        return ApplyOutcome(path, "would-patch", diff, None, rewrite.lines, rewrite.added_import)
    pause = _slow_write_pause()
    mode = _writable_mode(path)
    backup = backup_path(path, backup_dir)
    _remove_stale_temps(path)
    try:
        backup.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(backup, original, mode)
    except OSError as exc:
        raise InputError(f"cannot write the backup {backup}: {exc.strerror or exc}; {path} not changed") from None
    try:
        write_atomic(path, rewrite.fixed, mode, pause=pause)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}; not changed") from None
    return ApplyOutcome(path, "patched", diff, backup, rewrite.lines, rewrite.added_import)


def revert_fix(path: Path, *, backup_dir: Path | None = None) -> Path:
    """Put the backed-up original back, byte for byte, and drop the backup. Returns the backup's path.
    Refuses when the file is no longer what ``apply`` made of that backup."""
    path = Path(path)
    backup = backup_path(path, backup_dir)
    if not backup.is_file():
        raise InputError(f"no backup at {backup}: nothing to revert")
    try:
        original = backup.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the backup {backup}: {exc.strerror or exc}") from None
    current = engine.read_source(path)
    if current != original:
        try:
            expected = rewrite_engine(original, str(backup)).fixed
        except InputError:
            expected = None
        if current != expected:
            raise InputError(
                f"{path} has changed since mtpdiag apply saved {backup}; not reverting "
                f"(copy the backup over it by hand if that is what you want)"
            )
        pause = _slow_write_pause()
        mode = _writable_mode(path)
        _remove_stale_temps(path)
        try:
            write_atomic(path, original, mode, pause=pause)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}; not changed") from None
    with contextlib.suppress(OSError):
        backup.unlink()
    return backup


def write_atomic(path: Path, data: bytes, mode: int, *, pause: float = 0.0) -> None:
    """``mtpdiag.atomic.write_atomic``, with the temp name ``_remove_stale_temps`` looks for."""
    atomic.write_atomic(path, data, mode=mode, prefix=f".{path.name}.", suffix=TEMP_SUFFIX, pause=pause)


def _writable_mode(path: Path) -> int:
    """The file's permission bits; InputError when it is read-only (even for root) or its directory is."""
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK):
        raise InputError(f"{path} is read-only; not changed")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise InputError(f"{path.parent} is not writable; {path} not changed")
    return st.st_mode & 0o7777


def _remove_stale_temps(path: Path) -> None:
    """Temp files left by an apply that was killed before its rename."""
    for stale in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _slow_write_pause() -> float:
    raw = os.environ.get(SLOW_WRITE_ENV)
    if not raw:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise InputError(f"{SLOW_WRITE_ENV} must be a number of seconds, got {raw!r}") from None
