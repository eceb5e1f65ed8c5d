"""End to end: the session's canonical hung job (torchrun/gloo, verl #5895 at cp 2, pp 2, with canary secrets:
``support/canonical_hang.py``); the real ``mtpdiag inspect``/``collect``/``analyze`` diagnose it."""

from __future__ import annotations

import pytest

from support.canonical_hang import CANARIES
from support.jobs_e2e import by_rank, run_cli, run_json, worker_pids

pytestmark = pytest.mark.e2e


@pytest.fixture
def mtp_cp_pp(canonical_hang, tmp_path):
    """The verl #5895 hang at CP=2, PP=2, with secrets in every worker's environment; this test's folder."""
    return canonical_hang.job, tmp_path


def test_inspect_json_names_every_rank_op_site_and_the_root_cause(mtp_cp_pp):
    job, _ = mtp_cp_pp
    report = run_json("inspect", "--pid", str(job.pid))
    pids = worker_pids(job)
    ranks = by_rank(report)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert report["world_size"] == 4
    assert report["layout"]["cp"] == 2 and report["layout"]["pp"] == 2
    assert "command line" in report["layout_source"]
    for rank, view in ranks.items():
        assert view["pid"] == pids[rank]
        assert view["state"] == "collective"
        assert report["stacks"][view["stack"]], rank
    expected = {
        0: ("send", "send_forward"),
        1: ("all_gather", "ring_attention"),
        2: ("all_reduce", "MTPLossLoggingHelper.reduce_loss_in_tracker"),
        3: ("all_gather", "ring_attention"),
    }
    for rank, (op, function) in expected.items():
        assert (ranks[rank]["op"], ranks[rank]["site"]["function"]) == (op, function)
    assert ranks[2]["site"]["file"] == "megatron/core/transformer/multi_token_prediction.py"
    assert ranks[0]["peer"] == 2
    assert ranks[2]["coords"] == {"tp": 0, "cp": 0, "ep": 0, "dp": 0, "pp": 1}
    assert ranks[3]["coords"] == {"tp": 0, "cp": 1, "ep": 0, "dp": 0, "pp": 1}

    assert report["verdict"] == "problem"
    assert report["findings"][0]["id"] == "mtp-cp-gated-reduce"
    assert report["findings"][0]["ranks"] == [2, 3]
    roots = [m for m in report["mismatches"] if m["role"] == "root"]
    assert len(roots) == 1
    root = roots[0]
    assert (root["op"], root["group"], root["members"], root["entered"], root["absent"], root["gate"]) == (
        "all_reduce",
        "dp_cp",
        [2, 3],
        [2],
        [3],
        {"cp": 0},
    )
    assert "ring_attention" in root["absent_doing"]["3"]
    sites = {(s["op"], s["site"]["function"]): s["ranks"] for s in report["sites"]}
    assert sites[("all_gather", "ring_attention")] == [1, 3]


def test_inspect_console_reads_as_a_diagnosis(mtp_cp_pp):
    job, _ = mtp_cp_pp
    result = run_cli("inspect", "--pid", str(job.pid))
    assert result.returncode == 1, result.stderr
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert out.startswith("PROBLEM: MTP loss all_reduce on the DP×CP group [2, 3]")
    assert "[mtp-cp-gated-reduce]" in out
    assert "entered by rank 2 (tp0 cp0 pp1)" in out
    assert "absent: rank 3 (tp0 cp1 pp1), which is at all_gather in ring_attention" in out
    assert "Entered only where cp == 0: a condition that excludes cp > 0 gates this collective" in out
    assert "mtpdiag check && mtpdiag apply" in out
    assert "Rank grid" in out


def test_collect_then_analyze_gives_the_same_diagnosis(mtp_cp_pp):
    job, tmp = mtp_cp_pp
    bundle = tmp / "bundle.json"
    result = run_cli("collect", "--pid", str(job.pid), "--out", str(bundle))
    assert result.returncode == 0, result.stderr
    live = run_json("inspect", "--pid", str(job.pid))
    saved = run_json("analyze", str(bundle))
    assert [(r["rank"], r["op"], r["site"]) for r in saved["ranks"]] == [
        (r["rank"], r["op"], r["site"]) for r in live["ranks"]
    ]
    assert saved["findings"][0]["id"] == "mtp-cp-gated-reduce"
    assert saved["mismatches"] == live["mismatches"]


def test_no_secret_reaches_any_output(mtp_cp_pp):
    job, tmp = mtp_cp_pp
    html = tmp / "report.html"
    bundle = tmp / "secrets-bundle.json"
    outputs = [
        run_cli("inspect", "--pid", str(job.pid), "--json"),
        run_cli("inspect", "--pid", str(job.pid), "--markdown"),
        run_cli("inspect", "--pid", str(job.pid), "--html", str(html)),
        run_cli("collect", "--pid", str(job.pid), "--out", str(bundle)),
    ]
    for result in outputs:
        assert result.returncode in (0, 1), result.stderr
        assert not [c for c in CANARIES if c in result.stdout or c in result.stderr]
    written = html.read_text() + bundle.read_text()
    assert "mtpdiag" in written and not [c for c in CANARIES if c in written]


def test_markdown_report_for_a_ticket(mtp_cp_pp):
    job, _ = mtp_cp_pp
    result = run_cli("inspect", "--pid", str(job.pid), "--markdown")
    assert result.returncode == 1
    assert result.stdout.startswith("## mtpdiag: problem")
    assert "**`mtp-cp-gated-reduce`** ranks [2, 3]" in result.stdout
    assert "| 2 |" in result.stdout
