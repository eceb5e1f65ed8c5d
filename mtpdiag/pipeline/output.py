"""The edge where a report leaves the process: printed to stdout in a format, and the HTML page written to a
file. The renderers (``mtpdiag.report``) only turn a report into text; this module does the I/O."""

from __future__ import annotations

import codecs
import shutil
import sys
from pathlib import Path

from mtpdiag.atomic import shared_mode, write_atomic
from mtpdiag.errors import InputError
from mtpdiag.model import Report
from mtpdiag.report import render


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
    try:
        write_atomic(path, render(report, "html"), mode=shared_mode())
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def terminal_width() -> int:
    """The width the console report is laid out for: the terminal's, kept between 100 and 200 columns."""
    return max(100, min(shutil.get_terminal_size((140, 40)).columns, 200))
