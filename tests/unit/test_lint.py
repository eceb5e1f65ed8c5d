"""`mtpdiag lint`: rank-gated collectives in real verl engines, the reproducer, and small rule cases."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtpdiag.fix.engine import check_engine
from mtpdiag.lint import lint_paths, lint_source
from support.jobs_e2e import run_cli_here as mtpdiag_here
from support.megatron_wheels import megatron_root
from support.verl_wheels import verl_engine_file

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "examples" / "mtp_cp_deadlock" / "worker.py"


def mtpdiag(*args: str) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh interpreter (`python -m mtpdiag`)."""
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def findings_in(source: str) -> list[tuple[int, str, str]]:
    return [(f.line, f.collective, f.condition) for f in lint_source(textwrap.dedent(source), "case.py")]


# -------------------------------------------------------------------------------------- real verl files


@pytest.mark.verl
def test_verl_071_is_flagged_at_the_mtp_block():
    path = verl_engine_file("0.7.1")
    first, last = check_engine(path).lines
    proc = mtpdiag("lint", str(path), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "mtpdiag.lint/1"
    hits = [f for f in doc["findings"] if first <= f["line"] <= last]
    assert len(hits) == 1
    hit = hits[0]
    assert hit["collective"] == "get_megatron_mtp_loss"
    assert hit["file"] == str(path)
    assert hit["condition"] == "self.model_config.mtp.enable and self.is_mp_src_rank_with_outputs()"
    assert "dp_cp" in hit["reason"]
    assert path.read_text().splitlines()[hit["line"] - 1].strip() == "metrics = get_megatron_mtp_loss(n_micro_batch)"


@pytest.mark.verl
@pytest.mark.parametrize("version", ["0.8.0", "0.9.0", "0.9.1"])
def test_fixed_verl_mtp_block_is_not_flagged(version):
    """A pipeline-stage gate around the DP×CP all_reduce splits nothing (design rule)."""
    path = verl_engine_file(version)
    first, last = check_engine(path).lines
    findings = lint_paths([path]).findings
    assert not [f for f in findings if first <= f.line <= last]


@pytest.mark.verl
def test_verl_080_engine_is_clean_through_the_cli():
    proc = mtpdiag_here("lint", str(verl_engine_file("0.8.0")))
    assert proc.returncode == 0, proc.stdout
    assert "0 finding(s) in 1 file" in proc.stdout


# ------------------------------------------------------------------------------- real megatron-core files

MTP = "megatron/core/transformer/multi_token_prediction.py"
DSA = "megatron/core/transformer/experimental_attention_variant/dsa.py"


def _pp_all_reduce_line(path: Path) -> int:
    """The line of the indexer reduce's pipeline all_reduce, found in the source itself."""
    tree = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DSAIndexerLossLoggingHelper")
    reduce = next(n for n in fn.body if isinstance(n, ast.FunctionDef) and n.name == "reduce_loss_in_tracker")
    return next(
        n.lineno
        for n in ast.walk(reduce)
        if isinstance(n, ast.Call) and "get_pipeline_model_parallel_group" in ast.unparse(n)
    )


@pytest.mark.verl
@pytest.mark.parametrize("minor", ["0.16", "0.18", "0.19"])
def test_the_indexers_early_return_skips_the_pipeline_all_reduce(minor):
    """Megatron-LM #4745: a stage without indexer layers returns before the PP all_reduce."""
    path = megatron_root(minor) / DSA
    findings = lint_paths([path]).findings
    assert [(f.line, f.collective) for f in findings] == [(_pp_all_reduce_line(path), "all_reduce")]
    hit = findings[0]
    assert hit.condition.startswith('"values" in tracker [after the early exit at line ')
    assert "pp" in hit.reason and "get_pipeline_model_parallel_group()" in hit.reason
    assert "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker" in hit.reason and "#4745" in hit.reason


@pytest.mark.verl
@pytest.mark.parametrize("minor", ["0.13", "0.16", "0.19"])
def test_the_mtp_helpers_early_return_is_no_finding(minor):
    """The same early return around MTPLossLoggingHelper's DP×CP reduce splits nothing: every member of a
    DP×CP group is on one stage (and megatron's callers never fill its reduce_group)."""
    assert lint_paths([megatron_root(minor) / MTP]).findings == ()


@pytest.mark.verl
def test_megatron_019_trains_loop_calls_the_renamed_helper_ungated():
    """training.py logs the MTP and indexer metrics on every rank: no finding there."""
    findings = lint_paths([megatron_root("0.19") / "megatron/training/training.py"]).findings
    assert not [f for f in findings if f.collective in ("track_mtp_metrics", "track_indexer_metrics")]


# ------------------------------------------------------------------------------------------- reproducer


def _collect_mtp_loss_calls() -> list[int]:
    tree = ast.parse(WORKER.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "collect_mtp_loss")
    return sorted(
        n.lineno
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "reduce_loss_in_tracker"
    )


def test_reproducer_buggy_gate_flagged_fixed_branch_not():
    buggy_line, fixed_line = _collect_mtp_loss_calls()
    proc = mtpdiag("lint", str(WORKER), "--json")
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    lines = {f["line"]: f for f in findings}
    assert buggy_line in lines
    assert lines[buggy_line]["collective"] == "reduce_loss_in_tracker"
    assert lines[buggy_line]["condition"] == "is_mp_src_rank_with_outputs()"
    assert fixed_line not in lines  # under is_pipeline_last_stage: the whole DP×CP group gets there


def test_console_output_names_file_line_and_condition():
    buggy_line, _ = _collect_mtp_loss_calls()
    proc = mtpdiag_here("lint", str(WORKER))
    assert proc.returncode == 1
    assert f"{WORKER}:{buggy_line}: reduce_loss_in_tracker under `is_mp_src_rank_with_outputs()`" in proc.stdout


# ----------------------------------------------------------------------------------------- rule cases


def test_rank_test_around_world_barrier_is_flagged():
    assert findings_in("""
        import torch.distributed as dist
        def f(rank):
            if rank == 0:
                dist.barrier()
    """) == [(5, "barrier", "rank == 0")]


def test_stage_test_splits_only_groups_that_span_stages():
    src = """
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu
        def f(t):
            if mpu.is_pipeline_last_stage():
                dist.all_reduce(t, group=mpu.get_data_parallel_group(with_context_parallel=True))
            if mpu.is_pipeline_last_stage():
                dist.all_reduce(t)
    """
    assert findings_in(src) == [(8, "all_reduce", "mpu.is_pipeline_last_stage()")]


def test_cp_test_splits_dp_cp_but_not_dp():
    src = """
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu
        def f(t):
            if mpu.get_context_parallel_rank() == 0:
                dist.all_reduce(t, group=mpu.get_data_parallel_group())
            if mpu.get_context_parallel_rank() == 0:
                dist.all_reduce(t, group=mpu.get_data_parallel_group(with_context_parallel=True))
    """
    assert [line for line, _, _ in findings_in(src)] == [8]


def test_early_return_ternary_while_and_short_circuit_gates():
    src = """
        import torch
        import torch.distributed as dist
        from torch.distributed import all_reduce as ar
        def early(self):
            if not self.is_mp_src_rank_with_outputs():
                return
            MTPLossLoggingHelper.reduce_loss_in_tracker()
        def ternary(t):
            return torch.distributed.all_reduce(t) if torch.distributed.get_rank() == 0 else None
        def loop():
            while dist.get_rank() < 2:
                dist.barrier()
        def short(rank, t):
            rank == 0 and ar(t)
    """
    found = findings_in(src)
    assert [(line, op) for line, op, _ in found] == [
        (8, "reduce_loss_in_tracker"),
        (10, "all_reduce"),
        (13, "barrier"),
        (15, "all_reduce"),
    ]
    assert found[0][2] == "self.is_mp_src_rank_with_outputs() [after the early exit at line 6]"


def test_matched_branches_and_rank_free_conditions_are_not_flagged():
    src = """
        import os
        import torch.distributed as dist
        def bcast(t, rank):
            if rank == 0:
                dist.broadcast(t, 0)
            else:
                dist.broadcast(t, 0)
        def pair(t, rank):
            if rank == 0:
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
        def rank_free(self, t):
            if self.enabled:
                dist.all_reduce(t)
        def deferred(rank):
            if rank == 0:
                def later():
                    dist.barrier()
                return later
        def lonely_send(t):
            if int(os.environ["RANK"]) == 0:
                dist.send(t, 1)
    """
    assert [(line, op) for line, op, _ in findings_in(src)] == [(24, "send")]


# Test input: engines shaped like verl's, collecting the MTP metrics through megatron's renamed helpers.
RENAMED_ENGINE = """\
    from megatron.core import parallel_state as mpu
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper as Helper
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper

    class MegatronEngine:
        def forward_backward_batch(self, data, loss_function, forward_only=False):
            losses_reduced = self.run(data)
            if self.model_config.mtp.enable and mpu.get_context_parallel_rank() == 0:
                Helper.reduce_metrics_in_tracker()
                losses_reduced[0]["metrics"] = dict(Helper.tracker)
            if mpu.is_pipeline_last_stage(ignore_virtual=True):
                Helper.track_mtp_metrics(1.0, 0, None)
            if mpu.is_pipeline_last_stage(ignore_virtual=True):
                DSAIndexerLossLoggingHelper.reduce_loss_in_tracker()
            if mpu.get_context_parallel_rank() == 0:
                self.helper.reduce_loss_in_tracker()
            return losses_reduced
"""


def test_renamed_mtp_helper_under_a_cp_gate_is_flagged_and_a_stage_gate_is_not():
    found = {
        line: (op, cond, reason)
        for line, op, cond, reason in [
            (f.line, f.collective, f.condition, f.reason)
            for f in lint_source(textwrap.dedent(RENAMED_ENGINE), "engine.py")
        ]
    }
    op, cond, reason = found.pop(9)
    assert (op, cond) == (
        "reduce_metrics_in_tracker",
        "self.model_config.mtp.enable and mpu.get_context_parallel_rank() == 0",
    )
    assert "dp_cp" in reason and "MTPLossLoggingHelper.reduce_metrics_in_tracker" in reason
    # The indexer's reduce starts on the pipeline group: a stage gate splits it, unlike the MTP one above.
    op, cond, reason = found.pop(14)
    assert (op, cond) == ("reduce_loss_in_tracker", "mpu.is_pipeline_last_stage(ignore_virtual=True)")
    assert "inside the pp group of reduce_loss_in_tracker" in reason and "DSAIndexerLossLoggingHelper" in reason
    # Line 12 (MTP under a stage gate) and line 16 (an unknown receiver's method of the same short name)
    # are not findings.
    assert found == {}


# ------------------------------------------------------------------------------------------------ CLI


def test_lint_walks_directories_and_skips_unparsable_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text(
        "import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n"
    )
    (tmp_path / "pkg" / "good.py").write_text("import torch.distributed as dist\ndist.barrier()\n")
    (tmp_path / "pkg" / "py2.py").write_text("print 'hello'\n")
    (tmp_path / "notes.txt").write_text("if rank == 0: dist.barrier()\n")
    proc = mtpdiag_here("lint", str(tmp_path), "--json")
    assert proc.returncode == 1
    findings = json.loads(proc.stdout)["findings"]
    assert [(Path(f["file"]).name, f["line"]) for f in findings] == [("bad.py", 3)]
    assert "skipped" in proc.stderr and "py2.py" in proc.stderr and "Traceback" not in proc.stderr


def test_lint_clean_tree_exits_zero(tmp_path):
    (tmp_path / "ok.py").write_text("import torch.distributed as dist\ndist.all_reduce(t)\n")
    proc = mtpdiag_here("lint", str(tmp_path))
    assert proc.returncode == 0 and "0 finding(s) in 1 file" in proc.stdout


@pytest.mark.parametrize("make", ["missing", "not-python"])
def test_lint_bad_input_is_one_line(tmp_path, make):
    path = tmp_path / "x.py"
    if make == "not-python":
        path.write_text("def broken(:\n")
    proc = mtpdiag("lint", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpdiag: error: ") and str(path) in lines[0]
