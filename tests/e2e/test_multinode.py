"""Multi-node merge through the real CLI: one bundle per host, merged by ``analyze DIR``.

The session's canonical hung job (torchrun, gloo, megatron-core, 4 ranks, the MTP-CP reproducer with cp=2
pp=2: ``support/canonical_hang.py``) stands in for a two-node job: ``mtpdiag collect --pid <worker> --host
node-a`` saves ranks 0-1 and
``--host node-b`` ranks 2-3, each into its own ``<host>.mtpdiag.json`` in one shared directory, as
``collect`` on two machines would. ``analyze`` must then merge them, name the files of a duplicated
rank or of a world-size conflict, and report the ranks that no bundle holds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpdiag.fix.verify.launch import start_torchrun
from mtpdiag.layout import ParallelLayout

pytestmark = pytest.mark.e2e

HOSTS = {"node-a": (0, 1), "node-b": (2, 3)}
LAYOUT = ParallelLayout.for_world(4, cp=2, pp=2)


def mtpdiag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def job(canonical_hang):
    return canonical_hang.job, canonical_hang.workers


@pytest.fixture(scope="module")
def bundles(job, tmp_path_factory) -> Path:
    """The shared directory after ``collect`` ran once per simulated host."""
    _, workers = job
    shared = tmp_path_factory.mktemp("shared")
    for host, ranks in HOSTS.items():
        pids = [x for r in ranks for x in ("--pid", str(workers[r]))]
        done = mtpdiag("collect", *pids, "--host", host, "--out", str(shared), "--timeout", "60")
        assert done.returncode == 0, done.stderr
        assert f"{host}.mtpdiag.json" in done.stderr and "2 ranks" in done.stderr
    return shared


def _analyze(*paths: Path) -> tuple[dict, subprocess.CompletedProcess]:
    done = mtpdiag("analyze", *map(str, paths), "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout), done


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_each_collect_writes_one_bundle_with_its_own_host_label(bundles, job):
    _, workers = job
    assert sorted(p.name for p in bundles.iterdir()) == ["node-a.mtpdiag.json", "node-b.mtpdiag.json"]
    for host, ranks in HOSTS.items():
        doc = json.loads((bundles / f"{host}.mtpdiag.json").read_text())
        assert doc["schema"] == "mtpdiag.bundle/1" and doc["host"] == host
        assert [(c["rank"], c["pid"], c["host"]) for c in doc["captures"]] == [(r, workers[r], host) for r in ranks]


def test_analyze_merges_the_hosts_by_rank(bundles, job):
    _, workers = job
    report, done = _analyze(bundles)
    assert done.returncode == 1 and report["verdict"] == "problem"
    assert report["world_size"] == 4
    assert (report["layout"]["cp"], report["layout"]["pp"]) == (2, 2)  # from the workers' command lines
    assert [(r["rank"], r["pid"], r["host"]) for r in report["ranks"]] == [
        (0, workers[0], "node-a"),
        (1, workers[1], "node-a"),
        (2, workers[2], "node-b"),
        (3, workers[3], "node-b"),
    ]
    assert [r["op"] for r in report["ranks"]] == ["send", "all_gather", "all_reduce", "all_gather"]
    ids = [f["id"] for f in report["findings"]]
    assert ids[0] == "mtp-cp-gated-reduce" and "missing-rank" not in ids
    assert report["findings"][0]["ranks"] == [2, 3]


def test_one_host_alone_reports_the_other_hosts_ranks_missing(bundles, tmp_path):
    alone = tmp_path / "only-node-a"
    alone.mkdir()
    shutil.copy(bundles / "node-a.mtpdiag.json", alone)
    report, done = _analyze(alone)
    assert done.returncode == 1
    assert [(r["rank"], r["host"]) for r in report["ranks"]] == [(0, "node-a"), (1, "node-a")]
    missing = next(f for f in report["findings"] if f["id"] == "missing-rank")
    assert missing["ranks"] == [2, 3]
    assert missing["details"]["coords"] == {"2": LAYOUT.coords(2), "3": LAYOUT.coords(3)}
    assert [(c["cp"], c["pp"]) for c in missing["details"]["coords"].values()] == [(0, 1), (1, 1)]


def test_a_bundle_copied_under_another_name_is_read_once(bundles, tmp_path):
    """The same captures in two files (a bundle copied twice into a shared directory) are one capture per rank:
    the report is the one without the copy, with no conflict and no rank counted twice."""
    for name in ("node-a.mtpdiag.json", "node-b.mtpdiag.json"):
        shutil.copy(bundles / name, tmp_path / name)
    alone, _ = _analyze(tmp_path)
    shutil.copy(bundles / "node-a.mtpdiag.json", tmp_path / "node-a-again.mtpdiag.json")
    merged, done = _analyze(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert [r["rank"] for r in merged["ranks"]] == [0, 1, 2, 3]
    assert merged == alone


def test_a_bundle_with_another_world_size_is_an_input_error_naming_both(bundles, tmp_path):
    shutil.copy(bundles / "node-a.mtpdiag.json", tmp_path)
    doc = json.loads((bundles / "node-b.mtpdiag.json").read_text())
    for capture in doc["captures"]:
        assert capture["env"]["WORLD_SIZE"] == "4"
        capture["env"]["WORLD_SIZE"] = "8"
    edited = tmp_path / "node-b.mtpdiag.json"
    edited.write_text(json.dumps(doc, indent=1))
    line = _one_error_line(mtpdiag("analyze", str(tmp_path), "--json"))
    assert str(edited) in line and str(tmp_path / "node-a.mtpdiag.json") in line
    assert " 4" in line and " 8" in line


SLEEPER = "import time\ntime.sleep(600)\n"


def test_ending_the_job_leaves_no_worker(tmp_path):
    """A job of its own (the shared one must live on): real torchrun, four workers that sleep."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    started = start_torchrun(str(script), [], nproc=4, log_path=str(tmp_path / "job.log"))
    try:
        workers = started.wait_for_workers(timeout=240.0)
    finally:
        started.kill()
    pids = [started.pid, *workers]
    deadline = time.monotonic() + 15
    while True:
        listed = subprocess.run(
            ["ps", "-o", "pid=,stat=", "-p", ",".join(map(str, pids))], capture_output=True, text=True, check=False
        ).stdout.split("\n")
        alive = [line.split() for line in listed if line.strip() and not line.split()[1].startswith("Z")]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert alive == []
