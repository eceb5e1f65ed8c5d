"""No secret of a target process reaches any output: one real hung job, every command that touches it.

The job is the session's canonical hang (``support/canonical_hang.py``): the MTP-CP reproducer (torchrun, gloo,
4 ranks, cp=2 pp=2) with canary secrets where real jobs keep theirs: several non-whitelisted environment
variables (W&B, AWS, Hugging Face, a database URL), a ``--secret-flag=...`` on every worker's command line (a
tiny launcher drops it before the reproducer parses its arguments), and a local variable of a function on every
worker's stack, which ``py-spy dump --locals`` shows. Then inspect (console, JSON, markdown, HTML), collect, watch
(JSON, HTML, bundle), verify --pid and analyze on both bundles run, and no canary may appear on stdout, stderr or in
any file they wrote.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from mtpdiag.capture import procfs
from mtpdiag.capture.pyspy import find_pyspy
from mtpdiag.model import ENV_WHITELIST
from support.canonical_hang import CANARIES, SECRET_ENV, SECRET_FLAG, SECRET_LOCAL
from support.jobs_e2e import by_rank, run_cli, worker_pids

pytestmark = pytest.mark.e2e


@pytest.fixture
def job(canonical_hang, tmp_path):
    return canonical_hang.job, tmp_path / "out"


def _raw_environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def test_the_canaries_are_really_in_the_job(job):
    """Where a careless tool would pick them up; without this the test below could pass by reading nothing."""
    hung, _ = job
    pids = worker_pids(hung)
    for pid in pids.values():
        assert all(value.encode() in _raw_environ(pid) for value in SECRET_ENV.values())
        assert any(SECRET_FLAG in arg for arg in procfs.read_cmdline(pid))
    raw = subprocess.run(
        [find_pyspy(), "dump", "--locals", "--nonblocking", "--pid", str(pids[0])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert SECRET_LOCAL in raw.stdout, raw.stderr


def test_no_canary_reaches_any_output(job):
    hung, out = job
    out.mkdir()
    agent = str(hung.pid)
    a_worker = str(worker_pids(hung)[1])
    files = {
        name: out / name
        for name in (
            "inspect.html",
            "collect.mtpdiag.json",
            "by-worker",
            "watch.mtpdiag.json",
            "watch.html",
            "analyze.html",
        )
    }
    files["by-worker"].mkdir()
    runs = {  # name -> (arguments, expected exit code)
        "inspect": (["inspect", "--pid", agent], 1),
        "inspect --json": (["inspect", "--pid", agent, "--json"], 1),
        "inspect --markdown": (["inspect", "--pid", agent, "--markdown"], 1),
        "inspect --html": (["inspect", "--pid", agent, "--html", str(files["inspect.html"])], 1),
        "collect": (["collect", "--pid", agent, "--out", str(files["collect.mtpdiag.json"])], 0),
        "collect a worker": (["collect", "--pid", a_worker, "--out", str(files["by-worker"])], 0),
        "watch": (
            [
                "watch",
                "--pid",
                agent,
                "--interval",
                "0.5",
                "--stall",
                "2",
                "--json",
                "--out",
                str(files["watch.mtpdiag.json"]),
                "--html",
                str(files["watch.html"]),
            ],
            1,
        ),
        "verify --pid": (["verify", "--pid", agent, "--engine", "fixed", "--json"], 0),
        "analyze": (["analyze", str(files["collect.mtpdiag.json"])], 1),
        "analyze --json": (["analyze", str(files["collect.mtpdiag.json"]), "--json"], 1),
        "analyze --markdown": (
            ["analyze", str(files["collect.mtpdiag.json"]), "--markdown", "--html", str(files["analyze.html"])],
            1,
        ),
        "analyze the watch bundle": (["analyze", str(files["watch.mtpdiag.json"]), "--json"], 1),
        "analyze the worker's bundle": (["analyze", str(files["by-worker"])], 1),
    }
    results = {}
    for name, (args, code) in runs.items():
        done = run_cli(*args, timeout=900)
        assert done.returncode == code, (name, done.returncode, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, name
        results[name] = done
        for canary in CANARIES:
            assert canary not in done.stdout and canary not in done.stderr, (name, canary)

    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) == 6, written  # 2 HTML pages and the analyze page, 3 bundles
    for path in written:
        text = path.read_bytes()
        for canary in CANARIES:
            assert canary.encode() not in text, (path, canary)

    # The outputs are the real diagnosis, not empty pages that trivially hold no secret.
    report = json.loads(results["inspect --json"].stdout)
    assert sorted(by_rank(report)) == [0, 1, 2, 3]
    assert [f["id"] for f in report["findings"]][0] == "mtp-cp-gated-reduce"
    assert json.loads(results["analyze the watch bundle"].stdout)["findings"][0]["id"] == "mtp-cp-gated-reduce"
    verify = json.loads(results["verify --pid"].stdout)
    assert verify["layout"]["cp"] == 2 and verify["layout"]["pp"] == 2  # read from the job's command line
    for bundle in (files["collect.mtpdiag.json"], files["watch.mtpdiag.json"], *files["by-worker"].glob("*.json")):
        captures = json.loads(bundle.read_text())["captures"]
        assert captures and all(set(c["env"]) <= set(ENV_WHITELIST) for c in captures)
        assert all(c["threads"] for c in captures), bundle
