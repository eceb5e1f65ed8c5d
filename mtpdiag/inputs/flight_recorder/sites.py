"""Where an op was issued: its Python stack from the dump, named the way the stack analysis names sites.

torch records each entry's stack with the code objects' plain names (``reduce_loss_in_tracker``), while
py-spy, and so every ``Site`` mtpdiag reports, shows qualified names
(``MTPLossLoggingHelper.reduce_loss_in_tracker``). ``SourceIndex`` recovers the qualified name from the
source file when it can be read here: the job's own path, or the same package under this interpreter's
site-packages. It keeps the plain name unless the innermost definition around that line has exactly that
name, so another version of a package cannot rename a frame. Reading is the loader's business; the
functions here that take a ``qualify`` callable stay pure.
"""

from __future__ import annotations

import ast
import os
import stat
import sys
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from mtpdiag.model import Site
from mtpdiag.vocabulary.stacks import call_site_frame, display_path

Qualify = Callable[[str, int, str], str]  # (path as recorded, line, plain name) -> qualified name
MAX_SOURCE_BYTES = 8 * 1024 * 1024


def plain(_path: str, _line: int, name: str) -> str:
    """The ``Qualify`` that reads nothing."""
    return name


def stack_of(frames: Any, qualify: Qualify = plain) -> tuple[Site, ...]:
    """The dump's ``frames`` (dicts of name, filename, line; innermost first) as display ``Site``s.

    C++ frames (``TORCH_FR_CPP_STACK=1``) are dropped: they are never a call site.
    """
    out = []
    for f in frames or ():
        if not isinstance(f, dict):
            raise TypeError("a frame is not a dict")
        filename, name, line = f.get("filename"), f.get("name"), f.get("line")
        if not isinstance(filename, str) or not isinstance(name, str):
            raise TypeError("a frame's filename and name must be strings")
        if isinstance(line, bool) or not isinstance(line, int):
            raise TypeError("a frame's line must be an integer")
        if not _is_python(filename):
            continue
        out.append(Site(file=display_path(filename), line=line, function=qualify(filename, line, name)))
    return tuple(out)


def call_site(stack: tuple[Site, ...]) -> Site | None:
    """The first frame outside torch and decorator plumbing, exactly as ``classify`` picks a stack's site."""
    return call_site_frame(stack)


def _is_python(filename: str) -> bool:
    return filename.endswith(".py") or (filename.startswith("<") and filename.endswith(">"))


class SourceIndex:
    """Qualified names of functions, read from source files once each (the loader's I/O).

    ``roots`` are the directories a site-packages-relative path is looked up under when the recorded
    absolute path is not readable here (default: this interpreter's site-packages).
    """

    def __init__(self, roots: Iterable[str] | None = None) -> None:
        self.roots = tuple(roots) if roots is not None else _site_packages()
        self._defs: dict[str, tuple[tuple[int, int, str, str], ...]] = {}

    def qualify(self, path: str, line: int, name: str) -> str:
        if name.startswith("<") and name != "<lambda>" and not name.endswith("comp>") and name != "<genexpr>":
            return name  # <module>, <string>: nothing to qualify
        defs = self._definitions(path)
        best = None
        for start, end, def_name, qualname in defs:
            if start <= line <= end and (best is None or start >= best[0]):
                best = (start, def_name, qualname)
        if best is None:
            return name
        _, def_name, qualname = best
        if def_name == name:
            return qualname
        if name.startswith("<"):  # a lambda or comprehension inside the innermost def
            return f"{qualname}.<locals>.{name}"
        return name

    def _definitions(self, path: str) -> tuple[tuple[int, int, str, str], ...]:
        if path not in self._defs:
            source = self._read(path)
            self._defs[path] = _definitions(source) if source is not None else ()
        return self._defs[path]

    def _read(self, path: str) -> str | None:
        candidates = [path]
        rel = display_path(path)
        if rel != path:
            candidates += [os.path.join(root, rel) for root in self.roots]
        for candidate in candidates:
            text = _read_regular_file(candidate)
            if text is not None:
                return text
        return None


def _site_packages() -> tuple[str, ...]:
    return tuple(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))


def _read_regular_file(path: str) -> str | None:
    """The text of a regular ``.py`` file of bounded size, or None. Never blocks on a FIFO or device."""
    if not path.endswith(".py") or not os.path.isabs(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_SOURCE_BYTES + 1).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


@lru_cache(maxsize=256)
def _definitions(source: str) -> tuple[tuple[int, int, str, str], ...]:
    """(first line, last line, name, qualified name) of every function in ``source``, as CPython names them."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    out: list[tuple[int, int, str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out.append((first, child.end_lineno or child.lineno, child.name, qualname))
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    try:
        visit(tree, "")
    except RecursionError:
        return ()
    return tuple(out)
