"""Failed captures and frames that cannot be read: a rank that could not be read, never a healthy one.

The failed captures are real (tests/fixtures/record_pastes.py): py-spy and pystack on a pid that is gone,
on a process strace holds, py-spy as another user, on a process in D state (frozen filesystem, when
recorded as root), and py-spy --native / pystack on the SIGSTOPped rank of the ``frozen`` scenario.
Unparseable dumps are made mechanically from recorded ones (every frame line broken).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.errors import InputError
from mtpdiag.inputs import load_paths, read_inputs
from support import pastes as P

REPO = Path(__file__).resolve().parents[2]
FAILED = P.PASTES / "failed"
FAILED_META = json.loads((FAILED / "meta.json").read_text()) if (FAILED / "meta.json").exists() else {"files": {}}
FAILED_FILES = sorted(FAILED_META["files"])
pytestmark = pytest.mark.skipif(not P.scenarios(), reason="no recorded pastes (run tests/fixtures/record_pastes.py)")
# The tool's own words in its error output: the first of these lines in a file must reach the capture's error.
_TOOL_WORDS = re.compile(r"^(?:Error: (.+)|\U0001F480 (.+?) \U0001F480|(Permission Denied): .*)$", re.MULTILINE)


def _others(tmp_path: Path, scenario: str, but: int) -> list[str]:
    out = []
    for p in P.files(scenario, "pyspy"):
        if P.rank_of(p) != but:
            shutil.copy(p, tmp_path / p.name)
            out.append(str(tmp_path / p.name))
    return out


def _tool_words(text: str) -> str | None:
    m = _TOOL_WORDS.search(text)
    return next((g for g in m.groups() if g), None) if m else None


@pytest.mark.skipif(not FAILED_FILES, reason="no failed captures recorded")
@pytest.mark.parametrize("name", FAILED_FILES)
def test_a_failed_capture_is_its_rank_unreadable_with_the_tools_reason(tmp_path, name):
    """The frozen job's rank 1 replaced by a real failed capture: rank 1 unreadable, the reason in one line."""
    text = (FAILED / name).read_text()
    failed = tmp_path / "rank1.txt"
    failed.write_text(text)
    snapshot = load_paths([*_others(tmp_path, "frozen", 1), str(failed)])
    (rank1,) = [c for c in snapshot.captures if c.rank == 1]
    assert rank1.state == "unreadable" and rank1.threads == () and rank1.source == str(failed)
    assert rank1.error and "\n" not in rank1.error and len(rank1.error) <= 300
    words = _tool_words(text)
    if words is not None:
        assert words.strip() in rank1.error, (words, rank1.error)
    else:  # the tool was killed while it waited: a dump that stops after its header, or nothing at all
        assert FAILED_META["files"][name]["exit_code"] == 124
        assert ("printed no thread" in rank1.error) == bool(text.strip())
        assert ("empty file" in rank1.error) == (not text.strip())
    report = diagnose(P.with_world_size(snapshot, 4), P.layout("frozen"))
    assert report.verdict != "ok"
    (view,) = [v for v in report.ranks if v.rank == 1]
    assert view.state == "unreadable" and view.error == rank1.error


def test_the_recorded_failures_say_what_happened(tmp_path):
    """What each real failure said, as the capture reports it; alone, the failed rank is all there is: that rank,
    unreadable, with the tool's reason (the diagnosis then says what to collect, never a refusal)."""
    expected = {
        "pyspy-gone.txt": ["py-spy: Failed to get process executable name", "No such file or directory"],
        "pystack-gone.txt": ["pystack: Engine error"],
        "pyspy-traced.txt": ["Failed to suspend process", "Operation not permitted"],
        "pystack-traced.txt": ["Operation not permitted"],
        "pyspy-other-user.txt": ["Permission Denied"],
    }
    recorded = [name for name in expected if name in FAILED_META["files"]]
    if not recorded:
        pytest.skip("no failed captures recorded")
    for name in recorded:
        failed = tmp_path / f"rank5-{name}"
        shutil.copy(FAILED / name, failed)
        (capture,) = load_paths([str(failed)]).captures
        assert capture.rank == 5 and capture.state == "unreadable" and not capture.threads
        assert capture.error and "\n" not in capture.error
        for word in expected[name]:
            assert word in capture.error, (name, capture.error)


@pytest.mark.skipif("pyspy-dstate.txt" not in FAILED_META["files"], reason="D-state capture not recorded (needs root)")
def test_a_rank_in_uninterruptible_sleep_reads_as_unreadable_not_missing(tmp_path):
    """py-spy waited on a process frozen in a log write until it was killed: the rank is there, unreadable."""
    failed = tmp_path / "rank1.dump"
    shutil.copy(FAILED / "pyspy-dstate.txt", failed)
    snapshot = load_paths([*_others(tmp_path, "frozen", 1), str(failed)])
    (rank1,) = [c for c in snapshot.captures if c.rank == 1]
    assert rank1.state == "unreadable" and rank1.error


def test_a_failed_native_dump_of_the_stopped_rank_is_that_rank_unreadable():
    """py-spy --native (blocking) on the SIGSTOPped rank failed for real; the other ranks read as usual."""
    meta = P.meta("frozen")
    failed = set(meta.get("failed_captures") or ())
    if not failed:
        pytest.skip("every capture of the stopped rank succeeded")
    for form in ("native", "pystack", "pystack-native"):
        name = f"rank1.{form}.txt"
        snapshot = load_paths(P.names(P.files("frozen", form)))
        by_rank = {c.rank: c for c in snapshot.captures}
        assert sorted(by_rank) == [0, 1, 2, 3]
        if name in failed:
            assert by_rank[1].state == "unreadable" and by_rank[1].error, form
            assert by_rank[1].pid == meta["pids"]["1"] or by_rank[1].pid is None
        assert all(by_rank[r].main_thread.frames for r in (0, 2, 3))


# ---------------------------------------------------------------- frames that cannot be parsed


def _break_frames(text: str, form: str) -> str:
    """Every frame line made unreadable, everything else (headers, prompts) intact."""
    if form in ("pyspy", "locals", "native"):
        return re.sub(r"\)[ \t]*$", "", text, flags=re.MULTILINE)  # "f (file.py:12" has lost its paren
    if form == "faulthandler":
        return text.replace('File "', 'Fiel "')
    return text.replace("(Python) File", "(Python)").replace("(C) File", "(C)")


@pytest.mark.parametrize("form", P.FORMS)
def test_a_file_whose_frames_all_fail_to_parse_is_an_unreadable_rank(tmp_path, form):
    paths = P.files("mtp_cp_pp", form)
    broken = [P.written(tmp_path, p.name, _break_frames(p.read_text(), form)) for p in paths]
    good = P.names(paths)
    snapshot = load_paths([*good[:-1], broken[-1]])
    last = snapshot.captures[-1]
    assert last.rank == P.rank_of(paths[-1]) and last.state == "unreadable" and not last.threads
    assert "no frame could be read" in last.error
    alone = load_paths(broken)  # every rank unreadable: still the job's ranks, none with a stack
    assert alone.captures and all(c.state == "unreadable" and not c.threads for c in alone.captures)


def _mtpdiag(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_the_cli_never_calls_broken_dumps_healthy(tmp_path):
    """Four dumps whose frames cannot be read: incomplete (exit 4), the ranks unreadable and what to collect, with
    one warning line; never 'OK: 4 of 4 ranks captured', never a refusal."""
    paths = P.files("mtp_cp_pp", "pyspy")
    broken = [P.written(tmp_path, p.name, _break_frames(p.read_text(), "pyspy")) for p in paths]
    done = _mtpdiag("analyze", *broken)
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "no rank's stack could be read" in done.stderr and "no frame could be read" in done.stderr
    assert done.stdout.startswith("INCOMPLETE: no stack in the input: none of ranks 0, 1, 2, 3 could be read")
    assert "dump every rank" in done.stdout


@pytest.mark.skipif("pyspy-traced.txt" not in FAILED_META["files"], reason="no failed captures recorded")
def test_the_cli_warns_about_a_failed_rank_and_reports_it(tmp_path):
    failed = tmp_path / "rank1.txt"
    shutil.copy(FAILED / "pyspy-traced.txt", failed)
    done = _mtpdiag("analyze", *_others(tmp_path, "frozen", 1), str(failed), "--world-size", "4", "--json")
    assert done.returncode in (0, 1, 4), done.stderr
    warning = [line for line in done.stderr.splitlines() if line.startswith("mtpdiag: warning:")]
    assert len(warning) == 1 and "rank 1" in warning[0] and "Failed to suspend process" in warning[0]
    report = json.loads(done.stdout)
    assert report["verdict"] != "ok"
    (rank1,) = [r for r in report["ranks"] if r["rank"] == 1]
    assert rank1["state"] == "unreadable" and "Operation not permitted" in rank1["error"]


@pytest.mark.skipif("pyspy-gone.txt" not in FAILED_META["files"], reason="no failed captures recorded")
def test_a_loop_over_pids_pasted_whole_keeps_the_failed_pid(tmp_path):
    """``for p in ...; do py-spy dump --pid $p; done 2>&1``: the dump that failed is a pid that could not be read."""
    meta = P.meta("mtp_cp_pp")
    parts = [f"$ py-spy dump --pid 4242\n{(FAILED / 'pyspy-gone.txt').read_text()}"]
    for p in P.files("mtp_cp_pp", "pyspy"):
        parts.append(f"$ py-spy dump --pid {meta['pids'][str(P.rank_of(p))]}\n{p.read_text()}")
    snapshot = load_paths([P.written(tmp_path, "loop.txt", "\n".join(parts))])
    gone = [c for c in snapshot.captures if c.pid == 4242]
    assert len(gone) == 1 and gone[0].state == "unreadable" and "Failed to get process executable name" in gone[0].error
    assert sorted(c.pid for c in snapshot.captures if c.threads) == sorted(meta["pids"].values())


def test_a_failed_capture_that_names_no_rank_is_a_skipped_input(tmp_path):
    if "pyspy-gone.txt" not in FAILED_META["files"]:
        pytest.skip("no failed captures recorded")
    anonymous = tmp_path / "paste.txt"
    shutil.copy(FAILED / "pyspy-gone.txt", anonymous)
    with pytest.raises(InputError) as exc:
        load_paths([str(anonymous)])
    assert "paste.txt" in str(exc.value) and "--rank-from" in str(exc.value) and "\n" not in str(exc.value)
    inputs = read_inputs([str(anonymous), *P.names(P.files("mtp_cp_pp", "pyspy"))])
    assert len(inputs.snapshot.errors) == 1 and "paste.txt" in inputs.snapshot.errors[0]
