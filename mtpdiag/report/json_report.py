"""The ``mtpdiag.report/1`` JSON document (docs/design.md): what automation reads."""

from __future__ import annotations

import json

from mtpdiag.model import Report

# Above this many ranks the JSON is compact: indenting forces Python's pure-Python encoder, which is
# several times slower than the C one (seconds at 16k ranks). Consumers parse it either way.
INDENT_MAX_RANKS = 1024


def render(report: Report) -> str:
    """The report as JSON: indented up to ``INDENT_MAX_RANKS`` ranks, else compact (the same document)."""
    if len(report.ranks) <= INDENT_MAX_RANKS:
        return json.dumps(report.to_dict(), indent=2)
    return json.dumps(report.to_dict(), separators=(",", ":"))
