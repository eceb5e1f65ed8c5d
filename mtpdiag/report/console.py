"""The console report: findings first in plain words, then split collectives, site groups and a rank grid."""

from __future__ import annotations

import io
from collections.abc import Mapping

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from mtpdiag.model import RankView, Report
from mtpdiag.report import words
from mtpdiag.vocabulary.labels import coords_label
from mtpdiag.vocabulary.states import FROZEN_STATES, Role

PALETTE = (
    "red",
    "cyan",
    "yellow",
    "green",
    "magenta",
    "blue",
    "bright_red",
    "bright_cyan",
    "bright_yellow",
    "bright_green",
    "bright_magenta",
    "bright_blue",
)
GRID_MAX_CELLS = 512  # beyond this the grid is summarised; use --html for big worlds
VERDICT_STYLE = {"problem": "bold red", "incomplete": "bold yellow", "ok": "bold green"}
MAX_LOG_LINES = 20
COLUMN = ("dp", "cp", "tp")  # the coordinates of a grid column, in order


def group_letter(index: int) -> str:
    """A, B, ..., Z, AA, AB, ... for site groups."""
    out = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        out = chr(65 + rem) + out
    return out


def site_groups_by_rank(report: Report) -> dict[int, int]:
    return {r: i for i, g in enumerate(report.sites) for r in g.ranks}


def render(report: Report, color: bool = False, width: int = 120) -> str:
    """Render to a string (ANSI colour codes only when ``color``)."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=color, no_color=not color, width=width, highlight=False, soft_wrap=False)
    print_report(console, report)
    return buf.getvalue()


# One line of the report: a renderable, or None for a blank line.
Line = RenderableType | None


def print_report(console: Console, report: Report) -> None:
    views = {v.rank: v for v in report.ranks if v.rank is not None}
    layout = report.layout.sizes() if report.layout else None
    lines: list[Line] = [
        Text(words.headline(report), style=VERDICT_STYLE.get(report.verdict, "bold")),
        Text(words.layout_line(report), style="dim"),
        *_findings(report),
        *_splits(report, views, layout),
        *_tables(report),
        *_odd_ranks(report, layout),
        *_evidence(report),
    ]
    for line in lines:
        if line is None:
            console.print()
        else:
            console.print(line)


def _findings(report: Report) -> list[Line]:
    if not report.findings:
        return []
    out: list[Line] = [None, Text("Findings", style="bold underline")]
    for f in report.findings:
        line = Text()
        line.append(f"[{f.id}] ", style="bold red" if f is report.findings[0] else "bold")
        line.append(f.summary)
        out.append(line)
        if f.remedy:
            out.append(Text(f"    remedy: {f.remedy}", style="green"))
    return out


def _splits(report: Report, views: Mapping[int, RankView], layout: Mapping[str, int] | None) -> list[Line]:
    """The split collectives, roots first."""
    if not report.mismatches:
        return []
    roots = [m for m in report.mismatches if m.role == Role.ROOT]
    out: list[Line] = [None, Text("Split collectives", style="bold underline")]
    for m in roots + [m for m in report.mismatches if m.role != Role.ROOT]:
        tag = "" if m.role == Role.ROOT else "(consequence) "
        out.append(
            Text(f"- {tag}{words.mismatch_sentence(m, views, layout)}", style="" if m.role == Role.ROOT else "dim")
        )
    return out


def _tables(report: Report) -> list[Line]:
    """The site groups, the waits outside collectives and the rank grid, each after a blank line."""
    tables = [_sites_table(report) if report.sites else None, _waits_table(report), _grid(report)]
    return [line for table in tables if table is not None for line in (None, table)]


def _odd_ranks(report: Report, layout: Mapping[str, int] | None) -> list[Line]:
    odd = [v for v in report.ranks if v.state in FROZEN_STATES]
    if not odd:
        return []
    out: list[Line] = [None, Text("Ranks that could not be read normally", style="bold underline")]
    for v in odd:
        label = words.rank_label(v, v.rank, layout) if v.rank is not None else f"pid {v.pid}"
        out.append(Text(f"- {label} on {v.host}: {words.doing(v)}", style="yellow"))
    return out


def _evidence(report: Report) -> list[Line]:
    """The Flight Recorder's and the watchdog's lines, and the notes."""
    out: list[Line] = []
    fr = report.flight_recorder
    if fr is not None:
        out += [None, Text("Flight Recorder", style="bold underline")]
        out += [Text(said, style="yellow" if said.startswith("disagreement") else "") for said in fr.lines]
    watchdog = report.watchdog
    if watchdog is not None:
        out += [None, Text("NCCL watchdog timeouts (log)", style="bold underline")]
        out += [Text(said) for said in watchdog.lines[:MAX_LOG_LINES]]
        if len(watchdog.lines) > MAX_LOG_LINES:
            out.append(Text(f"… and {len(watchdog.lines) - MAX_LOG_LINES} more in the JSON", style="dim"))
    if report.notes:
        out.append(None)
        out += [Text(f"note: {note}", style="dim") for note in report.notes]
    return out


def _sites_table(report: Report) -> Table:
    table = Table(title="Where each rank waits", title_justify="left", show_lines=False, expand=False)
    table.add_column("grp", no_wrap=True)
    table.add_column("ranks")
    table.add_column("op", no_wrap=True)
    table.add_column("call site")
    for i, g in enumerate(report.sites):
        style = PALETTE[i % len(PALETTE)]
        op = words.op_cell(g.op, g.wait)
        # Text, not str: a str cell is read as rich markup, and names come from the targets.
        table.add_row(
            Text(group_letter(i), style=f"bold {style}"),
            Text(words.rank_runs(g.ranks)),
            Text(op),
            Text(words.site_label(g.site)),
        )
    return table


def _waits_table(report: Report) -> Table | None:
    """What the ranks outside collectives wait on, how sure that is, and the evidence."""
    rows = words.wait_rows(report)
    if not rows:
        return None
    table = Table(title="What the ranks outside collectives wait on", title_justify="left")
    table.add_column("ranks")
    table.add_column("wait", no_wrap=True)
    table.add_column("sure", no_wrap=True)
    table.add_column("evidence")
    for ranks, kind, confidence, evidence in rows:
        table.add_row(
            Text(words.rank_runs(ranks)), Text(kind.replace("_", " ")), Text(confidence), Text("; ".join(evidence))
        )
    return table


def _grid(report: Report) -> Table | Text | None:
    """pp stages × (dp, cp, tp) cells, each showing the rank and coloured by its site group."""
    placed = [(v, v.rank, v.coords) for v in report.ranks if v.rank is not None and v.coords]
    if not report.layout or not placed:
        return None
    if len(placed) > GRID_MAX_CELLS:
        return Text(f"rank grid omitted for {len(placed)} ranks (over {GRID_MAX_CELLS}); use --html", style="dim")
    by_rank = site_groups_by_rank(report)
    columns = sorted({_column_key(coords) for _, _, coords in placed})
    stages = sorted({coords["pp"] for _, _, coords in placed})
    table = Table(title="Rank grid (letter = site group)", title_justify="left")
    table.add_column("", no_wrap=True)
    for col in columns:
        table.add_column(coords_label(dict(zip(COLUMN, col, strict=True)), keys=COLUMN), no_wrap=True, justify="center")
    cells: dict[tuple[int, tuple[int, int, int]], tuple[RankView, int]] = {
        (coords["pp"], _column_key(coords)): (v, rank) for v, rank, coords in placed
    }
    for stage in stages:
        row: list[Text] = [Text(f"pp{stage}", style="bold")]
        for col in columns:
            cell = cells.get((stage, col))
            if cell is None:
                row.append(Text("·", style="dim"))
                continue
            v, rank = cell
            group = by_rank.get(rank)
            letter = group_letter(group) if group is not None else "?"
            style = PALETTE[group % len(PALETTE)] if group is not None else "dim"
            mark = {"stopped": " T", "gone": " ✗", "unreadable": " ?"}.get(v.state, "")
            row.append(Text(f"{letter} r{v.rank}{mark}", style=f"bold {style}"))
        table.add_row(*row)
    return table


def _column_key(coords: Mapping[str, int]) -> tuple[int, int, int]:
    return (coords.get("dp", 0), coords.get("cp", 0), coords.get("tp", 0))
