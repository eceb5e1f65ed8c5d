"""The report's output formats, one module each, behind one registry: ``render(report, "json")``.

* ``console``: findings first in plain words, then the split collectives, the site groups and a rank grid;
* ``json_report``: the ``mtpdiag.report/2`` document (docs/design.md), what automation reads;
* ``markdown``: for pasting into an incident ticket;
* ``html``: one self-contained page with the rank grid and every stack (``report/assets``).

A format's module is imported only when it is used: ``--json`` never loads rich.
"""

from __future__ import annotations

import codecs
import importlib
import shutil
import sys
from pathlib import Path

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


def emit(report: Report, fmt: str = "console", html: Path | None = None) -> None:
    """Print the report to stdout in ``fmt``, and also write the HTML page to ``html`` when asked."""
    if html is not None:
        write_page(report, html)
    buffer = getattr(sys.stdout, "buffer", None)
    if fmt == "json" and buffer is not None and codecs.lookup(sys.stdout.encoding or "ascii").name == "utf-8":
        from mtpdiag.report import json_report

        sys.stdout.flush()
        buffer.write(json_report.document(report))
        buffer.flush()
        return
    sys.stdout.write(render(report, fmt, color=sys.stdout.isatty(), width=terminal_width()))
    sys.stdout.flush()


def write_page(report: Report, path: Path) -> None:
    """The HTML report as a file (atomically, readable by all: a report is for sharing)."""
    from mtpdiag.atomic import shared_mode, write_atomic
    from mtpdiag.errors import InputError

    try:
        write_atomic(path, render(report, "html"), mode=shared_mode())
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def terminal_width() -> int:
    return max(100, min(shutil.get_terminal_size((140, 40)).columns, 200))
