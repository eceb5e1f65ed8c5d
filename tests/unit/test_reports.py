"""Console and markdown reports of a recorded hang: plain words, and target strings never act as markup."""

from __future__ import annotations

from mtpdiag.analysis import diagnose
from mtpdiag.model import Site, replace
from mtpdiag.report import console, json_report, markdown
from support.captures import load_scenario

HOSTILE = "ring_attention[bold red]X[/]|`<b>"


def _report(renamed: str | None = None):
    snapshot, layout, _ = load_scenario("mtp_cp_pp")
    report = diagnose(snapshot, layout, "flags")
    if renamed is None:
        return report
    sites = tuple(
        replace(g, site=Site(g.site.file, g.site.line, renamed)) if g.op == "all_gather" else g for g in report.sites
    )
    return replace(report, sites=sites)


def test_console_reads_as_a_diagnosis():
    text = " ".join(console.render(_report(), width=200).split())
    assert text.startswith("PROBLEM: MTP loss all_reduce on the DP×CP group [2, 3]")
    assert "absent: rank 3 (tp0 cp1 pp1), which is at all_gather in ring_attention" in text
    assert "(consequence)" in text
    assert "Rank grid" in text and "C r2" in text


def test_console_prints_target_names_verbatim():
    text = console.render(_report(HOSTILE), width=200)
    assert HOSTILE in text


def test_markdown_escapes_table_cells():
    text = markdown.render(_report(HOSTILE))
    row = next(line for line in text.splitlines() if line.startswith("| [1, 3] |"))
    assert row.count(" | ") == 2, row  # the name's | does not add a column
    assert "\\|" in row and "\\`" in row and "&lt;b&gt;" in row


def test_json_is_indented_for_small_worlds_and_compact_for_large():
    report = _report()
    assert json_report.render(report).startswith('{\n  "schema": "mtpdiag.report/2"')
    big = replace(report, ranks=report.ranks * (json_report.INDENT_MAX_RANKS // 4 + 1))
    assert "\n" not in json_report.render(big)
