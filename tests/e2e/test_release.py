"""Release hygiene: ``python -m build`` makes an sdist and a wheel; the wheel installs into a fresh venv without
torch, and the installed ``mtpdiag`` runs there (help, version, completion, a real analysis of a recorded hang).

The build and the venv are made once per test session in a temporary directory. The wheel's dependencies
come from PyPI through pip; in CI (``CI`` set) a failed download fails the tests, elsewhere it skips them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from conftest import unavailable
from support.captures import scenario_dir

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Venv:
    python: Path
    bin: Path
    home: Path  # a working directory outside the repo, so nothing is imported from the source tree


def _unavailable(why: str, done: subprocess.CompletedProcess | None = None) -> NoReturn:
    detail = f": {(done.stderr or done.stdout).strip().splitlines()[-1]}" if done is not None else ""
    unavailable(why + detail)


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    out = tmp_path_factory.mktemp("dist")
    # From a copy: setuptools writes mtpdiag.egg-info into the tree it builds, and the tests running beside this
    # one (the playbooks') check that nothing appears in the repository.
    source = tmp_path_factory.mktemp("source") / "mtpdiag"
    skip = shutil.ignore_patterns(".git", ".venv", "*_cache", ".hypothesis", "*.egg-info")
    shutil.copytree(REPO, source, ignore=skip)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        _unavailable("python -m build failed", done)
    (sdist,) = out.glob("mtpdiag-*.tar.gz")
    (wheel,) = out.glob("mtpdiag-*-py3-none-any.whl")
    return Built(sdist=sdist, wheel=wheel)


@pytest.fixture(scope="session")
def venv(built, tmp_path_factory) -> Venv:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root / "env")], check=True, timeout=300)
    python = root / "env" / "bin" / "python"
    # no PYTHONPATH: a source tree on it (with its egg-info) would make pip think mtpdiag is already installed
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(built.wheel)],
        capture_output=True,
        text=True,
        timeout=900,
        env=clean,
    )
    if done.returncode != 0:
        _unavailable("pip could not install the wheel with its dependencies", done)
    home = root / "home"
    home.mkdir()
    return Venv(python=python, bin=python.parent, home=home)


def run_in(venv: Venv, *cmd: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command of the venv, with only the venv on PATH and no PYTHONPATH leading back to the repo."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    clean["PATH"] = os.pathsep.join([str(venv.bin), "/usr/bin", "/bin"])
    return subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=300, cwd=venv.home, env={**clean, **(env or {})}
    )


def test_build_makes_an_sdist_and_a_wheel_of_the_same_version(built):
    from mtpdiag import __version__

    assert built.sdist.name == f"mtpdiag-{__version__}.tar.gz"
    assert built.wheel.name == f"mtpdiag-{__version__}-py3-none-any.whl"


def test_sdist_holds_no_fixtures_no_verl_code_and_no_git(built):
    with tarfile.open(built.sdist) as sdist:
        names = [m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name]
    assert "pyproject.toml" in names and "mtpdiag/cli.py" in names
    assert not [n for n in names if n == ".git" or n.startswith(".git/") or "/.git/" in n]
    assert not [n for n in names if n.startswith("tests/fixtures")]
    assert not [n for n in names if "transformer_impl.py" in n or n.startswith("verl/") or "/verl/" in n]
    assert not [n for n in names if n.endswith((".pyc", ".whl")) or "__pycache__" in n or ".hypothesis" in n]


def test_wheel_holds_the_package_only_and_needs_no_torch(built):
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/", 1)[0] for n in names} == {"mtpdiag", built.wheel.name.split("-py3")[0] + ".dist-info"}
    assert "mtpdiag/commands/inspect.py" in names and "mtpdiag/fix/verify/worker.py" in names
    # the HTML report's stylesheet and script are package data, read at run time
    assert {"mtpdiag/report/assets/report.css", "mtpdiag/report/assets/report.js"} <= set(names)
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    heavy = [line for line in requires if line.split()[1].startswith(("torch", "megatron"))]
    assert heavy and all('extra == "verify"' in line for line in heavy), requires


def test_fresh_venv_has_no_torch_and_the_installed_package(venv):
    done = run_in(venv, str(venv.python), "-c", "import mtpdiag.cli, mtpdiag; print(mtpdiag.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(venv.python.parent.parent)  # not the source tree
    torch = run_in(venv, str(venv.python), "-c", "import torch")
    assert torch.returncode != 0 and "No module named 'torch'" in torch.stderr


@pytest.mark.parametrize("args", [["--help"], ["inspect", "--help"], ["analyze", "--help"], ["verify", "--help"]])
def test_help_runs_in_the_fresh_venv(venv, args):
    done = run_in(venv, str(venv.bin / "mtpdiag"), *args)
    assert done.returncode == 0, done.stderr
    assert "Usage: mtpdiag" in done.stdout and "Traceback" not in done.stderr


def test_version_in_the_fresh_venv(venv, built):
    done = run_in(venv, str(venv.bin / "mtpdiag"), "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"mtpdiag {built.wheel.name.split('-')[1]}"


def test_installed_mtpdiag_diagnoses_a_recorded_hang_without_torch(venv):
    bundle = os.path.join(scenario_dir("mtp_cp_pp"), "bundle.json")
    done = run_in(venv, str(venv.bin / "mtpdiag"), "analyze", bundle, "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["findings"][0]["id"] == "mtp-cp-gated-reduce"


def test_shell_completion_script_and_completions(venv):
    """typer's completion: the script for bash, and the completions it asks the program for."""
    done = run_in(venv, str(venv.bin / "mtpdiag"), "--show-completion", "bash")
    assert done.returncode == 0, done.stderr
    assert "_MTPDIAG_COMPLETE=complete_bash" in done.stdout
    assert "complete -o default -F _mtpdiag_completion mtpdiag" in done.stdout
    asked = run_in(
        venv,
        str(venv.bin / "mtpdiag"),
        env={"_MTPDIAG_COMPLETE": "complete_bash", "COMP_WORDS": "mtpdiag ins", "COMP_CWORD": "1"},
    )
    assert asked.returncode == 0 and asked.stdout.split() == ["inspect"], (asked.stdout, asked.stderr)
