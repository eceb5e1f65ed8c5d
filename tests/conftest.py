"""The suite's one conftest.

* Everything under ``tests/e2e/`` is marked ``e2e`` by its directory, so ``-m "not e2e"`` runs ``tests/unit/``
  alone, and no test outside ``tests/e2e/`` may start a job or attach to one: torchrun, py-spy, Ray, a network
  namespace (``no_jobs_outside_e2e`` fails the test that tries, in the test process; mtpdiag's CLI run on files
  is no job).
* ``unavailable`` is the one way a test says that something it needs is missing: a skip on a developer's
  machine, a failure in CI (``CI`` set), where every prerequisite must be there.
* ``tests/`` is on ``sys.path`` (this file's directory, pytest's rootdir-less "prepend" import mode), so both
  kinds import their shared helpers as ``support.*``.
* Every e2e test gets an ``xdist_group`` for ``pytest -n N --dist loadgroup`` (``scripts/test.sh``): one per
  module (its module-scoped jobs start once), ``canonical-hang`` for the tests that read the session's one
  canonical hung job (``canonical_hang``, ``support/canonical_hang.py``), two ``timing-*`` groups for the tests
  whose result depends on how fast a job or the machine runs (watch, spinning host syncs, run: one at a time in
  each),
  and ``ray`` for the tests marked ``ray``. ``scripts/test.sh`` runs those in a run of their own (``-m "e2e and
  ray"``, no workers) beside the unit tier and then the e2e tier, in a PID namespace of their own (``inspect
  --all`` must find only the Ray job's ranks) and in a CPU group of eight times the e2e tier's weight (a Ray
  head's job server must start within a fixed 20 s, which it missed beside the e2e tier without one).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

# The console report wraps at the terminal's width (report.terminal_width: 100-200 columns, 140 without a
# terminal). pytest-xdist's workers see COLUMNS=80 and a developer's terminal has its own width, so the suite
# pins the width CI sees without a terminal: tests that read the console output then read the same lines in
# any of these ways of running them (and the CLI subprocesses they start inherit it).
os.environ["COLUMNS"] = "140"

E2E = Path(__file__).resolve().parent / "e2e"

# Modules whose tests read how fast things move (watch's stall windows, CPU burnt while spinning), in two serial
# groups: within each, one test at a time; the two side by side, as each already runs beside the other groups'
# jobs (a loaded node is where watch and run must hold). The split keeps the groups near equal (CI's e2e tier
# lasts as long as its longest group: one timing group was 1045 of its 1049 s). The starved-py-spy module
# (test_capture_under_load_e2e) makes its own load and is a group of its own, as any module, and so is
# test_run_multinode_e2e (its two `run`s on 2-rank jobs, 65 s of CI-35's timing-run, whose chain ended the tier
# with the CPU idle). CI-76's chains: gpu_hang 369 s + watch 103 + nccl_behaviour 102 = 574 s, ended the tier with
# the other workers done 7-54 s before it; run 373. watch's tests (`watch` itself) now follow run's: 471 and 476.
TIMING_GROUPS = {
    "timing-watch": frozenset({"test_gpu_hang_e2e", "test_nccl_behaviour_e2e"}),
    "timing-run": frozenset({"test_run_e2e", "test_watch_e2e"}),
}

# The e2e groups that take longest, longest first (CI-22 and the stress runs at f9ed6c1, the group's summed test
# time: timing-watch 755 s under stress, timing-run 500, test_reproducers_e2e 409, test_lookalikes_e2e 376,
# test_playbooks 135, test_hang_reproducers_e2e 93, test_release 91, canonical-hang 76, test_verify_e2e 51; CI-28:
# test_capture_under_load_e2e about 150 of timing-run's, which ended the tier 150 s after the CPU went idle, now a
# group of its own). xdist
# hands each worker the next group in the order the items come (``--no-loadscope-reorder``; its default order is
# by the number of tests, which started timing-run fifth, after 300 s, and left it alone at the tier's end): the
# longest first, so that no long group starts last. The groups not named here follow, in collection order.
# canonical-hang holds the playbooks' runs and the Flight Recorder tests too since they read the canonical hang
# (CI-59: the playbooks' two runs 137 s, the canonical hang's own tests and the Flight Recorder's about 100).
LONGEST_GROUPS_FIRST = (
    "timing-watch",
    "timing-run",
    "test_reproducers_e2e",
    "test_lookalikes_e2e",
    "canonical-hang",
    "test_capture_under_load_e2e",
    "test_run_multinode_e2e",
    "test_hang_reproducers_e2e",
    "test_release",
    "test_verify_e2e",
    "test_playbooks",
)

# What starts or attaches to a job: programs, and ``python -m`` modules.
JOB_PROGRAMS = frozenset({"torchrun", "py-spy", "ray", "unshare", "nsenter"})
JOB_MODULES = frozenset({"torch.distributed.run", "ray"})


def unavailable(message: str) -> NoReturn:
    """Skip the test for want of ``message``'s prerequisite; in CI, fail it."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def pytest_configure() -> None:
    """SIGTERM (``scripts/test.sh`` ending the Ray tests when the unit tier fails, a CI cancel) ends the run as
    Ctrl-C does: the fixtures' teardowns run, so no job or Ray cluster of a test outlives it."""

    def interrupt(signum: int, _frame: object) -> NoReturn:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook applies -m, and before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: dict[str, str] = {}
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            groups[item.nodeid] = xdist_group(item)
            item.add_marker(pytest.mark.xdist_group(name=groups[item.nodeid]))
    if groups:
        items.sort(key=lambda item: _group_rank(groups.get(item.nodeid)))  # stable: each group keeps its order


def _group_rank(group: str | None) -> int:
    """Where a test's group comes in the run: the unit tests, then LONGEST_GROUPS_FIRST, then the other groups."""
    if group is None:
        return -1
    return LONGEST_GROUPS_FIRST.index(group) if group in LONGEST_GROUPS_FIRST else len(LONGEST_GROUPS_FIRST)


def xdist_group(item: pytest.Item) -> str:
    """The xdist group of an e2e test: see the module's docstring."""
    module = Path(item.path).stem
    if "canonical_hang" in getattr(item, "fixturenames", ()) or item.get_closest_marker("canonical_hang"):
        return "canonical-hang"
    if item.get_closest_marker("ray"):
        return "ray"
    for group, modules in TIMING_GROUPS.items():
        if module in modules:
            return group
    return module


# The canonical hang while it runs (at most one): the hook below ends it after the last test of its group.
_canonical_jobs: list[Any] = []
_canonical_ended: list[bool] = []


@pytest.fixture(scope="session")
def canonical_hang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's one canonical hung job (``support/canonical_hang.py``), for the tests that only read it."""
    from support import canonical_hang as canonical

    folder = tmp_path_factory.mktemp("canonical-hang")
    job = canonical.start(folder)
    _canonical_jobs.append(job)
    try:
        yield canonical.hung(job, folder)
    finally:
        _end_canonical_hang()


def _end_canonical_hang() -> None:
    while _canonical_jobs:
        _canonical_jobs.pop().kill()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _canonical_ended and _in_canonical_group(item):
        pytest.fail("the canonical hang ended after the last test of its group: its tests must run together")


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The canonical hang ends with the last test of its group, not with the session: the group's tests run
    together (one xdist group, sorted together), and a hung world left running costs its worker's session about
    7% of a core (each rank's 21 gloo device loops wake 100 times a second) for the rest of the tier."""
    if _canonical_jobs and _in_canonical_group(item) and (nextitem is None or not _in_canonical_group(nextitem)):
        _end_canonical_hang()
        _canonical_ended.append(True)


def _in_canonical_group(item: pytest.Item) -> bool:
    return E2E in Path(item.path).resolve().parents and xdist_group(item) == "canonical-hang"


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
