"""A single self-contained HTML report: findings first, then a rank grid coloured by call site.

Everything is inline (CSS, JS, data) and a Content-Security-Policy forbids every fetch, so the file
works offline and can be mailed around; the CSS and the script are package data (``report/assets``).
Strings from the report (function names, files, hosts) come from target processes: each is escaped here,
and the script only ever writes them with ``textContent``.
Per-cell markup is a few bytes so that a 16k-rank world still renders; stacks live in one JSON blob,
deduplicated, that the script reads for the cell tooltips and the stack pane (``#rank=N`` opens it).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from functools import cache
from html import escape
from importlib import resources
from typing import Any

from mtpdiag import __version__
from mtpdiag.layout import DEFAULT_ORDER, LayoutError, ParallelLayout
from mtpdiag.model import Frame, Mismatch, RankView, Report
from mtpdiag.report import words
from mtpdiag.report.console import COLUMN, group_letter
from mtpdiag.vocabulary.labels import coords_label
from mtpdiag.vocabulary.states import FROZEN_STATES, Role

# The console's colours (red, cyan, yellow, green, magenta, blue, then their bright twins) as CSS, so a
# group has the same colour in both reports. Past these, hues step by the golden angle.
PALETTE = (
    "#d62728",
    "#17becf",
    "#e5c100",
    "#2ca02c",
    "#c440c4",
    "#1f77b4",
    "#ff7b7b",
    "#7fe3f0",
    "#ffe066",
    "#8ce99a",
    "#f08cf0",
    "#74c0fc",
)
TABLE_MAX_COLUMNS = 16  # above this the grid switches to compact wrapped blocks, one per dp index
TABLE_MAX_CELLS = 512
LIST_LIMIT = 200  # long lists (split collectives, odd ranks) are cut here
MISMATCHES_SHOWN = 8  # split collectives shown open; the rest, up to LIST_LIMIT, folded
VERDICT_CLASS = {"problem": "v-problem", "incomplete": "v-incomplete", "ok": "v-ok"}


def render(report: Report) -> str:
    """The whole report as one HTML document."""
    views = {v.rank: v for v in report.ranks if v.rank is not None}
    group_of = {r: i for i, g in enumerate(report.sites) for r in g.ranks}
    script = asset("report.js")
    csp = f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{_sha256(script)}'"
    parts = [
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name=viewport content="width=device-width, initial-scale=1">',
        f"<title>mtpdiag: {_e(report.verdict)}</title>",
        f"<style>{asset('report.css')}{_group_css(len(report.sites))}</style></head><body>",
        _header(report),
        _findings(report),
        _mismatches(report, views),
        _grid_section(report, group_of),
        _sites_table(report),
        _waits_table(report),
        _evidence_lines(report, "flight_recorder", "Flight Recorder"),
        _evidence_lines(report, "watchdog", "NCCL watchdog timeouts (log)"),
        _odd_ranks(report),
        _notes(report),
        f"<footer>mtpdiag {_e(__version__)}</footer>",
        f'<script type="application/json" id=mtpdiag-data>{_data_json(report)}</script>',
        f"<script>{script}</script>",
        "</body></html>\n",
    ]
    # A lone surrogate (an undecodable byte in a target's file name) must not stop the file being written.
    return "\n".join(p for p in parts if p).encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------- sections


def _header(report: Report) -> str:
    css = VERDICT_CLASS.get(report.verdict, "")
    out = [f'<header><h1 data-testid=verdict class="{css}">{_e(words.headline(report))}</h1>']
    world = f"; world size {report.world_size}" if report.layout else ""
    out.append(f"<p class=dim>{_e(words.layout_line(report) + world)}</p>")
    if report.progress:
        p = report.progress
        out.append(
            f"<p class=dim>progress: {_e(p.samples)} samples every {_e(p.interval_s)} s; "
            f"stalled for {_e(p.stalled_for_s)} s</p>"
        )
    out.append("</header>")
    return "".join(out)


def _findings(report: Report) -> str:
    if not report.findings:
        return ""
    out = ["<section><h2>Findings</h2>"]
    for i, f in enumerate(report.findings):
        first = " first" if i == 0 else ""
        out.append(
            f'<div class="finding{first}" data-testid=finding data-id="{_e(f.id)}">'
            f"<p><code class=fid>{_e(f.id)}</code> <span class=summary>{_e(f.summary)}</span></p>"
            f"<p class=dim>ranks {_e(words.rank_runs(f.ranks))}</p>"
        )
        if f.remedy:
            remedy = f"<code>{_e(f.remedy)}</code>" if f.remedy.startswith("mtpdiag") else _e(f.remedy)
            out.append(f"<p class=remedy>remedy: {remedy}</p>")
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


def _mismatches(report: Report, views: Mapping[int, RankView]) -> str:
    if not report.mismatches:
        return ""
    ordered = sorted(report.mismatches, key=lambda m: m.role != Role.ROOT)  # roots first (a stable sort)

    def item(m: Mismatch) -> str:
        root = m.role == Role.ROOT
        tag = "" if root else "<em>(consequence)</em> "
        return (
            f'<li data-testid=mismatch class="{"root" if root else "consequence"}">'
            f"{tag}{_e(words.mismatch_sentence(m, views, _sizes(report)))}</li>"
        )

    shown, folded = ordered[:MISMATCHES_SHOWN], ordered[MISMATCHES_SHOWN:LIST_LIMIT]
    out = ["<section><h2>Split collectives</h2><ul>"] + [item(m) for m in shown] + ["</ul>"]
    if folded:
        out += [f"<details><summary>{len(folded)} more</summary><ul>"] + [item(m) for m in folded] + ["</ul></details>"]
    if len(ordered) > LIST_LIMIT:
        out.append(
            f"<p class=dim>… and {len(ordered) - LIST_LIMIT} more split collectives, not shown here; "
            f"the --json report lists every one.</p>"
        )
    out.append("</section>")
    return "".join(out)


def _grid_section(report: Report, group_of: Mapping[int, int]) -> str:
    legend = ["<ul class=legend data-testid=legend>"]
    for i, g in enumerate(report.sites):
        legend.append(
            f'<li data-g={i} title="show only group {group_letter(i)}"><i class="sw g{i}"></i>'
            f"<b>{group_letter(i)}</b> {_e(words.op_cell(g.op, g.wait))} at {_e(words.site_label(g.site))}"
            f" <span class=dim>({len(g.ranks)} rank{'s' if len(g.ranks) != 1 else ''})</span></li>"
        )
    legend.append("</ul>")
    cells = _layout_grid(report, group_of)
    fit = " class=fit" if cells is not None and cells.startswith("<div class=tbl") else ""
    title = "Rank grid: rows are pp stages, columns (dp, cp, tp); colour and letter = site group"
    if cells is None:
        cells = _list_grid(report, group_of)
        title = "Ranks (no layout: pass --tp/--cp/--pp for the pp × (dp, cp, tp) grid); colour = site group"
    pane = (
        "<aside id=pane data-testid=stack-pane hidden><button id=pane-close type=button "
        "aria-label=close>×</button><h3 id=pane-title></h3><p id=pane-meta class=dim></p>"
        "<p id=pane-doing></p><ol id=pane-frames data-testid=stack-frames></ol></aside>"
    )
    return (
        f"<section><h2>{_e(title)}</h2>{''.join(legend)}"
        f"<p class=dim>Hover a cell for its stack; click it for the stack pane.</p>"
        f"<div class=gridwrap><div id=grid data-testid=grid{fit}>{cells}</div>{pane}</div></section>"
    )


def _layout_grid(report: Report, group_of: Mapping[int, int]) -> str | None:
    """pp stages × (dp, cp, tp): a labelled table for small worlds, wrapped dp blocks for big ones."""
    index = {v.rank: i for i, v in enumerate(report.ranks) if v.rank is not None and v.coords}
    if not index:
        return None
    coords: dict[int, Mapping[str, int]] = {v.rank: v.coords for v in report.ranks if v.rank is not None and v.coords}
    if report.world_size and len(coords) < report.world_size:
        coords.update({r: c for r, c in _layout_coords(report).items() if r not in coords})
    cell_at = {(c["pp"], (c.get("dp", 0), c.get("cp", 0), c.get("tp", 0))): r for r, c in coords.items()}
    stages = sorted({pp for pp, _ in cell_at})
    columns = sorted({col for _, col in cell_at})

    def cell(stage: int, col: tuple[int, int, int], text: bool) -> str:
        rank = cell_at.get((stage, col))
        if rank is None:
            return "<i class=gap></i>"
        if rank not in index:
            return (
                f'<i data-testid=rank-cell class=miss title="rank {rank}: not captured">'
                f"{'r' + str(rank) if text else ''}</i>"
            )
        return _cell(report.ranks[index[rank]], index[rank], group_of, text)

    if len(columns) <= TABLE_MAX_COLUMNS and len(cell_at) <= TABLE_MAX_CELLS:
        out = [
            f'<div class=tbl style="grid-template-columns:auto repeat({len(columns)},minmax(4.2em,auto))">',
            "<span></span>",
        ]
        out += [
            f"<span class=colh>{coords_label(dict(zip(COLUMN, col, strict=True)), keys=COLUMN, sep='<br>')}</span>"
            for col in columns
        ]
        for stage in stages:
            out.append(f"<span class=rowh>pp{stage}</span>")
            out += [cell(stage, col, True) for col in columns]
        out.append("</div>")
        return "".join(out)
    tp_size = max(col[2] for col in columns) + 1
    blocks: dict[int, list[tuple[int, int, int]]] = {}
    for col in columns:
        blocks.setdefault(col[0], []).append(col)
    out = [f'<div class=blocks style="--tp:{tp_size}">']
    for stage in stages:
        out.append(f"<div class=stage><span class=rowh>pp{stage}</span><div class=wrap>")
        for dp, block in blocks.items():
            out.append(f'<div class=blk title="pp{stage} dp{dp}">')
            out += [cell(stage, col, False) for col in block]
            out.append("</div>")
        out.append("</div></div>")
    out.append("</div>")
    return "".join(out)


def _list_grid(report: Report, group_of: Mapping[int, int]) -> str:
    order = sorted(
        range(len(report.ranks)),
        key=lambda i: (report.ranks[i].rank is None, report.ranks[i].rank or 0, report.ranks[i].pid or 0),
    )
    return "<div class=list>" + "".join(_cell(report.ranks[i], i, group_of, True) for i in order) + "</div>"


def _cell(view: RankView, i: int, group_of: Mapping[int, int], text: bool) -> str:
    group = group_of.get(view.rank) if view.rank is not None else None
    css = f"g{group}" if group is not None else "gx"
    if view.state in FROZEN_STATES:
        css += f" s-{view.state}"
    label = ""
    if text:
        letter = group_letter(group) if group is not None else "?"
        name = f"r{view.rank}" if view.rank is not None else f"pid {view.pid}"
        mark = {"stopped": " T", "gone": " ✗", "unreadable": " ?"}.get(view.state, "")
        label = f"<b>{letter}</b> {_e(name)}{mark}"
    return f'<i data-testid=rank-cell class="{css}" data-i={i}>{label}</i>'


def _sites_table(report: Report) -> str:
    out = [
        "<section><h2>Where each rank waits</h2><table data-testid=sites><thead><tr><th>grp</th>"
        "<th>ranks</th><th>op</th><th>call site</th></tr></thead><tbody>"
    ]
    for i, g in enumerate(report.sites):
        out.append(
            f'<tr><td><i class="sw g{i}"></i><b>{group_letter(i)}</b></td>'
            f"<td>{_e(words.rank_runs(g.ranks))}</td><td>{_e(words.op_cell(g.op, g.wait))}</td>"
            f"<td><code>{_e(words.site_label(g.site))}</code></td></tr>"
        )
    out.append("</tbody></table></section>")
    return "".join(out)


def _waits_table(report: Report) -> str:
    rows = words.wait_rows(report)
    if not rows:
        return ""
    out = [
        "<section><h2>What the ranks outside collectives wait on</h2><table data-testid=waits><thead><tr>"
        "<th>ranks</th><th>wait</th><th>sure</th><th>evidence</th></tr></thead><tbody>"
    ]
    for ranks, kind, sure, evidence in rows:
        out.append(
            f"<tr><td>{_e(words.rank_runs(ranks))}</td><td>{_e(kind.replace('_', ' '))}</td>"
            f"<td>{_e(sure)}</td><td>{_e('; '.join(evidence))}</td></tr>"
        )
    out.append("</tbody></table></section>")
    return "".join(out)


def _evidence_lines(report: Report, key: str, title: str) -> str:
    """A report section of plain lines (the Flight Recorder's account, the watchdog's timeouts)."""
    section = getattr(report, key)
    lines = section.lines if section is not None else ()
    if not lines:
        return ""
    items = "".join(
        f"<li{' class=warn' if line.startswith('disagreement') else ''}>{_e(line)}</li>" for line in lines[:LIST_LIMIT]
    )
    more = f"<li class=dim>… and {len(lines) - LIST_LIMIT} more in the JSON</li>" if len(lines) > LIST_LIMIT else ""
    return f"<section data-testid={key.replace('_', '-')}><h2>{_e(title)}</h2><ul>{items}{more}</ul></section>"


def _odd_ranks(report: Report) -> str:
    odd = [v for v in report.ranks if v.state in FROZEN_STATES]
    if not odd:
        return ""
    out = ["<section><h2>Ranks that could not be read normally</h2><ul>"]
    for v in odd[:LIST_LIMIT]:
        label = words.rank_label(v, v.rank, _sizes(report)) if v.rank is not None else f"pid {v.pid}"
        out.append(f"<li class=warn>{_e(label)} on {_e(v.host)}: {_e(words.doing(v))}</li>")
    if len(odd) > LIST_LIMIT:
        out.append(f"<li class=dim>… and {len(odd) - LIST_LIMIT} more</li>")
    out.append("</ul></section>")
    return "".join(out)


def _notes(report: Report) -> str:
    if not report.notes:
        return ""
    return "<section class=notes>" + "".join(f"<p class=dim>note: {_e(n)}</p>" for n in report.notes) + "</section>"


# ---------------------------------------------------------------- data for the script


def _data_json(report: Report) -> str:
    """Views as ``[rank, label, host, pid, state, doing, stack, site frame index]``.

    Host, state and doing are indices into ``texts``; stack an index into ``stacks``, whose entries are
    indices into ``frames``: ranks of one site group share their stack, so a big world stays small.
    """
    texts: dict[str, int] = {}
    frames: dict[Frame, int] = {}
    stacks: dict[tuple[int, ...], int] = {}

    def text(s: str) -> int:
        return texts.setdefault(s, len(texts))

    def stack(fs: Iterable[Frame]) -> int:
        key = tuple(frames.setdefault(f, len(frames)) for f in fs)
        return stacks.setdefault(key, len(stacks))

    rows = []
    for v in report.ranks:
        label = words.rank_label(v, v.rank, _sizes(report)) if v.rank is not None else f"pid {v.pid}"
        frames_of_v = report.stack_of(v)
        rows.append(
            [
                v.rank,
                label,
                text(v.host),
                v.pid,
                text(v.state),
                text(words.doing(v)),
                stack(frames_of_v),
                _site_index(v, frames_of_v),
            ]
        )
    data: dict[str, Any] = {
        "texts": list(texts),
        "frames": [[f.function, f.file, f.line] for f in frames],
        "stacks": [list(s) for s in stacks],
        "views": rows,
    }
    raw = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    # Inert inside <script>: no "</script>", no "<!--", no entity games.
    return raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# ---------------------------------------------------------------- helpers


def _site_index(view: RankView, stack: Iterable[Frame]) -> int:
    """Where the call site sits in the stack (-1: nowhere), so the pane can mark it."""
    if view.site is None:
        return -1
    site = (view.site.function, view.site.file, view.site.line)
    return next((k for k, f in enumerate(stack) if (f.function, f.file, f.line) == site), -1)


def _sizes(report: Report) -> dict[str, int] | None:
    return report.layout.sizes() if report.layout else None


def _layout_coords(report: Report) -> dict[int, Mapping[str, int]]:
    """Coordinates of every rank of the world, so that ranks missing from the capture show as gaps."""
    layout, world = report.layout, report.world_size
    if not layout or not world:
        return {}
    try:
        sizes = {k: int(getattr(layout, k) or 1) for k in ("tp", "cp", "pp", "ep")}
        # The expert sizes too: without etp, a MoE layout whose etp*ep*pp divides the world but tp*ep*pp does
        # not could not be rebuilt, and the ranks missing from the capture vanished from the grid.
        sizes.update({k: int(v) for k in ("etp", "vpp") if (v := getattr(layout, k)) is not None})
        full = ParallelLayout.for_world(world, order=str(layout.order or DEFAULT_ORDER), **sizes)
        return {r: full.coords(r) for r in range(world)}
    except (LayoutError, TypeError, ValueError):
        return {}


def _group_css(n: int) -> str:
    rules = []
    for i in range(n):
        colour = PALETTE[i] if i < len(PALETTE) else f"hsl({(i * 137.508) % 360:.0f},60%,42%)"
        ink = "#111" if i < len(PALETTE) and _light(PALETTE[i]) else "#fff"
        rules.append(
            f".g{i}{{background-color:{colour};color:{ink}}}"
            f'#grid[data-focus="{i}"] [data-testid=rank-cell]:not(.g{i}){{opacity:.15}}'
        )
    return "".join(rules)


def _light(hex_colour: str) -> bool:
    r, g, b = (int(hex_colour[k : k + 2], 16) for k in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b > 140


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


@cache
def asset(name: str) -> str:
    """A file of ``report/assets`` (package data: the page's CSS and script), as text."""
    return (resources.files("mtpdiag.report") / "assets" / name).read_text(encoding="utf-8")
