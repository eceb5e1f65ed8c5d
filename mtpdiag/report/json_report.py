"""The ``mtpdiag.report/1`` JSON document (docs/design.md): what automation reads."""

from __future__ import annotations

import json

from mtpdiag.model import Report


def render(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)
