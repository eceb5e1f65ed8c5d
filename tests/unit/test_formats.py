"""``--format console|json|markdown|html`` on inspect, analyze and watch: one renderer registry, ``--json`` and
``--markdown`` as aliases, and contradictory flags refused before any rank is paused or sampled."""

from __future__ import annotations

import json
from html import escape

import pytest

from mtpdiag.report import FORMATS, RENDERERS
from mtpdiag.vocabulary.states import OutputFormat
from support.captures import scenario_dir
from support.jobs_e2e import run_cli_here

BUNDLE = f"{scenario_dir('mtp_cp_pp')}/bundle.json"
NO_SUCH_PID = "999999999"


@pytest.mark.parametrize("alias, fmt", [("--json", "json"), ("--markdown", "markdown")])
def test_the_aliases_print_what_their_format_prints(alias, fmt):
    by_alias = run_cli_here("analyze", BUNDLE, alias)
    by_format = run_cli_here("analyze", BUNDLE, "--format", fmt)
    assert by_alias.returncode == by_format.returncode == 1
    assert by_alias.stdout == by_format.stdout and by_alias.stdout
    assert run_cli_here("analyze", BUNDLE, "--format", fmt, alias).stdout == by_alias.stdout


def test_json_is_the_report_document():
    doc = json.loads(run_cli_here("analyze", BUNDLE, "--format", "json").stdout)
    assert doc["schema"] == "mtpdiag.report/2" and doc["findings"][0]["id"] == "mtp-cp-gated-reduce"


def test_html_on_stdout_is_the_page_html_writes(tmp_path):
    page = tmp_path / "report.html"
    printed = run_cli_here("analyze", BUNDLE, "--format", "html", "--html", str(page))
    assert printed.returncode == 1 and printed.stdout.startswith("<!doctype html>")
    assert printed.stdout == page.read_text(encoding="utf-8")


def test_console_is_the_default():
    assert run_cli_here("analyze", BUNDLE).stdout == run_cli_here("analyze", BUNDLE, "--format", "console").stdout
    assert run_cli_here("analyze", BUNDLE).stdout.startswith("PROBLEM: MTP loss all_reduce")


@pytest.mark.parametrize(
    "command", [["inspect", "--pid", NO_SUCH_PID], ["watch", "--pid", NO_SUCH_PID], ["analyze", BUNDLE]]
)
@pytest.mark.parametrize(
    "flags, says",
    [
        (["--json", "--markdown"], "choose one of --json and --markdown"),
        (["--format", "html", "--json"], "--format html and --json ask for different"),
    ],
)
def test_contradictory_formats_are_refused_before_anything_is_captured(command, flags, says):
    """The pid does not exist: a command that looked at it first would say so instead."""
    done = run_cli_here(*command, *flags)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "does not exist" not in done.stderr and done.stdout == ""


def test_watch_refuses_contradictory_formats_before_checking_where_to_write(tmp_path):
    done = run_cli_here(
        "watch", "--pid", NO_SUCH_PID, "--out", str(tmp_path / "no" / "dir" / "x.json"), "--json", "--markdown"
    )
    assert done.returncode == 2 and "choose one of --json and --markdown" in done.stderr


def test_an_unknown_format_is_a_usage_error():
    done = run_cli_here("analyze", BUNDLE, "--format", "yaml")
    assert done.returncode == 2 and "--format" in done.stderr and "Traceback" not in done.stderr


NCCL = scenario_dir("nccl_mtp_cp_pp_futex")


@pytest.mark.parametrize("fmt", ["console", "json", "markdown", "html"])
def test_every_format_shows_every_optional_section(fmt):
    """The Flight Recorder's account and the watchdog's timeouts reach each renderer (a section a format
    dropped silently was a bug: ``analyze --fr --html``)."""
    done = run_cli_here(
        "analyze",
        f"{NCCL}/bundle.json",
        "--fr",
        f"{NCCL}/fr",
        "--log",
        f"{NCCL}/fr/watchdog.log",
        "--cp",
        "2",
        "--pp",
        "2",
        "--format",
        fmt,
    )
    assert done.returncode == 1, done.stderr
    doc = json.loads(
        run_cli_here(
            "analyze",
            f"{NCCL}/bundle.json",
            "--fr",
            f"{NCCL}/fr",
            "--log",
            f"{NCCL}/fr/watchdog.log",
            "--cp",
            "2",
            "--pp",
            "2",
            "--json",
        ).stdout
    )
    fr_line, log_line = doc["flight_recorder"]["lines"][0], doc["watchdog"]["lines"][0]
    if fmt == "json":
        assert json.loads(done.stdout) == doc
        return
    for line in (fr_line, log_line):
        assert (escape(line[:60]) if fmt == "html" else line[:60]) in done.stdout, (fmt, line)


def test_the_format_choices_are_the_renderer_registrys(monkeypatch):
    """``--format`` offers the registry's renderers, by the vocabulary's names, and its help says each."""
    assert set(RENDERERS) == set(OutputFormat) and all(r.name == name for name, r in RENDERERS.items())
    assert FORMATS == tuple(OutputFormat)
    monkeypatch.setenv("COLUMNS", "400")  # the help on one line each
    shown = run_cli_here("analyze", "--help").stdout
    assert "<" + "|".join(FORMATS) + ">" in shown
    assert all(f"{r.name} ({r.says})" in shown for r in RENDERERS.values())
    assert (
        run_cli_here("analyze", BUNDLE, "--format", "JSON").stdout == run_cli_here("analyze", BUNDLE, "--json").stdout
    )
