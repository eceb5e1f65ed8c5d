"""The suite's own rules (tests/conftest.py): tests/e2e is marked e2e by its directory, and nothing outside it
starts a job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import E2E, starts_a_job


def test_a_test_outside_e2e_that_starts_py_spy_or_torchrun_fails_before_anything_runs(tmp_path):
    ran = tmp_path / "ran"
    for argv in (
        ["py-spy", "dump", "--pid", "1"],
        [sys.executable, "-m", "torch.distributed.run", "x.py"],
        ["torchrun", "--standalone", "x.py"],
        ["ray", "start"],
    ):
        with pytest.raises(pytest.fail.Exception, match="move it to tests/e2e"):
            subprocess.run([*argv, f"--touch={ran}"], capture_output=True, timeout=30)
    assert not ran.exists()


def test_what_counts_as_starting_a_job():
    assert starts_a_job(["/opt/venv/bin/py-spy", "dump", "--pid", "7"]) == "py-spy"
    assert starts_a_job(("unshare", "--net", "true")) == "unshare"
    assert starts_a_job([sys.executable, "-m", "ray", "start"]) == "python -m ray"
    assert starts_a_job([sys.executable, "-m", "mtpdiag", "analyze", "bundle.json"]) is None
    assert starts_a_job([sys.executable, "-c", "print(1)"]) is None
    assert starts_a_job("chromium") is None


def test_every_collected_test_under_tests_e2e_is_marked_e2e_and_none_elsewhere(request):
    for item in request.session.items:
        in_e2e = E2E in Path(item.path).resolve().parents
        assert (item.get_closest_marker("e2e") is not None) == in_e2e, item.nodeid
