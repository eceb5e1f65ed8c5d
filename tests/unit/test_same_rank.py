"""One rank in several files (issue #20): the same capture in several forms is one rank; different captures of a
rank are all kept, as a conflict that names their files; never a refusal of the whole input.

The inputs are the recorded captures (tests/fixtures/captures/<scenario>/): each rank as py-spy's JSON
(``rankN.json``, ``--locals``), its text (``rankN.txt``), for the NCCL-behaviour scenarios its ``--native`` JSON
(``rankN.native.json``), and the ``collect`` bundle of the same hang (``bundle.json``).
"""

from __future__ import annotations

import glob
import json

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.inputs import read_inputs
from support.captures import CAPTURES, load_scenario, scenarios
from support.jobs_e2e import run_cli

MTP = f"{CAPTURES}/mtp_cp_pp"
OTHER = f"{CAPTURES}/straggler"  # another recorded job, of the same world size: its rank 0 differs


def _forms(scenario: str) -> list[str]:
    return sorted(glob.glob(f"{CAPTURES}/{scenario}/rank*")) + [f"{CAPTURES}/{scenario}/bundle.json"]


@pytest.mark.parametrize("scenario", scenarios())
def test_every_form_of_one_capture_is_one_rank_with_no_note(scenario):
    inputs = read_inputs(_forms(scenario))
    snapshot, (_, layout, meta) = inputs.snapshot, load_scenario(scenario)
    assert [c.rank for c in snapshot.captures] == list(range(meta["world_size"]))
    assert snapshot.conflicts == () and inputs.notes == ()
    report = diagnose(snapshot, layout)
    assert not [n for n in report.notes if "captured" in n and "differently" in n]


def test_the_richest_form_is_kept_with_what_the_others_add():
    """rank0.json holds the send's kept ``dst`` (``--locals``), rank0.txt the command line's sizes; the NCCL
    ranks' ``--native`` dump holds the C frames. Each is kept, whichever file is named first."""
    for paths in ([f"{MTP}/rank0.json", f"{MTP}/rank0.txt"], [f"{MTP}/rank0.txt", f"{MTP}/rank0.json"]):
        (capture,) = read_inputs(paths).snapshot.captures
        assert capture.source == f"{MTP}/rank0.json"
        assert capture.main_thread.frames[0].function == "send" and capture.main_thread.frames[0].arg("dst") == 2
        assert dict(capture.layout_hints) == {"cp": 2, "pp": 2}  # from the text dump's command line
    (capture,) = read_inputs([f"{MTP}/rank1.txt", f"{MTP}/rank1.json"]).snapshot.captures  # no kept arguments
    assert capture.source == f"{MTP}/rank1.json"  # full paths, where the text shortens them
    assert capture.main_thread.frames[-1].file.startswith("/")
    nccl = f"{CAPTURES}/nccl_mtp_cp_pp_spin"
    (capture,) = read_inputs([f"{nccl}/rank2.json", f"{nccl}/rank2.txt", f"{nccl}/rank2.native.json"]).snapshot.captures
    assert capture.source == f"{nccl}/rank2.native.json"
    assert any(f.native for f in capture.main_thread.frames) and dict(capture.layout_hints)


def test_different_captures_of_one_rank_are_both_kept_as_a_conflict_naming_both_files():
    ranks = [f"{MTP}/rank{r}.json" for r in range(4)]
    snapshot = read_inputs([*ranks, f"{OTHER}/rank0.json"]).snapshot
    assert [c.rank for c in snapshot.captures] == [0, 0, 1, 2, 3]
    assert [c.source for c in snapshot.captures[:2]] == [ranks[0], f"{OTHER}/rank0.json"]
    (conflict,) = snapshot.conflicts
    assert conflict.rank == 0 and conflict.sources == (ranks[0], f"{OTHER}/rank0.json")
    assert "different pids" in conflict.why
    report = diagnose(snapshot, load_scenario("mtp_cp_pp")[1])
    (note,) = [n for n in report.notes if "captured differently" in n]
    assert ranks[0] in note and f"{OTHER}/rank0.json" in note and note.endswith(f"read the one from {ranks[0]}")
    assert [v.rank for v in report.ranks] == [0, 0, 1, 2, 3]
    assert [r for s in report.sites for r in s.ranks].count(0) == 1  # rank 0 stands where its diagnosis is
    assert report.findings[0].id == "mtp-cp-gated-reduce"  # the hang of the file named first


def test_the_first_file_named_decides_what_the_diagnosis_reads():
    ranks = [f"{MTP}/rank{r}.json" for r in range(1, 4)]
    first = read_inputs([f"{OTHER}/rank0.json", f"{MTP}/rank0.json", *ranks]).snapshot
    second = read_inputs([f"{MTP}/rank0.json", f"{OTHER}/rank0.json", *ranks]).snapshot
    layout = load_scenario("mtp_cp_pp")[1]
    zero = [next(s.op for s in diagnose(snapshot, layout).sites if 0 in s.ranks) for snapshot in (first, second)]
    assert zero == ["all_reduce", "send"]  # the straggler job's rank 0, then the MTP hang's


def test_a_capture_without_a_stack_gives_way_to_one_that_has_one():
    unreadable = f"{CAPTURES}/hang_unreadable/rank3.error.txt"
    snapshot = read_inputs([unreadable, f"{MTP}/rank3.json"]).snapshot
    (conflict,) = snapshot.conflicts
    assert conflict.sources == (f"{MTP}/rank3.json", unreadable) and conflict.why == "not every capture holds a stack"
    assert snapshot.captures[0].threads and not snapshot.captures[1].threads


@pytest.mark.parametrize("order", ["mtp first", "other first"])
def test_analyze_keeps_both_and_names_them_never_exit_2(order):
    files = [f"{MTP}/rank0.json", f"{OTHER}/rank0.json"]
    if order == "other first":
        files.reverse()
    done = run_cli("analyze", *files, *[f"{MTP}/rank{r}.txt" for r in (1, 2, 3)], "--cp", "2", "--pp", "2", "--json")
    assert done.returncode in (1, 4), (done.returncode, done.stderr)
    report = json.loads(done.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 0, 1, 2, 3]
    (note,) = [n for n in report["notes"] if "captured differently" in n]
    assert files[0] in note and files[1] in note and note.endswith(f"the one from {files[0]}")


def test_analyze_of_a_recorded_directory_reads_each_rank_once():
    """The directory holds the bundle, the JSON and the text dumps of one hang (and its scenario.json, which is
    no capture and is said to be skipped): one rank each, the bundle's diagnosis."""
    done = run_cli("analyze", MTP, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    alone = json.loads(run_cli("analyze", f"{MTP}/bundle.json", "--json").stdout)
    assert report["findings"] == alone["findings"] and report["mismatches"] == alone["mismatches"]
    assert [n for n in report["notes"] if n not in alone["notes"]] == [
        f"not captured: {MTP}/scenario.json: JSON that is neither an mtpdiag.bundle/1 bundle nor a py-spy dump"
    ]
