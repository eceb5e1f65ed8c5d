"""A markdown report for pasting into an incident ticket."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mtpdiag.model import RankView, Report
from mtpdiag.report import words
from mtpdiag.vocabulary.groups import COORDINATES
from mtpdiag.vocabulary.labels import coords_label, rank_list
from mtpdiag.vocabulary.states import Role


def render(report: Report) -> str:
    views = {v.rank: v for v in report.ranks if v.rank is not None}
    layout = report.layout.sizes() if report.layout else None
    out = [
        *_heading(report, layout),
        *_findings(report),
        *_splits(report, views, layout),
        *_sites(report),
        *_waits(report),
        *_ranks_table(report, layout),
        *_evidence(report),
    ]
    return "\n".join(out) + "\n"


def _heading(report: Report, layout: Mapping[str, int] | None) -> list[str]:
    out = [f"## mtpdiag: {report.verdict}", "", f"**{words.headline(report)}**", ""]
    if layout:
        sizes = ", ".join(f"{k}={layout[k]}" for k in COORDINATES if k in layout)
        source = f" (from {report.layout_source})" if report.layout_source else ""
        out += [f"Layout: {sizes}{source}. World size: {report.world_size}.", ""]
    elif report.layout_source:  # sizes that were found and dropped, and why
        out += [f"Layout: unknown ({report.layout_source}).", ""]
    return out


def _findings(report: Report) -> list[str]:
    if not report.findings:
        return []
    out = ["### Findings", ""]
    for f in report.findings:
        out.append(f"- **`{f.id}`** ranks {_ranks(f.ranks)}: {f.summary}")
        if f.remedy:
            out.append(f"  - remedy: `{f.remedy}`" if f.remedy.startswith("mtpdiag") else f"  - remedy: {f.remedy}")
    return [*out, ""]


def _splits(report: Report, views: Mapping[int, RankView], layout: Mapping[str, int] | None) -> list[str]:
    if not report.mismatches:
        return []
    out = ["### Split collectives", ""]
    for m in report.mismatches:
        tag = "" if m.role == Role.ROOT else "*(consequence)* "
        out.append(f"- {tag}{words.mismatch_sentence(m, views, layout)}")
    return [*out, ""]


def _sites(report: Report) -> list[str]:
    out = ["### Where each rank waits", "", "| ranks | op | call site |", "|---|---|---|"]
    for g in report.sites:
        out.append(f"| {_ranks(g.ranks)} | {words.op_cell(g.op, g.wait)} | {_cell(words.site_label(g.site))} |")
    return [*out, ""]


def _waits(report: Report) -> list[str]:
    rows = words.wait_rows(report)
    if not rows:
        return []
    out = [
        "### What the ranks outside collectives wait on",
        "",
        "| ranks | wait | sure | evidence |",
        "|---|---|---|---|",
    ]
    for ranks, kind, sure, evidence in rows:
        out.append(f"| {_ranks(ranks)} | {kind} | {sure} | {_cell('; '.join(evidence))} |")
    return [*out, ""]


def _ranks_table(report: Report, layout: Mapping[str, int] | None) -> list[str]:
    out = ["### Ranks", "", "| rank | host | pid | coords | state | doing |", "|---|---|---|---|---|---|"]
    for v in report.ranks:
        out.append(
            f"| {v.rank if v.rank is not None else '?'} | {_cell(v.host)} | {v.pid or ''} | "
            f"{coords_label(v.coords, layout)} | {v.state} | {_cell(words.doing(v))} |"
        )
    return out


def _evidence(report: Report) -> list[str]:
    """The Flight Recorder's and the watchdog's lines, and the notes."""
    out: list[str] = []
    if report.flight_recorder is not None:
        out += ["", "### Flight Recorder", ""] + [f"- {_cell(line)}" for line in report.flight_recorder.lines]
    if report.watchdog is not None:
        out += ["", "### NCCL watchdog timeouts (log)", ""] + [f"- {_cell(line)}" for line in report.watchdog.lines]
    if report.notes:
        out += ["", "### Notes", ""] + [f"- {n}" for n in report.notes]
    return out


def _cell(text: str) -> str:
    """A table cell: names come from the targets, so ``|``, backticks and HTML must not act as markup."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`").replace("<", "&lt;").replace(">", "&gt;")


def _ranks(ranks: Iterable[int]) -> str:
    ranks = list(ranks)
    return f"[{rank_list(ranks, 16)}]" + (f" ({len(ranks)} ranks)" if len(ranks) > 16 else "")
