"""``mtpdiag run`` across nodes without a job: which node a run is, how the shared hang directory is named and
joined, ``nodes.json``, the lock, and ``analyze`` of a hang directory. The nodes' captures are a recorded real hang
(tests/fixtures/captures/mtp_cp_pp: verl #5895 on gloo, cp 2 pp 2) split in two, ranks 0-1 on node-a and 2-3 on
node-b, as two nodes' runs would have captured them. The live two-node job is
tests/e2e/test_run_multinode_e2e.py's."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.errors import InputError
from mtpdiag.model import Snapshot, replace
from mtpdiag.pipeline import multinode as mn
from mtpdiag.pipeline.run_dir import RunDir
from mtpdiag.pipeline.shared_out import LOCK_NAME, SharedOut, locked
from mtpdiag.vocabulary.nodes import NodeRole
from support.captures import load_scenario
from support.jobs_e2e import run_cli

NODE_RANKS = {"node-a": (0, 1), "node-b": (2, 3)}
LAYOUT = ("--cp", "2", "--pp", "2")  # py-spy's recorded dumps carry no command line to read it from
TORCHRUN = ["torchrun", "--nproc-per-node", "8", "train.py"]


def _node_snapshot(node: str) -> Snapshot:
    snapshot, _layout, _ = load_scenario("mtp_cp_pp")
    ranks = NODE_RANKS[node]
    return replace(
        snapshot, host=node, captures=tuple(replace(c, host=node) for c in snapshot.captures if c.rank in ranks)
    )


def _shared(out, node: str, window: float = 80.0) -> SharedOut:
    return SharedOut(out, node, RunDir.claim(out / node), window)


def _call(shared: SharedOut):
    snapshot = _node_snapshot(shared.node)
    _, layout, _ = load_scenario("mtp_cp_pp")
    report = diagnose(snapshot, layout, "flags")
    path = shared.run_dir.path / "report.txt"
    return shared.call(report, f"PROBLEM: {shared.node}", snapshot, path)


# ---------------------------------------------------------------- which node a run is


def test_a_single_node_job_keeps_the_single_node_layout():
    assert mn.node_label(None, TORCHRUN, {}, "gpu-07") is None
    assert mn.node_label(None, [*TORCHRUN, "--nnodes", "1"], {"SLURM_STEP_NUM_NODES": "1"}, "gpu-07") is None


def test_a_job_across_nodes_is_named_after_the_host_unless_host_names_it():
    for command in ([*TORCHRUN, "--nnodes", "2"], [*TORCHRUN, "--nnodes=1:4"], ["torchrun", "--nnodes", "4", "x.py"]):
        assert mn.node_label(None, command, {}, "gpu-07") == "gpu-07", command
    assert mn.nodes_in_command(["torchrun", "--nnodes=2:8", "t.py"]) == 8
    assert mn.node_label(None, TORCHRUN, {"SLURM_STEP_NUM_NODES": "2"}, "gpu-07.cluster") == "gpu-07.cluster"
    assert mn.node_label(None, [*TORCHRUN, "--nnodes", "2"], {}, "weird host/name") == "weird_host_name"
    assert mn.node_label("node-a", TORCHRUN, {}, "gpu-07") == "node-a"


def test_a_host_that_is_no_safe_directory_name_is_an_input_error():
    for bad in ("", "../x", "a/b", ".hidden", "hang-20260101T000000Z", "x" * 129):
        with pytest.raises(InputError, match="--host"):
            mn.node_label(bad, TORCHRUN, {}, "gpu-07")


# ---------------------------------------------------------------- naming and joining


def test_hang_directories_are_named_by_their_utc_second_and_read_back():
    stamp = 1_780_000_000.7
    name = mn.hang_dir_name(stamp)
    assert name == "hang-20260528T202640Z"
    assert mn.hang_time(name) == 1_780_000_000.0
    assert mn.hang_dir_name(stamp, 2) == name + "-2" and mn.hang_time(name + "-2") == 1_780_000_000.0
    for other in ("hang-1", "hang-2", "node-a", "hang-20260528T202640Z.tmp", "hang-20260528-202640"):
        assert mn.hang_time(other) is None, other  # a single node's later hangs (hang-<N>/) are no shared hang


def test_a_call_joins_the_latest_hang_made_within_the_window_unless_it_called_into_it():
    now = 1_780_000_100.0
    window = mn.same_hang_window(10.0)
    assert window == 80.0
    early = mn.HangDir("hang-early", now - 70, ("node-a",))
    late = mn.HangDir("hang-late", now - 5, ("node-a",))
    assert mn.pick_hang([early, late], "node-b", now, window) == "hang-late"
    assert mn.pick_hang([early], "node-b", now, window) == "hang-early"  # node-b stopped a window later
    assert mn.pick_hang([early], "node-a", now, window) is None  # node-a's own earlier call: a new hang
    assert mn.pick_hang([mn.HangDir("hang-old", now - 200)], "node-b", now, window) is None
    assert mn.pick_hang([mn.HangDir("hang-ahead", now + 3)], "node-b", now, window) == "hang-ahead"  # clock skew
    assert mn.pick_hang([], "node-b", now, window) is None


def test_nodes_json_lists_each_node_once_and_a_sighting_never_replaces_a_call():
    doc = mn.new_nodes("hang-x", "node-a", 0.0)
    called = mn.NodeArrival(node="node-a", role=NodeRole.CALLED, at="t1", ranks=(0, 1), bundle="node-a.mtpdiag.json")
    saw = mn.NodeArrival(node="node-b", role=NodeRole.SAW, at="t2", ranks=(2, 3), bundle="node-b.mtpdiag.json")
    doc = mn.with_arrival(mn.with_arrival(doc, called), saw)
    assert [(e.node, e.role) for e in doc.nodes] == [("node-a", "called"), ("node-b", "saw")]
    later_call = msgspec_replace(saw, role=NodeRole.CALLED, at="t3")
    doc = mn.with_arrival(doc, later_call)
    assert [(e.node, e.role, e.at) for e in doc.nodes] == [("node-a", "called", "t1"), ("node-b", "called", "t3")]
    assert mn.with_arrival(doc, msgspec_replace(called, role=NodeRole.SAW)) is doc
    assert mn.called_by(doc) == ("node-a", "node-b")
    assert mn.read_nodes(mn.nodes_text(doc).encode()) == doc
    assert mn.read_nodes(b"{not json") is None and mn.called_by(None) == ()


def msgspec_replace(arrival: mn.NodeArrival, **changes: object) -> mn.NodeArrival:
    import msgspec

    return msgspec.structs.replace(arrival, **changes)


# ---------------------------------------------------------------- the shared --out


def test_two_nodes_calling_one_hang_share_one_directory_that_analyze_merges(tmp_path):
    out = tmp_path / "shared"
    first = _call(_shared(out, "node-a"))
    second = _call(_shared(out, "node-b"))
    assert first is not None and first == second
    assert [p.name for p in out.iterdir() if p.name.startswith("hang-")] == [first.name]
    doc = json.loads((first / "nodes.json").read_text())
    assert doc["first"] == "node-a" and doc["hang"] == first.name
    assert [(e["node"], e["role"], e["ranks"]) for e in doc["nodes"]] == [
        ("node-a", "called", [0, 1]),
        ("node-b", "called", [2, 3]),
    ]
    assert doc["nodes"][1]["report"] == "../node-b/report.txt" and doc["nodes"][1]["headline"] == "PROBLEM: node-b"
    assert sorted(p.name for p in first.iterdir()) == [
        "node-a.mtpdiag.json",
        "node-a.report.md",
        "node-b.mtpdiag.json",
        "node-b.report.md",
        "nodes.json",
    ]
    assert not (out / LOCK_NAME).exists()

    result = run_cli("analyze", str(first), "--json", *LAYOUT)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""  # nothing skipped: nodes.json and the markdown reports are not read as captures
    report = json.loads(result.stdout)
    assert report["findings"][0]["id"] == "mtp-cp-gated-reduce"
    assert [(r["rank"], r["host"]) for r in report["ranks"]] == [
        (0, "node-a"),
        (1, "node-a"),
        (2, "node-b"),
        (3, "node-b"),
    ]


def test_analyze_of_a_hang_with_one_node_arrived_names_the_ranks_not_captured(tmp_path):
    out = tmp_path / "shared"
    hang = _call(_shared(out, "node-b"))
    assert hang is not None
    result = run_cli("analyze", str(hang), "--json", *LAYOUT)
    report = json.loads(result.stdout)
    assert [r["rank"] for r in report["ranks"]] == [2, 3]
    assert report["world_size"] == 4 and report["findings"][0]["id"] == "mtp-cp-gated-reduce"
    assert any("ranks 0, 1 not captured" in note for note in report["notes"]), report["notes"]


def test_a_nodes_second_call_is_a_new_hang_directory(tmp_path):
    out = tmp_path / "shared"
    shared = _shared(out, "node-a")
    first, second = _call(shared), _call(shared)
    assert first is not None and second is not None and first != second
    assert mn.hang_time(second.name) is not None  # hang-<time>-2 when it came in the same second


def test_a_node_drops_its_ranks_into_a_hang_another_node_made_once_and_its_call_then_replaces_them(tmp_path):
    out = tmp_path / "shared"
    watcher_b = SimpleNamespace(take_stacks=lambda _targets, _busy: _node_snapshot("node-b"))
    b = _shared(out, "node-b")
    assert b.look(watcher_b, [101, 102]) == []  # no hang yet
    hang = _call(_shared(out, "node-a"))
    assert b.look(watcher_b, [101, 102]) == [hang]
    assert b.look(watcher_b, [101, 102]) == []  # once per directory
    doc = json.loads((hang / "nodes.json").read_text())
    assert [(e["node"], e["role"]) for e in doc["nodes"]] == [("node-a", "called"), ("node-b", "saw")]
    assert not (hang / "node-b.report.md").exists()
    assert _call(b) == hang  # node-b's own call, seconds later, joins the same hang
    doc = json.loads((hang / "nodes.json").read_text())
    assert [(e["node"], e["role"]) for e in doc["nodes"]] == [("node-a", "called"), ("node-b", "called")]
    assert (hang / "node-b.report.md").exists()
    assert "another node called a hang" in (out / "node-b" / "events.log").read_text()


def test_a_node_that_cannot_capture_on_sight_logs_it_and_goes_on(tmp_path):
    out = tmp_path / "shared"
    hang = _call(_shared(out, "node-a"))
    b = _shared(out, "node-b")
    assert b.look(SimpleNamespace(take_stacks=None), []) == []  # no ranks of its own to capture
    assert "no ranks of this node to capture" in (out / "node-b" / "mtpdiag-errors.log").read_text()
    assert hang is not None and not (hang / "node-b.mtpdiag.json").exists()


def test_the_lock_is_exclusive_and_a_stale_one_is_broken(tmp_path):
    with locked(tmp_path):
        assert (tmp_path / LOCK_NAME).is_dir()
        with pytest.raises(TimeoutError, match="held by another node"), locked(tmp_path, wait_s=0.2):
            pass
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).mkdir()  # left by a node that died holding it
    old = time.time() - 600
    os.utime(tmp_path / LOCK_NAME, (old, old))
    with locked(tmp_path, wait_s=1.0):
        pass
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_shared_out_whose_lock_another_node_holds_is_logged_and_the_call_goes_on(tmp_path):
    out = tmp_path / "shared"
    shared = _shared(out, "node-a")
    (out / LOCK_NAME).mkdir()  # another node holds the lock (fresh: not stale)
    assert _call(SharedOut(out, "node-a", shared.run_dir, 80.0, lock_wait_s=0.2)) is None
    assert "held by another node" in (out / "node-a" / "mtpdiag-errors.log").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith("hang-")]


# ---------------------------------------------------------------- the command


def test_runs_of_two_nodes_share_an_out_and_a_second_run_of_one_node_is_refused(tmp_path):
    out = tmp_path / "shared"
    for node in ("node-a", "node-b"):
        result = run_cli("run", "--out", str(out), "--host", node, "--", "true")
        assert result.returncode == 0, result.stderr
        assert json.loads((out / node / "run.json").read_text())["launcher"] == "true"
        assert (out / node / "fr").is_dir()
    assert not (out / "run.json").exists()
    again = run_cli("run", "--out", str(out), "--host", "node-a", "--", "true")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    bad = run_cli("run", "--out", str(out), "--host", "../up", "--", "true")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--host" in bad.stderr


def test_a_command_across_nodes_runs_in_a_directory_named_after_the_host(tmp_path):
    out = tmp_path / "shared"
    result = run_cli("run", "--out", str(out), "--", "sh", "-c", "exit 0", "sh", "--nnodes", "2")
    assert result.returncode == 0, result.stderr
    assert [p.name for p in out.iterdir()] == [mn.node_label(None, ["--nnodes", "2"], {}, os.uname().nodename)]


def test_analyze_of_a_nodes_run_directory_reads_its_bundle_and_passes_over_runs_own_records(tmp_path):
    out = tmp_path / "shared"
    shared = _shared(out, "node-b")
    shared.run_dir.describe(pid=1, launcher="torchrun")
    shared.run_dir.event("hang called")
    snapshot = _node_snapshot("node-b")
    _, layout, _ = load_scenario("mtp_cp_pp")
    shared.run_dir.write_hang(diagnose(snapshot, layout, "flags"), snapshot, {"stalled_for_s": 10.0})
    names = {p.name for p in shared.run_dir.path.iterdir()}
    assert {"run.json", "events.log", "report.json", "report.txt", "hang.json", "bundle.json"} <= names
    result = run_cli("analyze", str(shared.run_dir.path), "--json", *LAYOUT)
    assert result.stderr == "" and result.returncode == 1  # the bundle alone; nothing listed as unreadable
    assert [r["rank"] for r in json.loads(result.stdout)["ranks"]] == [2, 3]
