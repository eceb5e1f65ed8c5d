"""Bugs found in review (issue #9's list), each pinned by a test that failed on the code before the fix.

The others of that list have their tests where their code is tested: the HTML grid with ``etp``
(test_html_report), frame validation order (test_model), contradictory formats refused before a capture and
``analyze --fr --html`` (test_formats), ``watch --out`` per-hang bundles (test_watch), the e2e marks (tests/conftest.py,
test_conftest).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mtpdiag.analysis.gate import describe_gate
from mtpdiag.report.words import gate_phrase

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", "analyze", *args], capture_output=True, text=True, timeout=120
    )


def test_one_gate_reads_the_same_whatever_order_it_was_built_in():
    """A gate built from the stacks and the same gate built from the Flight Recorder's groups came out in two
    orders in one report."""
    assert describe_gate({"cp": 0, "tp": 0}) == describe_gate({"tp": 0, "cp": 0}) == "tp == 0 and cp == 0"
    assert gate_phrase({"pp": 1, "tp": 0}) == gate_phrase({"tp": 0, "pp": 1})
    assert gate_phrase({"pp": 1, "tp": 0}).endswith("excludes tp > 0 or pp != 1 gates this collective")


def test_frozen_ranks_without_a_layout_are_each_labelled_with_their_own_state(tmp_path):
    """Rank 1 of the recorded ``frozen`` job is SIGSTOPped; rank 3 here is the recorded unreadable rank of
    ``hang_unreadable``. Without a layout, both were once called by the first one's state."""
    bundle = json.loads((CAPTURES / "frozen" / "bundle.json").read_text())
    unreadable = json.loads((CAPTURES / "hang_unreadable" / "bundle.json").read_text())
    (rank3,) = [c for c in unreadable["captures"] if c["rank"] == 3]
    assert rank3["state"] == "unreadable"
    bundle["captures"] = [c for c in bundle["captures"] if c["rank"] != 3] + [rank3]
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(bundle))
    done = _analyze(str(path), "--json")
    assert done.returncode == 1, done.stderr
    frozen = {tuple(f["ranks"]): f["summary"] for f in json.loads(done.stdout)["findings"] if f["id"] == "frozen-rank"}
    assert set(frozen) == {(1,), (3,)}
    assert frozen[(1,)].startswith("rank 1 is stopped")
    assert frozen[(3,)].startswith("rank 3 is unreadable")


def test_a_consequence_split_says_its_ranks_are_stuck_elsewhere_not_that_a_condition_gates_it():
    """The recorded NCCL-behaviour hang: the MTP reduce is the root; the optimizer's collectives that rank 3
    ran on to are consequences, worded as waits, never as gated."""
    scenario = CAPTURES / "nccl_mtp_cp_pp_futex"
    done = _analyze(str(scenario / "bundle.json"), "--cp", "2", "--pp", "2", "--fr", str(scenario / "fr"))
    assert done.returncode == 1, done.stderr
    text = " ".join(done.stdout.split())
    items = [i.strip() for i in text.split("- ")]
    consequences = [i for i in items if i.startswith("(consequence)")]
    roots = [i for i in items if i.startswith("collective ")]
    assert consequences and roots
    assert all("stuck elsewhere" in c and "gates this collective" not in c for c in consequences)
    assert any("gates this collective" in r for r in roots)
