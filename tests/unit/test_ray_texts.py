"""What mtpdiag says of a Ray task's error or a Ray job's log: read from texts the real interpreter prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mtpdiag
from mtpdiag.capture import ray_job
from mtpdiag.capture.ray_cluster import last_line, missing_dependency, missing_mtpdiag


def _python_stderr(*argv: str, cwd) -> str:
    """What a Python without mtpdiag on its path (isolated, no site-packages) prints for ``argv``."""
    done = subprocess.run([sys.executable, "-I", "-S", *argv], capture_output=True, text=True, cwd=cwd, timeout=60)
    assert done.returncode != 0, done
    return done.stderr


@pytest.mark.parametrize(
    "argv", [("-m", "mtpdiag.capture.ray_job", "{}"), ("-m", "mtpdiag"), ("-c", "import mtpdiag.capture.ray_node")]
)
def test_a_python_without_mtpdiag_is_said_as_what_to_install(argv, tmp_path):
    stderr = _python_stderr(*argv, cwd=tmp_path)
    assert missing_mtpdiag(stderr) is not None and missing_mtpdiag(stderr).startswith("mtpdiag"), stderr
    assert "has no mtpdiag: pip install 'mtpdiag[ray]'" in ray_job._why(stderr), stderr


def test_another_missing_module_is_not_taken_for_mtpdiag(tmp_path):
    stderr = _python_stderr("-c", "import mtpdiag_is_not_this_one", cwd=tmp_path)
    assert missing_mtpdiag(stderr) is None
    assert ray_job._why(stderr) == "ModuleNotFoundError: No module named 'mtpdiag_is_not_this_one'"


def test_a_python_with_mtpdiag_but_not_its_dependencies_names_the_one_missing(tmp_path):
    """A Ray whose Python finds mtpdiag's source (a PYTHONPATH) but lacks what mtpdiag imports (msgspec)."""
    root = str(Path(mtpdiag.__file__).resolve().parents[1])
    stderr = _python_stderr(
        "-c", f"import sys; sys.path.insert(0, {root!r}); import mtpdiag.capture.ray_job", cwd=tmp_path
    )
    assert missing_mtpdiag(stderr) is None and missing_dependency(stderr) == "msgspec", stderr
    assert ray_job._why(stderr) == (
        "the Python that runs Ray on the head has mtpdiag but not its dependency msgspec: "
        "pip install 'mtpdiag[ray]' into the Python that runs Ray on every node"
    )


def test_the_last_line_of_a_traceback_is_the_error_not_a_frame(tmp_path):
    stderr = _python_stderr("-c", "def f():\n    raise ValueError('\\x1b[31mbad\\x1b[0m value')\nf()", cwd=tmp_path)
    assert "Traceback" in stderr and 'File "<string>"' in stderr
    assert last_line(stderr + "\n    \n") == "ValueError: bad value"  # colour codes go, blank lines are skipped


def test_an_empty_log_says_so():
    assert last_line("") == "" and last_line("\n  \n") == ""
    assert ray_job._why("\n") == "its log is empty"
