"""The readers, in the order they are asked: the first whose ``sniff`` accepts a file reads it.

JSON first (cheap to tell apart, and the 16k-rank path), then the text forms from the most to the
least distinctive header: pystack's ``Traceback for thread``, faulthandler's ``(most recent call
first)``, py-spy's ``Thread N (idle)``; then a tool's error output; last, bare frame lines.
"""

from __future__ import annotations

from mtpdiag.errors import InputError
from mtpdiag.inputs import bundle, failed, faulthandler, pystack, pyspy_json, pyspy_text, snippet
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.lines import without_escapes

READERS: tuple[Reader, ...] = (
    bundle.READER,
    pyspy_json.READER,
    pystack.READER,
    faulthandler.READER,
    pyspy_text.READER,
    failed.READER,
    snippet.READER,
)


def read_text(text: str, path: str, context: ReadContext) -> FileCaptures:
    """The captures of one file's text, read by the first reader that recognises it (colour codes do not
    count: valid JSON never holds a raw escape, so this costs the JSON forms nothing)."""
    text = without_escapes(text)
    for reader in READERS:
        if reader.sniff(text, path):
            return reader.read(text, path, context)
    raise InputError(f"{path}: not a py-spy dump, nor a bundle, faulthandler or pystack output, a tool's error, "
                     "or frame lines such as \"f (file.py:12)\"")
