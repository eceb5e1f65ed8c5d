"""Names and source text of the AST: dotted names, a call's callee, the file's import aliases, and a node's
source on one line."""

from __future__ import annotations

import ast
import re
from functools import lru_cache


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


def keyword_true(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)


def source_text(node: ast.AST, source: str) -> str:
    """The node's source on one line (``ast.get_source_segment``, with the file split into lines once
    rather than on every call: a large file has hundreds of conditions)."""
    lines = _source_lines(source)
    # Only expressions and statements have positions, and a node built in code may lack them.
    lineno, end_lineno = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    col, end_col = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
    try:
        if lineno is None or end_lineno is None or col is None or end_col is None:
            raise ValueError
        first, last = lineno - 1, end_lineno - 1
        if not 0 <= first <= last < len(lines):
            raise ValueError
        head, tail = lines[first].encode(), lines[last].encode()  # offsets count UTF-8 bytes
        if first == last:
            text = head[col:end_col].decode()
        else:
            text = head[col:].decode() + "".join(lines[first + 1 : last]) + tail[:end_col].decode()
    except (AttributeError, TypeError, ValueError):  # no position (a built node), or a bad one
        text = ast.unparse(node)
    return " ".join(text.split())


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # the line breaks of the tokenizer, as ast uses


@lru_cache(maxsize=4)
def _source_lines(source: str) -> list[str]:
    return _LINE.findall(source)
