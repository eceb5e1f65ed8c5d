"""The accuracy benchmark of public incidents (benchmarks/accuracy/): mtpdiag never calls a posted hang ok,
never refuses one (outside the baseline's known failures of parts other branches are changing), and every
case the committed baseline records as right is still right.

The scorer runs ``python -m mtpdiag analyze ... --json`` on each incident as a subprocess (its own rules are
checked on hand-made reports below, which are report dicts, not captures). The baseline only grows:
``score.py --write-baseline`` refuses to drop a right case unless told which (``--drop ID``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCORE = ROOT / "benchmarks" / "accuracy" / "score.py"


def _scorer():
    spec = importlib.util.spec_from_file_location("accuracy_score", SCORE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["accuracy_score"] = module
    spec.loader.exec_module(module)
    return module


S = _scorer()


@pytest.fixture(scope="module")
def scored():
    return S.score_all(S.incidents(), sys.executable, jobs=2)


def test_there_are_at_least_thirty_incidents_each_with_provenance_and_an_expectation():
    found = S.incidents()
    assert len(found) >= 30
    for incident in found:
        assert incident.id == incident.meta["id"], incident.path
        assert incident.meta["source"]["url"].startswith("https://github.com/"), incident.id
        assert incident.meta["source"]["reconstructed"], incident.id
        assert incident.meta["root_cause"]["summary"], incident.id
        assert incident.expected["verdict"] in ("problem", "incomplete"), incident.id
        assert incident.expected.get("reading"), incident.id
        inputs = [a for a in incident.args if not a.startswith("-") and (incident.path / a).is_file()]
        assert inputs, f"{incident.id}: args name no file of the incident"


def test_no_incident_is_called_ok_or_refused_outside_the_known_failures(scored):
    baseline = S.read_baseline()
    assert S.unanswered(scored, baseline) == []
    assert not [i.id for i, s in scored if s.result == "called ok"]  # never, known failure or not
    unknown = set(baseline.get("known_failures", {})) - {i.id for i, _ in scored}
    assert not unknown, f"known failures that are not incidents: {sorted(unknown)}"


def test_every_case_the_baseline_records_as_right_is_still_right(scored):
    baseline = S.read_baseline()
    assert baseline["right"], "the committed baseline records no right case"
    assert S.downgrades(scored, baseline) == []


def test_the_baseline_is_never_written_with_a_downgrade(tmp_path, monkeypatch, scored):
    monkeypatch.setattr(S, "BASELINE", tmp_path / "baseline.json")
    right = next(i for i, s in scored if s.result == "right")
    (tmp_path / "baseline.json").write_text(json.dumps({"right": [right.id], "known_failures": {}}))
    worse = [(i, s._replace(result="partly") if i.id == right.id else s) for i, s in scored]
    assert S.write_baseline(worse, drop=()) == [right.id]
    assert json.loads((tmp_path / "baseline.json").read_text())["right"] == [right.id]
    assert S.write_baseline(worse, drop=(right.id,)) == []
    assert right.id not in json.loads((tmp_path / "baseline.json").read_text())["right"]


# ---------------------------------------------------------------- the rules, on report dicts


def _report(verdict, *, mismatches=(), findings=(), sites=(), ranks=()):
    return {
        "verdict": verdict,
        "mismatches": list(mismatches),
        "findings": list(findings),
        "sites": list(sites),
        "ranks": list(ranks),
        "notes": [],
    }


SPLIT = {
    "op": "all_reduce",
    "site": {"file": "hiradix_cache.py", "line": 196, "function": "_all_reduce_attn_groups"},
    "group": "tp",
    "entered": [0],
    "absent": [1, 2, 3],
    "role": "root",
}
EXPECTED = {"verdict": "problem", "site": "_all_reduce_attn_groups", "entered": [0], "absent": [1, 2, 3]}


def test_a_problem_is_right_only_when_every_stated_part_matches():
    right = S.classify(EXPECTED, S.Run(1, _report("problem", mismatches=[SPLIT]), ""))
    assert right.result == "right"
    swapped = dict(SPLIT, entered=[1, 2, 3], absent=[0])
    assert S.classify(EXPECTED, S.Run(1, _report("problem", mismatches=[swapped]), "")).result == "partly"
    elsewhere = dict(swapped, site={"file": "x.py", "line": 1, "function": "other"})
    assert S.classify(EXPECTED, S.Run(1, _report("problem", mismatches=[elsewhere]), "")).result == "wrong"


def test_refusals_and_ok_are_their_own_columns():
    assert S.classify(EXPECTED, S.Run(2, None, "mtpdiag: error: x")).result == "refused"
    assert S.classify(EXPECTED, S.Run(3, None, "no stack")).result == "refused"
    assert S.classify(EXPECTED, S.Run(0, _report("ok"), "")).result == "called ok"


def test_an_incomplete_is_right_only_with_the_next_step_in_its_findings():
    expected = {"verdict": "incomplete", "next_step": ["flight recorder"]}
    finding = {"id": "unexplained-wait", "ranks": [0], "summary": "ranks wait", "remedy": "get the Flight Recorder"}
    assert S.classify(expected, S.Run(4, _report("incomplete", findings=[finding]), "")).result == "right"
    bare = _report("incomplete")
    bare["notes"] = ["the Flight Recorder is not in the input"]  # notes are no diagnosis
    assert S.classify(expected, S.Run(4, bare, "")).result == "partly"
    blamed = {"id": "straggler", "ranks": [7], "summary": "rank 7", "remedy": ""}
    assert S.classify(expected, S.Run(1, _report("problem", findings=[blamed]), "")).result == "wrong"
    accepted = dict(expected, also_right=["straggler"])
    assert S.classify(accepted, S.Run(1, _report("problem", findings=[blamed]), "")).result == "right"


def test_culprits_named_by_pid_for_pastes_without_ranks():
    expected = {"verdict": "problem", "culprit_pids": [688514]}
    finding = {"id": "straggler", "ranks": [5], "summary": "rank 5 waits on its data loader", "remedy": ""}
    ranks = [{"rank": 5, "pid": 688514}, {"rank": 6, "pid": 688515}]
    report = _report("problem", findings=[finding], ranks=ranks)
    assert S.classify(expected, S.Run(1, report, "")).result == "right"
    other = dict(finding, ranks=[6])
    assert S.classify(expected, S.Run(1, _report("problem", findings=[other], ranks=ranks), "")).result == "wrong"
