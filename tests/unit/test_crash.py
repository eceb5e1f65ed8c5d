"""Exit 70 keeps its evidence (issue #22): an internal error writes a crash file and names it in its one line.

The internal error is a real one: mtpdiag installed without its package data (a wheel built without
``report/assets``, which ``MANIFEST.in`` and ``[tool.setuptools.package-data]`` exist to prevent), asked for the
HTML report. The copy of the package runs with no test hook; the crash file must hold the traceback, the
versions, the command line with its values reduced to their shape and the input's shape, and no environment
value (a sentinel variable is set to check it).
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import mtpdiag
from mtpdiag.crash import KEEP, SHAPE, shaped_command_line
from support.captures import CAPTURES

SENTINEL = "s3cr3t-sentinel-7f41c2"  # an environment value: it must reach no crash file
HIDDEN = "hunter2-in-a-path"  # in a directory's name and a regular expression: values, reduced to their shape


@pytest.fixture(scope="module")
def broken_install(tmp_path_factory) -> Path:
    """mtpdiag without its HTML assets, importable from the returned directory."""
    root = tmp_path_factory.mktemp("install")
    shutil.copytree(Path(mtpdiag.__file__).parent, root / "mtpdiag", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "mtpdiag" / "report" / "assets" / "report.css").unlink()
    return root


def _analyze_html(install: Path, state: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    dumps = tmp_path / HIDDEN
    dumps.mkdir()
    for r in range(4):
        shutil.copy(f"{CAPTURES}/mtp_cp_pp/rank{r}.json", dumps / f"rank{r}.json")
    run_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MTPDIAG")},
        "PYTHONPATH": str(install),
        "XDG_STATE_HOME": str(state),
        "CRASH_TEST_SENTINEL": SENTINEL,
        **env,
    }
    argv = ["analyze", str(dumps), "--cp", "2", "--pp", "2", "--rank-from", f"{HIDDEN}/rank(\\d)", "--format", "html"]
    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", *argv], capture_output=True, text=True, env=run_env, cwd=tmp_path, timeout=300
    )
    return done, dumps


def _crash_path(done: subprocess.CompletedProcess) -> Path:
    assert done.returncode == 70, (done.returncode, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("mtpdiag: internal error: FileNotFoundError: ") and "Traceback" not in done.stderr
    assert "crash report: " in line and line.endswith("(set MTPDIAG_DEBUG=1 for a traceback)")
    return Path(line.split("crash report: ", 1)[1].split(" (set MTPDIAG_DEBUG", 1)[0])


def test_an_internal_error_writes_a_crash_file_with_its_evidence_and_no_environment_value(broken_install, tmp_path):
    state = tmp_path / "state"
    done, dumps = _analyze_html(broken_install, state, tmp_path)
    path = _crash_path(done)
    assert path.parent == state / "mtpdiag" and path.name.startswith("crash-") and path.name.endswith(".log")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="utf-8")
    assert f"mtpdiag: {mtpdiag.__version__}\n" in text
    assert f"python: {platform.python_version()} " in text
    assert "command: mtpdiag analyze <directory, 4 files> --cp 2 --pp 2 --rank-from <text, " in text
    assert "--format html\n" in text
    assert "  4 files, " in text and "formats: py-spy JSON x4" in text
    assert "Traceback (most recent call last):" in text and "FileNotFoundError" in text and "report.css" in text
    assert "in render" in text  # the frames of the crash, down to the renderer that failed
    assert SENTINEL not in text  # no environment value
    assert HIDDEN not in text and str(dumps) not in text  # the path and the regular expression: their shape only


def test_a_crash_file_that_cannot_go_to_the_state_directory_goes_to_the_temporary_one(broken_install, tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the state directory would be\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    done, _ = _analyze_html(broken_install, blocked, tmp_path, TMPDIR=str(temp))
    path = _crash_path(done)
    assert path.parent == temp / f"mtpdiag-{os.getuid()}"
    assert SENTINEL not in path.read_text(encoding="utf-8")


def test_values_that_could_carry_a_secret_are_reduced_to_their_shape(tmp_path):
    (tmp_path / "job.yaml").write_text("actor: {}\n")
    options = {"--ray": SHAPE, "--override": SHAPE, "--config": SHAPE, "--pid": KEEP, "--json": "flag"}
    argv = [
        "inspect",
        "--ray",
        "http://user:pa55word@head:8265",
        "--override=trainer.api_key=abc123",
        "--config",
        str(tmp_path / "job.yaml"),
        "--pid",
        "4242",
        "--json",
        "--token=abc123",
    ]
    shaped = shaped_command_line(argv, options)
    assert shaped == [
        "inspect",
        "--ray",
        "<text, 30 chars>",
        "--override=<text, 22 chars>",
        "--config",
        "<file, 10 B>",
        "--pid",
        "4242",
        "--json",
        "<unknown option>",
    ]
    assert not any("pa55word" in s or "abc123" in s or "job.yaml" in s for s in shaped)
