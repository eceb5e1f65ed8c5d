"""The ``mtpdiag.report/2`` JSON document (docs/design.md): what automation reads.

The document is the ``Report`` type, encoded by msgspec: each distinct stack once in ``stacks``, each rank
naming its own by index.
"""

from __future__ import annotations

import msgspec

from mtpdiag.model import Report
from mtpdiag.model.fields import scrub

# Above this many ranks the JSON is compact: one line that a person does not read, a third smaller.
INDENT_MAX_RANKS = 1024
_ENCODER = msgspec.json.Encoder()


def encode(report: Report) -> bytes:
    """The report as compact JSON bytes (UTF-8)."""
    try:
        return _ENCODER.encode(report)
    except UnicodeEncodeError:  # a lone surrogate (a file name that is not UTF-8) in some text
        return _ENCODER.encode(scrub(report))


def render(report: Report) -> str:
    """The report as JSON: indented up to ``INDENT_MAX_RANKS`` ranks, else compact (the same document)."""
    text = encode(report).decode()
    return msgspec.json.format(text, indent=2) if len(report.ranks) <= INDENT_MAX_RANKS else text


def document(report: Report) -> bytes | bytearray:
    """What ``--json`` prints, as UTF-8 bytes: ``render``'s text and a newline, never decoded into a str and
    encoded back (13 MB at 16k ranks: 30 ms of 50), and the compact form encoded into a buffer that takes the
    newline without a copy."""
    if len(report.ranks) <= INDENT_MAX_RANKS:
        return msgspec.json.format(encode(report), indent=2) + b"\n"
    data = bytearray()
    try:
        _ENCODER.encode_into(report, data)
    except UnicodeEncodeError:  # a lone surrogate (a file name that is not UTF-8) in some text
        _ENCODER.encode_into(scrub(report), data)
    data += b"\n"
    return data
