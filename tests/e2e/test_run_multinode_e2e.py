"""``mtpdiag run`` across nodes, on one host: two runs, one per "node" of one world, given one shared --out.

Each run launches its node's torchrun (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on the loopback) of the
canonical reproducer (examples/mtp_cp_deadlock, verl #5895 on gloo with real megatron-core: cp 2, pp 2, 4 ranks)
and watches only its own two ranks. ``--host node-a`` / ``--host node-b`` name the nodes (two real nodes would
default to their hostnames). Each calls the hang from its own ranks and exits 1 (``--on-hang exit``); between them
they make one ``hang-<time>/`` with both nodes' bundles, and ``mtpdiag analyze`` of it names the bug with all four
ranks. node-b waits longer before it calls (``--hang-after 40``, node-a 10 s), so it sees node-a's hang directory
appear first and drops its ranks there at once (``saw``), then calls the same hang itself and joins it, its own
bundle replacing the first (``called``). How far apart the calls came is printed, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.capture import procfs
from mtpdiag.fix.verify.launch import kill_pids
from support.jobs_e2e import MTP_WORKER, ROOT, free_port, run_cli

pytestmark = pytest.mark.e2e

NODES = ("node-a", "node-b")
HANG_AFTER = {"node-a": "10", "node-b": "40"}
FR_VARS = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)
JOB = [MTP_WORKER, "--gate", "buggy", "--cp", "2", "--pp", "2"]
# A loaded machine starts four torch + megatron ranks in minutes: a bound for a broken test, never a figure.
RUN_TIMEOUT_S = 1800


def _torchrun(node_rank: int, port: int) -> list[str]:
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank)),
        *("--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"),
        *("--rdzv-id", f"mtpdiag-multinode-{port}"),
    ]


def _start(out: Path, node: str, node_rank: int, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **{k: "" for k in FR_VARS}}
    logs = out.parent
    with open(logs / f"{node}.job.log", "w") as log, open(logs / f"{node}.stderr", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "mtpdiag", "run", "--out", str(out), "--host", node, "--on-hang", "exit"]
            + ["--hang-after", HANG_AFTER[node]]
            + ["--", *_torchrun(node_rank, port), *JOB],
            stdout=log,
            stderr=err,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )


def _job_pids(out: Path, node: str) -> set[int]:
    record = out / node / "run.json"
    if not record.exists() or not record.read_text().strip():
        return set()
    launcher = json.loads(record.read_text())["pid"]
    return {launcher, *procfs.descendants(launcher)}


def test_two_nodes_share_one_hang_directory_that_analyze_merges(tmp_path):
    out = tmp_path / "shared"
    port = free_port()
    runs = {node: _start(out, node, i, port) for i, node in enumerate(NODES)}
    codes: dict[str, int] = {}
    jobs: set[int] = set()
    try:
        for node, proc in runs.items():
            codes[node] = proc.wait(timeout=RUN_TIMEOUT_S)
            jobs |= _job_pids(out, node)
        stderr = {node: (tmp_path / f"{node}.stderr").read_text(errors="replace") for node in NODES}
        assert codes == {"node-a": 1, "node-b": 1}, stderr
        for node in NODES:
            assert "Traceback" not in stderr[node]
            assert (out / node / "run.json").exists() and (out / node / "report.txt").exists()
            assert not (out / node / "mtpdiag-errors.log").exists(), (out / node / "mtpdiag-errors.log").read_text()
            assert f"mtpdiag run: every node's ranks: mtpdiag analyze {out}/hang-" in stderr[node], stderr[node]

        hangs = sorted(p.name for p in out.iterdir() if p.name.startswith("hang-"))
        assert len(hangs) == 1, hangs  # the second node joined the first one's hang
        hang = out / hangs[0]
        doc = json.loads((hang / "nodes.json").read_text())
        assert doc["schema"] == "mtpdiag.hang-nodes/1" and doc["hang"] == hang.name and doc["first"] == "node-a"
        arrived = {entry["node"]: entry for entry in doc["nodes"]}
        assert set(arrived) == set(NODES)
        assert all(entry["role"] == "called" for entry in arrived.values()), arrived  # each called it itself
        saw = f"another node called a hang; this node's ranks are in {hang}"
        assert saw in stderr["node-b"], stderr["node-b"]  # before its own call: it saw node-a's directory appear
        events_b = (out / "node-b" / "events.log").read_text()
        assert events_b.index("another node called a hang") < events_b.index("hang called after"), events_b
        assert sorted(r for entry in arrived.values() for r in entry["ranks"]) == [0, 1, 2, 3]
        for node in NODES:
            assert (hang / f"{node}.mtpdiag.json").stat().st_size > 0
            assert (hang / arrived[node]["report"]).resolve() == (out / node / "report.txt").resolve()

        result = run_cli("analyze", str(hang), "--json")
        assert result.returncode == 1, result.stderr
        assert "skipped" not in result.stderr, result.stderr  # nodes.json and the .md reports are no inputs
        report = json.loads(result.stdout)
        assert report["findings"][0]["id"] == "mtp-cp-gated-reduce", report["findings"]
        assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
        assert sorted({r["host"] for r in report["ranks"]}) == list(NODES)
        (root,) = [m for m in report["mismatches"] if m["role"] == "root"]
        assert (root["group"], root["entered"], root["absent"]) == ("dp_cp", [2], [3])

        called = sorted(json.loads((out / node / "hang.json").read_text())["called"] for node in NODES)
        print(f"\nthe two nodes called the hang at {called[0]} and {called[1]}; {doc['first']} made {hang.name}")
    finally:
        for node, proc in runs.items():
            jobs |= _job_pids(out, node)
            if proc.poll() is None:
                jobs.add(proc.pid)
        kill_pids(jobs)
        for proc in runs.values():
            proc.wait(timeout=60)
