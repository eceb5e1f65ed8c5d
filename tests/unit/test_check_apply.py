"""`mtpdiag check` and `mtpdiag apply` against the real verl engine files of five releases."""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.fix.engine import EngineCheck, check_engine, classify_text
from mtpdiag.fix.rewrite import MPU_IMPORT, rewrite_engine
from support.jobs_e2e import run_cli_here as mtpdiag_here
from support.verl_wheels import ENGINE, verl_engine_file, verl_root

pytestmark = pytest.mark.verl

EXPECTED = {"0.7.0": "not-applicable", "0.7.1": "affected", "0.8.0": "fixed", "0.9.0": "fixed", "0.9.1": "fixed"}
EXIT = {"not-applicable": 0, "fixed": 0, "affected": 1, "unknown": 2}
BUGGY_TEST = "if self.model_config.mtp.enable and self.is_mp_src_rank_with_outputs():"


def mtpdiag(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh interpreter (`python -m mtpdiag`)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True, timeout=120, env=full_env
    )


def assert_one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpdiag: error: "), proc.stderr
    return lines[0]


@pytest.fixture
def engine_071(tmp_path: Path) -> Path:
    """A writable copy of verl 0.7.1's engine, in a tree of its own."""
    target = tmp_path / "transformer_impl.py"
    shutil.copyfile(verl_engine_file("0.7.1"), target)
    return target


def block_dump(text: str) -> str:
    """The MTP block of an engine, as an AST dump (comments and layout do not count)."""
    verdict = classify_text(text)
    assert verdict.block is not None, verdict.reason
    return ast.dump(verdict.block)


# ------------------------------------------------------------------------------------------------ check


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_check_classifies_each_release(version):
    result = check_engine(verl_engine_file(version))
    assert isinstance(result, EngineCheck)
    assert result.status == EXPECTED[version], result.reason
    assert result.verl_version == version  # read from the wheel's dist-info beside the package
    assert result.gate == {"affected": "buggy", "fixed": "fixed"}.get(result.status)
    if result.status == "not-applicable":
        assert result.lines is None
    else:
        first, last = result.lines
        block = verl_engine_file(version).read_text().splitlines()[first - 1 : last]
        assert block[0].lstrip().startswith("if self.model_config.mtp.enable and ")
        assert any("get_megatron_mtp_loss(n_micro_batch)" in line for line in block)


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_check_cli_json_and_exit_code(version):
    proc = mtpdiag_here("check", "--path", str(verl_engine_file(version)), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == EXIT[EXPECTED[version]], proc.stderr
    assert doc["schema"] == "mtpdiag.check/1"
    assert doc["status"] == EXPECTED[version]
    assert doc["verl_version"] == version
    assert doc["path"] == str(verl_engine_file(version))
    assert set(doc) == {"schema", "path", "verl_version", "status", "lines", "reason"}
    assert doc["reason"]


def test_check_console_names_the_next_step():
    proc = mtpdiag("check", "--path", str(verl_engine_file("0.7.1")))
    assert proc.returncode == 1
    assert "0.7.1" in proc.stdout and "AFFECTED" in proc.stdout
    assert "mtpdiag apply --path" in proc.stdout
    fixed = mtpdiag("check", "--path", str(verl_engine_file("0.8.0")))
    assert fixed.returncode == 0 and "mtpdiag apply" not in fixed.stdout


def test_check_finds_installed_verl_without_importing_it(tmp_path):
    """No --path: the engine comes from import resolution, and verl's __init__ must not run."""
    site = tmp_path / "site"
    shutil.copytree(verl_root("0.7.1"), site)
    marker = tmp_path / "verl-was-imported"
    (site / "verl" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit('verl must not be imported')\n"
    )
    proc = mtpdiag("check", "--json", env={"PYTHONPATH": str(site)})
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert doc["status"] == "affected"
    assert doc["verl_version"] == "0.7.1"
    assert Path(doc["path"]) == site / ENGINE
    assert not marker.exists()


def test_check_without_verl_installed_is_an_input_error(tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('verl') is None)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    if probe.stdout.strip() != "True":
        pytest.skip("verl is installed in this Python")
    line = assert_one_line_error(mtpdiag("check"))
    assert "--path" in line


@pytest.mark.parametrize("make", ["missing", "directory", "not-python"])
def test_check_bad_input_is_one_line(tmp_path, make):
    path = tmp_path / "engine.py"
    if make == "directory":
        path.mkdir()
    elif make == "not-python":
        path.write_bytes(b"\x00\x01 this is ] not python")
    line = assert_one_line_error(mtpdiag("check", "--path", str(path)))
    assert str(path) in line


# ------------------------------------------------------------------------------------------------ apply


def test_apply_gives_verl_080s_block_then_is_idempotent_and_reverts(engine_071):
    original = engine_071.read_bytes()
    proc = mtpdiag("apply", "--path", str(engine_071))
    assert proc.returncode == 0, proc.stderr
    assert f"-        {BUGGY_TEST}" in proc.stdout  # the unified diff
    assert (
        "+        if self.model_config.mtp.enable and mpu.is_pipeline_last_stage(ignore_virtual=True):" in proc.stdout
    )
    fixed = engine_071.read_bytes()
    backup = engine_071.with_name(engine_071.name + ".mtpdiag.bak")
    assert backup.read_bytes() == original

    # The MTP block is verl 0.8.0's, statement for statement.
    assert block_dump(fixed.decode()) == block_dump(verl_engine_file("0.8.0").read_text())
    # Everything outside the block keeps its bytes, comments included.
    first, last = check_engine(verl_engine_file("0.7.1")).lines
    old_lines, new_lines = original.decode().splitlines(True), fixed.decode().splitlines(True)
    grown = len(new_lines) - len(old_lines)
    assert new_lines[: first - 1] == old_lines[: first - 1]
    assert new_lines[last + grown :] == old_lines[last:]
    assert "# add mtp_losses" in "".join(new_lines[first - 1 : last + grown])
    assert "verl PR #5895" in "".join(new_lines[first - 1 : last + grown])

    check = mtpdiag("check", "--path", str(engine_071), "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["status"] == "fixed"

    again = mtpdiag("apply", "--path", str(engine_071))
    assert again.returncode == 0 and "already fixed" in again.stdout
    assert engine_071.read_bytes() == fixed

    revert = mtpdiag("apply", "--path", str(engine_071), "--revert")
    assert revert.returncode == 0, revert.stderr
    assert engine_071.read_bytes() == original
    assert not backup.exists()
    assert "no backup" in assert_one_line_error(mtpdiag("apply", "--path", str(engine_071), "--revert"))
    assert engine_071.read_bytes() == original


def test_apply_dry_run_changes_nothing(engine_071):
    original = engine_071.read_bytes()
    proc = mtpdiag_here("apply", "--path", str(engine_071), "--dry-run")
    assert proc.returncode == 0
    assert "+            if self.is_mp_src_rank_with_outputs():" in proc.stdout
    assert engine_071.read_bytes() == original
    assert sorted(p.name for p in engine_071.parent.iterdir()) == [engine_071.name]


def test_apply_keeps_the_backup_in_backup_dir(engine_071, tmp_path):
    original = engine_071.read_bytes()
    backups = tmp_path / "backups"
    assert mtpdiag_here("apply", "--path", str(engine_071), "--backup-dir", str(backups)).returncode == 0
    assert (backups / "transformer_impl.py.mtpdiag.bak").read_bytes() == original
    assert not engine_071.with_name("transformer_impl.py.mtpdiag.bak").exists()
    assert mtpdiag_here("apply", "--path", str(engine_071), "--revert", "--backup-dir", str(backups)).returncode == 0
    assert engine_071.read_bytes() == original


@pytest.mark.parametrize("version,words", [("0.8.0", "already fixed"), ("0.7.0", "collects no MTP loss")])
def test_apply_leaves_fixed_and_unrelated_engines_alone(tmp_path, version, words):
    target = tmp_path / "transformer_impl.py"
    shutil.copyfile(verl_engine_file(version), target)
    proc = mtpdiag_here("apply", "--path", str(target))
    assert proc.returncode == 0 and words in proc.stdout
    assert target.read_bytes() == verl_engine_file(version).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transformer_impl.py"]


def test_apply_refuses_an_unknown_shape(engine_071):
    text = engine_071.read_text()
    assert BUGGY_TEST in text
    engine_071.write_text(text.replace(BUGGY_TEST, "if self.model_config.mtp.enable and self._mtp_gate():"))
    mangled = engine_071.read_bytes()
    check = mtpdiag_here("check", "--path", str(engine_071), "--json")
    assert check.returncode == 2 and json.loads(check.stdout)["status"] == "unknown"
    assert "_mtp_gate" in json.loads(check.stdout)["reason"]
    assert_one_line_error(mtpdiag_here("apply", "--path", str(engine_071)))
    assert engine_071.read_bytes() == mangled
    assert sorted(p.name for p in engine_071.parent.iterdir()) == [engine_071.name]


def test_apply_refuses_an_affected_block_it_cannot_rewrite(engine_071):
    """An else branch on the gate: still affected, but not the shape apply knows."""
    text = engine_071.read_text()
    anchor = '            losses_reduced[0]["metrics"].update(metrics)\n'
    assert text.count(anchor) == 1
    engine_071.write_text(text.replace(anchor, anchor + "        else:\n            metrics = {}\n"))
    changed = engine_071.read_bytes()
    assert mtpdiag_here("check", "--path", str(engine_071)).returncode == 1
    line = assert_one_line_error(mtpdiag_here("apply", "--path", str(engine_071)))
    assert "else" in line
    assert engine_071.read_bytes() == changed


def test_apply_refuses_a_read_only_file(engine_071):
    original = engine_071.read_bytes()
    engine_071.chmod(0o444)
    try:
        line = assert_one_line_error(mtpdiag("apply", "--path", str(engine_071)))
        assert "read-only" in line
        assert engine_071.read_bytes() == original
        assert stat.S_IMODE(engine_071.stat().st_mode) == 0o444
        assert sorted(p.name for p in engine_071.parent.iterdir()) == [engine_071.name]
    finally:
        engine_071.chmod(0o644)


@pytest.mark.parametrize("make", ["missing", "directory", "not-python"])
def test_apply_bad_input_is_one_line(tmp_path, make):
    path = tmp_path / "engine.py"
    if make == "directory":
        path.mkdir()
    elif make == "not-python":
        path.write_text("def broken(:\n")
    assert_one_line_error(mtpdiag_here("apply", "--path", str(path)))
    if make == "not-python":
        assert path.read_text() == "def broken(:\n"


def test_apply_adds_the_mpu_import_when_missing(engine_071):
    text = engine_071.read_text()
    assert text.count(MPU_IMPORT) == 1
    engine_071.write_text(text.replace(MPU_IMPORT, ""))
    stripped = engine_071.read_bytes()
    rewrite = rewrite_engine(stripped, str(engine_071))
    assert rewrite.added_import
    fixed = rewrite.fixed.decode()
    assert fixed.count(MPU_IMPORT) == 1
    compile(fixed, str(engine_071), "exec")
    assert block_dump(fixed) == block_dump(verl_engine_file("0.8.0").read_text())
    # The import lands among the module's imports, before the first class.
    assert fixed.index(MPU_IMPORT) < fixed.index("\nclass ")


@pytest.mark.parametrize(
    "gate",
    [
        "if self.is_mp_src_rank_with_outputs():",
        "if (self.is_mp_src_rank_with_outputs()):",
        "if (\n            self.model_config.mtp.enable\n"
        "            and self.is_mp_src_rank_with_outputs()  # owner\n        ):",
        "if self.is_mp_src_rank_with_outputs() and self.model_config.mtp.enable:",
    ],
)
def test_apply_handles_other_spellings_of_the_buggy_gate(engine_071, gate):
    source = engine_071.read_text().replace(BUGGY_TEST, gate)
    assert check_engine_text(source) == "affected"
    fixed = rewrite_engine(source.encode(), "variant").fixed.decode()
    verdict = classify_text(fixed)
    assert verdict.status == "fixed"
    outer = verdict.block
    assert "is_pipeline_last_stage" in ast.unparse(outer.test)
    assert "is_mp_src_rank_with_outputs" not in ast.unparse(outer.test)
    nested = outer.body[1]
    assert isinstance(nested, ast.If) and ast.unparse(nested.test) == "self.is_mp_src_rank_with_outputs()"
    if "# owner" in gate:
        assert "# owner" in fixed  # a comment inside the condition survives


def check_engine_text(source: str) -> str:
    return classify_text(source).status


# Test input: verl 0.7.1's engine with its MTP collection spelled through megatron's helpers directly,
# renamed (reduce_metrics_in_tracker, megatron-core 0.19/main) or not, or through another class's method.
VERL_CALL = "metrics = get_megatron_mtp_loss(n_micro_batch)"
SPELLINGS = {
    "renamed": "MTPLossLoggingHelper.reduce_metrics_in_tracker()\n            metrics = {}",
    "tracker": "MTPLossLoggingHelper.track_mtp_metrics(1.0 / n_micro_batch, 0, None, None, metrics)",
}
IMPORT = "from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper\n"


def _respelled(engine: Path, spelling: str) -> str:
    text = engine.read_text()
    assert text.count(VERL_CALL) == 1 and text.count(MPU_IMPORT) == 1
    body = SPELLINGS[spelling]
    if spelling == "tracker":
        body = "metrics = {}\n            " + body
    return text.replace(VERL_CALL, body).replace(MPU_IMPORT, MPU_IMPORT + IMPORT)


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_check_and_apply_know_megatrons_mtp_helpers_by_their_new_names(engine_071, spelling):
    engine_071.write_text(_respelled(engine_071, spelling))
    check = json.loads(mtpdiag_here("check", "--path", str(engine_071), "--json").stdout)
    assert check["status"] == "affected", check["reason"]
    assert ("reduce_metrics_in_tracker" if spelling == "renamed" else "track_mtp_metrics") in check["reason"]
    if spelling == "tracker":  # `metrics = {}` comes first: not the shape apply rewrites
        before = engine_071.read_bytes()
        assert "first statement" in assert_one_line_error(mtpdiag_here("apply", "--path", str(engine_071)))
        assert engine_071.read_bytes() == before
        return
    assert mtpdiag_here("apply", "--path", str(engine_071)).returncode == 0
    verdict = classify_text(engine_071.read_text())
    assert verdict.status == "fixed", verdict.reason
    assert "is_pipeline_last_stage" in ast.unparse(verdict.block.test)
    nested = [n for n in verdict.block.body if isinstance(n, ast.If)]
    assert [ast.unparse(n.test) for n in nested] == ["self.is_mp_src_rank_with_outputs()"]


def test_the_indexers_reduce_is_not_an_mtp_collection(engine_071):
    """DSAIndexerLossLoggingHelper.reduce_loss_in_tracker shares the MTP reduce's short name only."""
    text = engine_071.read_text().replace(
        VERL_CALL, "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker()\n            metrics = {}"
    )
    verdict = classify_text(text)
    assert verdict.status == "not-applicable", verdict.reason


def test_apply_refuses_when_mpu_means_something_else(engine_071):
    text = engine_071.read_text()
    engine_071.write_text(text.replace(MPU_IMPORT, "import numpy as mpu\n"))
    before = engine_071.read_bytes()
    assert "mpu" in assert_one_line_error(mtpdiag_here("apply", "--path", str(engine_071)))
    assert engine_071.read_bytes() == before


def test_revert_refuses_a_file_changed_after_apply(engine_071):
    assert mtpdiag_here("apply", "--path", str(engine_071)).returncode == 0
    with engine_071.open("a") as f:
        f.write("# edited by hand\n")
    edited = engine_071.read_bytes()
    assert "changed since" in assert_one_line_error(mtpdiag_here("apply", "--path", str(engine_071), "--revert"))
    assert engine_071.read_bytes() == edited


def test_check_apply_lint_never_import_torch_megatron_or_verl(engine_071, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import runpy, sys\n"
        "for argv in (['check', '--path', sys.argv[1]], ['apply', '--dry-run', '--path', sys.argv[1]],\n"
        "             ['lint', sys.argv[1]]):\n"
        "    sys.argv = ['mtpdiag', *argv]\n"
        "    try:\n"
        "        runpy.run_module('mtpdiag', run_name='__main__')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'verl'))\n"
        "print('HEAVY', heavy)\n"
    )
    import mtpdiag  # the probe imports this mtpdiag, installed or not

    source_root = str(Path(mtpdiag.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(script), str(engine_071)], capture_output=True, text=True, timeout=120, env=env
    )
    assert "HEAVY []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
