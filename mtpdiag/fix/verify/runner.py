"""Launch a verify world per gate, watch it, diagnose it if it hangs, and never leave a worker behind.

A hang is called as soon as every live worker's main thread has been asleep, using no CPU, for
``quiet_s`` seconds and two stack samples taken across that window are the same; the gloo timeout is
never waited for. (Asleep matters: on a busy machine a starved thread also uses no CPU.)
The second sample is diagnosed with mtpdiag's own analysis, then the whole job is SIGKILLed. Where
stacks cannot be read at all (no ptrace), the CPU evidence alone calls the hang, undiagnosed.
torch and megatron-core are imported only by the workers, never here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypedDict

from mtpdiag.analysis.stall import cpu_moved
from mtpdiag.capture import procfs
from mtpdiag.fix.verify import (
    OUTCOME_COMPLETED,
    OUTCOME_DEADLOCK,
    OUTCOME_ERROR,
    MetricWrite,
    RunResult,
    check_metric,
)
from mtpdiag.fix.verify.launch import TICK_NS, Job, kill_pids, main_thread_cpu, start_torchrun
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Report, Snapshot
from mtpdiag.vocabulary.states import EngineGate, Outcome, ProcessState

WORKER_SCRIPT = str(Path(__file__).with_name("worker.py"))
CONCURRENT_WORKERS = 8  # run several worlds at once only while their workers fit this many processes
LAYOUT_SOURCE = "verify"


@dataclass(frozen=True)
class WatchSettings:
    """How a run is watched. Times in seconds."""

    quiet_s: float = 2.5  # main threads flat this long, with unchanged stacks: a deadlock
    first_look_s: float = 1.0  # main threads flat this long: take the first stack sample
    poll_s: float = 0.2
    timeout_s: float = 180.0  # a run that neither finishes nor hangs by then is an error
    capture_timeout_s: float = 10.0
    agent_grace_s: float = 1.0  # after every rank exited, how long torchrun may take to exit itself


@dataclass(frozen=True)
class RunSpec:
    """One world to run: the engine as the user named it, and the gate it has."""

    engine: str
    gate: str


def run_all(
    layout: ParallelLayout,
    specs: Iterable[RunSpec],
    settings: WatchSettings = WatchSettings(),
    on_result: Callable[[RunResult], None] | None = None,
) -> tuple[RunResult, ...]:
    """Run every spec's world (concurrently when they are small) and return results in spec order."""
    specs = list(specs)
    concurrent = layout.world_size * len(specs) <= CONCURRENT_WORKERS
    runs: list[_WatchedRun] = []
    results: dict[int, RunResult] = {}
    with _sigterm_as_interrupt():
        try:
            pending = list(enumerate(specs))
            active: list[tuple[int, _WatchedRun]] = []
            while pending or active:
                while pending and (concurrent or not active):
                    index, spec = pending.pop(0)
                    run = _WatchedRun(spec, layout, settings)
                    runs.append(run)
                    active.append((index, run))
                    run.start()
                for index, run in list(active):
                    result = run.poll()
                    if result is not None:
                        active.remove((index, run))
                        results[index] = result
                        if on_result is not None:
                            on_result(result)
                if active:
                    time.sleep(settings.poll_s)
        finally:
            for run in runs:
                run.close()
    return tuple(results[i] for i in range(len(specs)))


class _WatchedRun:
    """One torchrun world and what has been seen of it so far (mutable; private to the runner)."""

    def __init__(self, spec: RunSpec, layout: ParallelLayout, settings: WatchSettings) -> None:
        self.spec, self.layout, self.settings = spec, layout, settings
        self.out_dir = tempfile.mkdtemp(prefix=f"mtpdiag-verify-{spec.gate}-")
        self.job: Job | None = None
        self.started = self.started_wall = 0.0
        self.seen: set[int] = set()
        self.ticks: dict[int, int | None] = {}
        self.flat_since = 0.0
        self.looked = False  # the first stack sample of the current quiet spell was taken
        self.first_look: Snapshot | None = None
        self.all_exited: float | None = None
        self.phases: dict[str, float] = {}

    def start(self) -> None:
        layout = self.layout
        args = [
            "--tp",
            str(layout.tp),
            "--cp",
            str(layout.cp),
            "--pp",
            str(layout.pp),
            "--ep",
            str(layout.ep),
            "--order",
            layout.order,
            "--gate",
            self.spec.gate,
            "--out",
            self.out_dir,
            "--timeout-s",
            str(int(self.settings.timeout_s + 60)),
        ]
        if layout.etp is not None:
            args += ["--etp", str(layout.etp)]
        if layout.vpp is not None:
            args += ["--vpp", str(layout.vpp)]
        self.started, self.started_wall = time.monotonic(), time.time()
        self.flat_since = self.started
        self.job = start_torchrun(
            WORKER_SCRIPT, args, nproc=layout.world_size, log_path=os.path.join(self.out_dir, "torchrun.log")
        )

    def poll(self) -> RunResult | None:
        """One look at the job: a result once it finished, hung or ran out of time, else None."""
        assert self.job is not None
        now = time.monotonic()
        code = self.job.proc.poll()
        if code is not None:
            return self._finished(code, now)
        if now - self.started > self.settings.timeout_s:
            return self._result(
                OUTCOME_ERROR, now, error=f"neither finished nor hung within {self.settings.timeout_s:g} s"
            )
        live = self._live_workers()
        if len(self.seen) < self.layout.world_size:
            return None  # still starting: a hang is judged on the whole world only
        if not live:  # every rank exited; torchrun's own shutdown says nothing about the gate
            if self.all_exited is None:
                self.all_exited = now
            elif now - self.all_exited >= self.settings.agent_grace_s:
                return self._finished(None, now)
            return None
        ticks = main_thread_cpu(live)
        if cpu_moved(self.ticks, ticks, TICK_NS) or not _all_blocked(live):
            # A runnable main thread with flat CPU time is starved (a busy machine), not blocked.
            self.ticks, self.flat_since, self.looked = ticks, now, False
            return None
        flat = now - self.flat_since
        if not self.looked and flat >= self.settings.first_look_s:
            self.first_look, _ = self._capture(live)
            self.looked = True
        elif self.looked and flat >= self.settings.quiet_s:
            began = time.monotonic()
            second, error = self._capture(live)
            self.phases["capture"] = time.monotonic() - began
            still = not cpu_moved(ticks, main_thread_cpu(live), TICK_NS) and _all_blocked(live)
            # Stacks that cannot be read at all (no ptrace here) leave the CPU evidence to decide.
            if second is not None and self.first_look is not None:
                same = _stacks(second) == _stacks(self.first_look)
            else:
                same = second is None and self.first_look is None
            if still and same:
                return self._deadlock(second, now, error)
            self.first_look, self.flat_since = second, time.monotonic()
        return None

    def close(self) -> None:
        """Kill whatever is left of the job and remove the result directory."""
        self._kill()
        shutil.rmtree(self.out_dir, ignore_errors=True)

    def _kill(self) -> None:
        """Job.kill while the agent lives (its pid is still ours), then a sweep for strays.

        The sweep kills any process whose command line names both the worker script and this run's
        result directory: it catches a job interrupted before ``start`` returned it, and workers
        orphaned by an agent that died. Pids are never killed on the strength of an old listing,
        since a reaped pid may already belong to someone else.
        """
        if self.job is not None and self.job.proc.poll() is None:
            self.job.kill()
        for _ in range(3):
            strays = [
                pid
                for pid in procfs.all_pids()
                if WORKER_SCRIPT in (argv := procfs.read_cmdline(pid) or []) and self.out_dir in argv
            ]
            if not strays:
                return
            kill_pids(strays, wait_s=0.1)

    # -------------------------------------------------------------- outcomes

    def _finished(self, code: int | None, now: float) -> RunResult:
        """The job exited with ``code``, or (None) every rank exited and torchrun is still closing."""
        done = _read_results(self.out_dir, "done")
        ready = _read_results(self.out_dir, "ready")
        if done and len(ready) == self.layout.world_size:
            last_done = max(d["time"] for d in done)
            self.phases["collect"] = last_done - max(r["time"] for r in ready)
            self.phases["teardown"] = time.time() - last_done  # until torchrun exits (or the grace ends)
        all_done = len(done) == self.layout.world_size
        if code == 0 and all_done:
            return self._result(OUTCOME_COMPLETED, now)
        if code is None and all_done:
            note = (
                f"every rank finished cleanly; torchrun was still shutting down "
                f"{self.settings.agent_grace_s:g} s later and was killed"
            )
            return self._result(OUTCOME_COMPLETED, now, notes=(note,))
        how = f"exited with {code}" if code is not None else "lost its workers"
        return self._result(
            OUTCOME_ERROR,
            now,
            error=f"the job {how} after {len(done)} of {self.layout.world_size} ranks finished{self._log_tail()}",
        )

    def _deadlock(self, snapshot: Snapshot | None, detected: float, capture_error: str | None) -> RunResult:
        self.phases["hang_detection"] = detected - self.flat_since
        if snapshot is None:
            note = f"no diagnosis: the stacks could not be captured ({capture_error or 'unknown reason'})"
            return self._result(OUTCOME_DEADLOCK, detected, notes=(note,))
        began = time.monotonic()
        report, why = _diagnose(snapshot, self.layout)
        self.phases["diagnosis"] = time.monotonic() - began
        return self._result(OUTCOME_DEADLOCK, detected, report=report, notes=(why,) if why else ())

    def _result(
        self,
        outcome: Outcome,
        at: float,
        report: Report | None = None,
        error: str | None = None,
        notes: tuple[str, ...] = (),
    ) -> RunResult:
        ready = _read_results(self.out_dir, "ready")
        if len(ready) == self.layout.world_size:
            self.phases["startup"] = max(r["time"] for r in ready) - self.started_wall
        writes = [
            MetricWrite(rank=int(m["rank"]), value=float(m["value"]), avg_group=tuple(int(r) for r in m["avg_group"]))
            for m in _read_results(self.out_dir, "metric")
        ]
        seconds = at - self.started
        if self.job is not None and self.job.proc.poll() is None:
            began = time.monotonic()
            self._kill()
            self.phases["cleanup"] = time.monotonic() - began
        return RunResult(
            engine=self.spec.engine,
            gate=EngineGate(self.spec.gate),
            outcome=outcome,
            seconds=seconds,
            metric=check_metric(self.layout, writes),
            report=report,
            phases=dict(self.phases),
            error=error,
            notes=notes,
        )

    # -------------------------------------------------------------- looking

    def _live_workers(self) -> list[int]:
        assert self.job is not None
        pids = self.job.workers()
        self.seen.update(pids)
        return [p for p in pids if (s := procfs.read_stat(p)) is not None and s.state != ProcessState.ZOMBIE]

    def _capture(self, pids: list[int]) -> tuple[Snapshot | None, str | None]:
        """mtpdiag's own capture of the workers, or None and why it failed."""
        from mtpdiag.capture import capture

        try:
            return capture(pids=pids, timeout=self.settings.capture_timeout_s), None
        except Exception as exc:  # nothing captured (exited, no ptrace): the caller decides what it means
            return None, f"{type(exc).__name__}: {exc}"

    def _log_tail(self, lines: int = 4) -> str:
        try:
            with open(os.path.join(self.out_dir, "torchrun.log"), errors="replace") as f:
                text = [line.strip() for line in f if line.strip() and "warn" not in line.lower()]
        except OSError:
            return ""
        return (": " + " | ".join(text[-lines:])) if text else ""


def _all_blocked(pids: list[int]) -> bool:
    """Every main thread asleep (S) or in uninterruptible wait (D), as /proc/PID/stat reports it."""
    return all(
        (stat := procfs.read_stat(pid)) is not None and stat.state in (ProcessState.SLEEPING, ProcessState.DISK)
        for pid in pids
    )


def _stacks(snapshot: Snapshot | None) -> dict[int | None, tuple[tuple[str, str, int], ...]]:
    """Each worker's main-thread stack, as (function, file, line) tuples, to compare two samples."""
    if snapshot is None:
        return {}
    out: dict[int | None, tuple[tuple[str, str, int], ...]] = {}
    for c in snapshot.captures:
        main = c.main_thread
        out[c.pid] = tuple((f.function, f.file, f.line) for f in main.frames) if main else ()
    return out


def _diagnose(snapshot: Snapshot, layout: ParallelLayout) -> tuple[Report | None, str | None]:
    """mtpdiag's own diagnosis of the hung world; on failure a note instead, never an exception."""
    try:
        from mtpdiag.analysis import diagnose

        return diagnose(snapshot, layout, LAYOUT_SOURCE), None
    except Exception as exc:  # the verdict (a deadlock) stands even when the diagnosis cannot be made
        return None, f"no diagnosis: {type(exc).__name__}: {exc}"


class _WorkerResult(TypedDict, total=False):
    """A ``<kind>-<rank>.json`` as ``worker.write_result`` writes it: rank and time, then the kind's payload."""

    rank: int
    time: float
    coords: dict[str, int]  # ready
    name: str  # metric
    value: float  # metric
    avg_group: list[int]  # metric


def _read_results(out_dir: str, kind: str) -> list[_WorkerResult]:
    """Every ``<kind>-<rank>.json`` the workers wrote (complete files only: they are renamed into place)."""
    out: list[_WorkerResult] = []
    for name in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else ():
        if name.startswith(f"{kind}-") and name.endswith(".json"):
            try:
                with open(os.path.join(out_dir, name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return out


class _sigterm_as_interrupt:
    """While running worlds, turn SIGTERM into KeyboardInterrupt so the cleanup in ``finally`` runs."""

    def __enter__(self) -> None:
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _raise_interrupt)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt
