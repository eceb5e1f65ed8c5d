"""The report's output formats, one module each, behind one registry: ``render(report, "json")``.

* ``console``: findings first in plain words, then the split collectives, the site groups and a rank grid;
* ``json_report``: the ``mtpdiag.report/2`` document (docs/design.md), what automation reads;
* ``markdown``: for pasting into an incident ticket;
* ``html``: one self-contained page with the rank grid and every stack (``report/assets``).

A format's module is imported only when it is used: ``--json`` never loads rich. Rendering is pure: printing a
report and writing its page are the pipeline's edge (``pipeline.output``).
"""

from __future__ import annotations

import importlib

import msgspec

from mtpdiag.model import Report
from mtpdiag.vocabulary.states import OutputFormat


class Renderer(msgspec.Struct, frozen=True):
    name: OutputFormat
    module: str  # under mtpdiag.report; its ``render(report) -> str``
    says: str  # what it is for, as ``--format``'s help says it
    terminal: bool = False  # takes the terminal's colour and width (console)


RENDERERS: dict[str, Renderer] = {  # by ``OutputFormat``
    r.name: r
    for r in (
        Renderer(OutputFormat.CONSOLE, "console", "the default", terminal=True),
        Renderer(OutputFormat.JSON, "json_report", "the mtpdiag.report/2 document"),
        Renderer(OutputFormat.MARKDOWN, "markdown", "for an incident ticket"),
        Renderer(OutputFormat.HTML, "html", "one self-contained page"),
    )
}
FORMATS = tuple(RENDERERS)


def render(report: Report, fmt: str, *, color: bool = False, width: int = 120) -> str:
    """The report in format ``fmt`` (one of ``FORMATS``), as the text a command prints."""
    renderer = RENDERERS[fmt]
    module = importlib.import_module(f"mtpdiag.report.{renderer.module}")
    if renderer.terminal:
        printed: str = module.render(report, color=color, width=width)
        return printed
    text: str = module.render(report)
    return text if text.endswith("\n") else text + "\n"
