"""The one edge of ``lint`` that reads files: paths and directories walked for ``*.py``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from mtpdiag.errors import InputError
from mtpdiag.lint.rules import LintFinding, LintResult, lint_source


def iter_python_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[Path, bool]]:
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


def lint_paths(paths: Iterable[str | os.PathLike[str]]) -> LintResult:
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
