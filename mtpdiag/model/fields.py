"""Checked reading of JSON values: the one place that says what a bad field is (``SchemaError``), and the
two text guards every reader uses (``printable`` for text from other processes, ``decimal`` for env numbers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SchemaError(ValueError):
    """A document that is not a valid mtpdiag bundle or report."""


def printable(text: str) -> str:
    """``text`` with control, bidi-override and other unprintable characters replaced (whitespace by a space).

    Function names, paths, thread names and errors come from other processes and from files someone handed
    over. Printed raw, an escape sequence could retitle or clear the reader's terminal, and a bidi override
    could reorder what the reader sees.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else " " if ch.isspace() else "\ufffd" for ch in text)


def decimal(text: str | None, max_digits: int = 9) -> int | None:
    """The value of an env number such as ``RANK=3``: at most ``max_digits`` ASCII digits, else None.

    ``str.isdigit`` accepts "²" and 5000-digit strings, which ``int()`` then refuses.
    """
    text = (text or "").strip()
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def obj(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SchemaError("expected an object")
    return value


def string(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise SchemaError(f"field {key!r} must be a string")
    return printable(value)


def integer(d: Mapping[str, Any], key: str) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"field {key!r} must be an integer")
    return value


def opt_int(d: Mapping[str, Any], key: str) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"field {key!r} must be an integer or null")
    return value


def opt_bool(d: Mapping[str, Any], key: str) -> bool | None:
    value = d.get(key)
    if value is None or type(value) is bool:
        return value
    raise SchemaError(f"field {key!r} must be true, false or null")


def opt_name(d: Mapping[str, Any], key: str) -> str | None:
    """A short identifier-like word (a system call's name), or None."""
    value = d.get(key)
    if value is None:
        return None
    if type(value) is not str or len(value) > 40 or not value.replace("-", "_").isidentifier():
        raise SchemaError(f"field {key!r} must be a short name or null")
    return value


def opt_rank(d: Mapping[str, Any]) -> int | None:
    rank = opt_int(d, "rank")
    if rank is not None and rank < 0:
        raise SchemaError(f"field 'rank' must not be negative, got {rank}")
    return rank
