"""Every public watchdog log in ``tests/fixtures/watchdog_logs/`` through the real CLI (``python -m mtpdiag
analyze --log FILE --json``): never refused (exit 2 or 70), never called ``ok``, and read as a careful human
reads it. Each ``<name>.log`` is the text as posted, ``<name>.source.md`` says where it was posted and what was
trimmed, and ``<name>.expected.json`` holds that reading (written from the text, not from mtpdiag's output):
every timed-out work as (global rank, group rank, sequence number, op) with the other fields given for it, the
dump signals, and substrings of the notes the log calls for."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "watchdog_logs"
LOGS = sorted(FIXTURES.glob("*.log"))
EXIT_OF = {"problem": 1, "incomplete": 4}
TIMEOUT_ID = ("rank", "group_rank", "seq", "op")
SIGNAL_ID = ("rank", "signal_rank")


def analyze(log: Path, *args: str) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "analyze", "--log", str(log), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def test_there_are_public_logs_of_every_source():
    """At least one log per form the issue names sits here, each with its source and its expected reading."""
    assert len(LOGS) >= 20
    for log in LOGS:
        source = log.with_suffix(".source.md").read_text(encoding="utf-8")
        assert "- Source: https://github.com/" in source and "## Expected reading" in source, log.name
        assert log.with_suffix(".expected.json").is_file(), log.name


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_a_public_log_is_read_as_a_person_reads_it(log):
    expected = json.loads(log.with_suffix(".expected.json").read_text(encoding="utf-8"))
    code, report, stderr = analyze(log, *expected["args"])
    assert code not in (2, 70), stderr
    assert report["verdict"] != "ok" and report["verdict"] in expected["verdict"], report["verdict"]
    assert code == EXIT_OF[report["verdict"]]
    section = report["watchdog"]
    _same_records(section["timeouts"], expected["timeouts"], TIMEOUT_ID)
    _same_records(section.get("signals", []), expected["signals"], SIGNAL_ID)
    for said in expected["notes"]:
        assert any(said in note for note in report["notes"]), (said, report["notes"])
    assert report["findings"], "a timeout is a hang: a finding says what the log shows and what to collect next"
    if report["verdict"] == "incomplete":
        assert "Flight Recorder" in report["findings"][0]["remedy"]


def _same_records(found: list[dict], expected: list[dict], identity: tuple[str, ...]) -> None:
    """The same records (as a multiset of their identities), each with the values the reading gives."""
    key = lambda record: tuple(record[k] for k in identity)  # noqa: E731
    assert Counter(map(key, found)) == Counter(map(key, expected))
    pool = list(found)
    for want in expected:
        got = next(r for r in pool if key(r) == key(want) and all(r[k] == v for k, v in want.items()))
        pool.remove(got)
