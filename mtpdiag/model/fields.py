"""What every model type shares: the base ``Record`` (a frozen msgspec Struct whose fields *are* its JSON), the
one error a bad document raises (``SchemaError``), and the text guards every reader uses (``printable`` for
text from other processes, ``scrub`` for a whole decoded document, ``decimal`` for env numbers)."""

from __future__ import annotations

from typing import TypeVar, cast

import msgspec


class SchemaError(ValueError):
    """A document that is not a valid mtpdiag bundle or report."""


class Record(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """A frozen Struct whose fields are its JSON keys: msgspec's compiled decoders check a document against
    the type as they build it, and its encoders write the type back. A field left at its default is not
    written (``omit_defaults``); a field that the JSON always carries has no default. The Python value of the
    document is ``msgspec.to_builtins(record)``; there is no ``to_dict``."""


T = TypeVar("T")


def printable(text: str) -> str:
    """``text`` with control, bidi-override and other unprintable characters replaced (whitespace by a space).

    Function names, paths, thread names and errors come from other processes and from files someone handed
    over. Printed raw, an escape sequence could retitle or clear the reader's terminal, and a bidi override
    could reorder what the reader sees.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else " " if ch.isspace() else "\ufffd" for ch in text)


def may_hold_unprintable(data: bytes) -> bool:
    """Whether a JSON document's strings may hold a character ``printable`` would replace.

    JSON forbids raw control characters in strings (the decoder refuses them), so a document that is all
    ASCII, holds no backslash (no ``\\u001b``, ``\\n`` or ``\\u202e`` escape) and no DEL decodes to printable
    strings only. Three scans at memory speed spare the walk over every decoded string.
    """
    return not data.isascii() or b"\\" in data or b"\x7f" in data


def scrub(value: T) -> T:
    """``value`` with ``printable`` applied to every string in it: Structs, tuples, lists and dicts (keys too)
    are rebuilt only where something changed. For documents that ``may_hold_unprintable``."""
    if type(value) is str:
        return cast(T, printable(cast(str, value)))
    if isinstance(value, msgspec.Struct):
        changes = {}
        for name in value.__struct_fields__:
            old = getattr(value, name)
            new = scrub(old)
            if new is not old:
                changes[name] = new
        return msgspec.structs.replace(value, **changes) if changes else value
    if isinstance(value, (tuple, list)):
        items = [scrub(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    if isinstance(value, dict):
        pairs = [(scrub(k), scrub(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)  # type: ignore[return-value]
    return value


def decimal(text: str | None, max_digits: int = 9) -> int | None:
    """The value of an env number such as ``RANK=3``: at most ``max_digits`` ASCII digits, else None.

    ``str.isdigit`` accepts "²" and 5000-digit strings, which ``int()`` then refuses.
    """
    text = (text or "").strip()
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def one_line_error(exc: msgspec.MsgspecError | RecursionError) -> str:
    """msgspec's message for a document that does not fit its type, as the one line an error shows
    (``Expected `int`, got `bool` - at `$.captures[0].threads[0].frames[2].line```)."""
    return printable(" ".join(str(exc).split()))


def decode_error(exc: msgspec.MsgspecError) -> SchemaError:
    return SchemaError(one_line_error(exc))


def replace(obj: T, /, **changes: object) -> T:
    """``obj`` with ``changes``: ``msgspec.structs.replace`` for the model's Structs, ``dataclasses.replace``
    for the dataclasses of the other stages."""
    if isinstance(obj, msgspec.Struct):
        return msgspec.structs.replace(obj, **changes)
    import dataclasses

    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
