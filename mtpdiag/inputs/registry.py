"""The readers, in the order they are asked: the first whose ``sniff`` accepts a file reads it.

JSON first (told apart by its first bytes and read from the bytes by msgspec: the 16k-rank path), then the
text forms from the most to the least distinctive header: pystack's ``Traceback for thread``,
faulthandler's ``(most recent call first)``, py-spy's ``Thread N (idle)``; then a tool's error output;
bare frame lines; last, log lines tagged with ranks and no stack (each rank unreadable: "no stack"). Every
reader takes the file's text; the JSON readers take its bytes as well. The other readers are imported with the
first file that is not a bundle: ``analyze`` of bundles never loads them.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from mtpdiag.errors import InputError
from mtpdiag.inputs import bundle
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import decoded, json_start

# Modules under mtpdiag.inputs, each with its READER, in the order they are asked.
ORDER = ("bundle", "pyspy_json", "pystack", "faulthandler", "pyspy_text", "failed", "snippet", "ranklog")


@lru_cache(maxsize=1)
def readers() -> tuple[Reader, ...]:
    return tuple(importlib.import_module(f"mtpdiag.inputs.{name}").READER for name in ORDER)


def __getattr__(name: str) -> object:
    if name == "READERS":
        return readers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_file(raw: bytes, path: str, context: ReadContext) -> FileCaptures:
    """The captures of one file's bytes: JSON straight from the bytes, anything else from its text."""
    start = json_start(raw)
    if start == "{":
        return bundle.read(raw, path, context)
    if start == "[":  # py-spy's JSON, imported with the first one (and the rules of ranks in file names with it)
        from mtpdiag.inputs import pyspy_json

        return pyspy_json.read(raw, path, context)
    return read_text(decoded(raw, path), path, context)


def read_text(text: str, path: str, context: ReadContext) -> FileCaptures:
    """The captures of one file's text, read by the first reader that recognises it (colour codes do not
    count: what a terminal coloured is read as what the person saw)."""
    from mtpdiag.inputs.lines import without_escapes

    text = without_escapes(text)
    for reader in readers():
        if reader.sniff(text, path):
            return reader.read(text, path, context)
    raise InputError(
        f"{path}: not a py-spy dump, nor a bundle, faulthandler or pystack output, a tool's error, "
        'or frame lines such as "f (file.py:12)"'
    )
