"""The suite's one conftest.

* Everything under ``tests/e2e/`` is marked ``e2e`` by its directory, so ``-m "not e2e"`` runs ``tests/unit/``
  alone, and no test outside ``tests/e2e/`` may start a job or attach to one: torchrun, py-spy, Ray, a network
  namespace (``no_jobs_outside_e2e`` fails the test that tries, in the test process; mtpdiag's CLI run on files
  is no job).
* ``unavailable`` is the one way a test says that something it needs is missing: a skip on a developer's
  machine, a failure in CI (``CI`` set), where every prerequisite must be there.
* ``tests/`` is on ``sys.path`` (this file's directory, pytest's rootdir-less "prepend" import mode), so both
  kinds import their shared helpers as ``support.*``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

E2E = Path(__file__).resolve().parent / "e2e"

# What starts or attaches to a job: programs, and ``python -m`` modules.
JOB_PROGRAMS = frozenset({"torchrun", "py-spy", "ray", "unshare", "nsenter"})
JOB_MODULES = frozenset({"torch.distributed.run", "ray"})


def unavailable(message: str) -> NoReturn:
    """Skip the test for want of ``message``'s prerequisite; in CI, fail it."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook applies -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def starts_a_job(args: object) -> str | None:
    """Why the command ``args`` (as given to ``subprocess.Popen``) starts or attaches to a job, or None."""
    argv = [os.fspath(a) for a in args] if isinstance(args, (list, tuple)) else [os.fspath(args)]  # type: ignore[arg-type]
    if not argv:
        return None
    program = os.path.basename(argv[0])
    if program in JOB_PROGRAMS:
        return program
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1] in JOB_MODULES:
            return f"python -m {argv[i + 1]}"
    return None


@pytest.fixture(autouse=True)
def no_jobs_outside_e2e(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside tests/e2e, starting a job is a test that belongs there: fail it, never run it."""
    if request.node.get_closest_marker("e2e") is not None:
        return
    real = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded(self: subprocess.Popen[bytes], args: object, *rest: object, **kwargs: object) -> object:
        why = starts_a_job(args)
        if why is not None:
            pytest.fail(f"a test outside tests/e2e started a job ({why}): move it to tests/e2e")
        return real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", guarded)
