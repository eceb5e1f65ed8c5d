"""``mtpdiag run [OPTIONS] -- COMMAND...``: launch a job so that a hang is caught, explained and saved on its own.

The command (``torchrun …``, ``python -m …``, ``deepspeed …``) runs as a child in a process group of its own, with
the Flight Recorder switched on and pointed into the run directory (``pipeline.run_dir``), its stdout and stderr
untouched (inherited), SIGINT and SIGTERM forwarded to its group, and its exit code passed through. Meanwhile the
Watcher (``pipeline.watcher``) samples its ranks as ``watch`` does, arms at their first progress, and on a hang
captures every rank, asks for their Flight Recorder dumps through the pipe, diagnoses, writes the reports into
the run directory and then does what ``--on-hang`` says. mtpdiag's own errors are logged there and stop the
watching, never the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from mtpdiag import pipeline
from mtpdiag.commands import options as o
from mtpdiag.errors import EXIT_PROBLEM, InputError, NothingCaptured
from mtpdiag.model import Report, Snapshot
from mtpdiag.pipeline import multinode, run_files, run_ray
from mtpdiag.pipeline.run_dir import RunDir, default_dir, flight_recorder_env, utc
from mtpdiag.pipeline.shared_out import SharedOut
from mtpdiag.pipeline.watcher import JobEnded, Watcher, sampling_summary
from mtpdiag.vocabulary.states import WatchPhase as Phase

# 10 s: three of the slowest healthy device steps we test (3 s: their host waits at one sync line the whole step),
# which keeps a hang's call (the window, a sample, the capture and the dumps' request) within 15 s of the last
# progress; NCCL's watchdog waits 600 s by default (docs/design.md, "mtpdiag run").
HANG_AFTER_S = 10.0
PAUSE_AFTER_S = 1800.0  # a checkpoint write of minutes is a pause; half an hour of it is a hang
MAX_FAILURES = 30  # samples that fail in a row (every rank unreadable) before the watching stops
EXIT_POLL_S = 0.05  # between samples, how often the ranks are checked for one that died


class OnHang(str, Enum):
    KEEP = "keep"
    KILL = "kill"
    EXIT = "exit"


def run(
    command: list[str] | None = typer.Argument(None, metavar="-- COMMAND...", help="The job's command line."),
    out: Path | None = typer.Option(
        None, "--out", help="The run directory (default ./mtpdiag-run-TIME/); one run per directory, or per node."
    ),
    host: str | None = typer.Option(
        None,
        "--host",
        help="This node's name in an --out every node shares (one run per node, each in OUT/HOST/; a hang in "
        "OUT/hang-TIME/). Default: the hostname when the job spans nodes (torchrun --nnodes N>1, an srun step "
        "over several nodes), else none: a single node's layout.",
    ),
    on_hang: OnHang = typer.Option(
        OnHang.KEEP,
        "--on-hang",
        case_sensitive=False,
        help="After the reports are written: keep (leave the job, watch for recovery), kill (end the whole "
        "process tree, exit 1) or exit (leave the job running, exit 1).",
    ),
    hang_after: float = typer.Option(
        HANG_AFTER_S,
        "--hang-after",
        min=1.0,
        help="Call a hang after this many seconds in which no rank's stack changed and no collective completed.",
    ),
    pause_after: float = typer.Option(
        PAUSE_AFTER_S,
        "--pause-after",
        min=1.0,
        help="How long a quiet phase in which every rank does I/O, sleeps or runs its own code (a checkpoint "
        "write, an evaluation) may last before it is called a hang.",
    ),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between samples."),
    native: bool = o.NATIVE,
    native_timeout: float = o.NATIVE_TIMEOUT,
    timeout: float = o.TIMEOUT,
    tp: int | None = o.TP,
    cp: int | None = o.CP,
    pp: int | None = o.PP,
    ep: int | None = o.EP,
    etp: int | None = o.ETP,
    vpp: int | None = o.VPP,
    order: str | None = o.ORDER,
    config: str | None = o.CONFIG,
    override: list[str] | None = o.OVERRIDE,
    ray: str | None = typer.Option(
        None,
        "--ray",
        metavar="[ADDRESS]",
        help="The job is a Ray job (found by itself for ray job submit and verl's main_ppo): give its actors the "
        "Flight Recorder's variables through Ray's runtime_env, and watch every node as watch --ray does. ADDRESS "
        "(default auto) is the cluster's, as for watch --ray.",
    ),
    ray_timeout: float = o.RAY_TIMEOUT,
) -> None:
    """Run a job (torchrun, python -m, deepspeed, …) and diagnose its hang within seconds, into a run directory."""
    if not command:
        raise InputError("give the job's command after --: mtpdiag run [OPTIONS] -- torchrun ... train.py")
    run_ray.check_address(ray)
    base = out if out is not None else default_dir()
    node = multinode.node_label(host, command, os.environ, os.uname().nodename)
    run_dir = RunDir.claim(base / node if node is not None else base)
    shared = SharedOut(base, node, run_dir, multinode.same_hang_window(hang_after)) if node is not None else None
    added, kept = flight_recorder_env(os.environ, str(run_dir.path))
    for name, (theirs, ours) in kept.items():
        _say(f"keeping your {name}={theirs} (mtpdiag's would be {ours})")
    launch = run_ray.launch(command, os.environ, added, kept, ray)  # a Ray job: its actors get them too
    for line in launch.lines() if launch else ():
        _say(line)
    command, driver_env = (launch.command, launch.env) if launch else (command, {})
    try:
        child = subprocess.Popen(command, env={**os.environ, **added, **driver_env}, **_own_group())
    except OSError as exc:
        run_dir.release()
        raise InputError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    try:
        ray_record = {"ray": launch.record()} if launch else {}
        launcher = os.path.basename(command[0])
        run_dir.describe(pid=child.pid, launcher=launcher, set=added, kept=sorted(kept), **ray_record)
    except OSError as exc:  # the job runs: our own failure is logged, never its end
        run_dir.error(exc, "run.json")
    _forward_signals(child)
    layout = pipeline.LayoutOptions(
        tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order, config=config, overrides=tuple(override or ())
    )
    supervisor = Supervisor(
        child, run_dir, layout, on_hang, hang_after, pause_after, interval, native, native_timeout, timeout
    )
    supervisor.shared = shared
    if launch:
        supervisor.use_ray(run_ray.RayWatch(launch.address, ray_timeout, run_dir.event, command))
        supervisor.submitted = launch if launch.submission_id else None
    try:
        code = supervisor.run()
    finally:
        if supervisor.ray is not None:
            supervisor.ray.close()
    raise typer.Exit(code)


def _say(text: str) -> None:
    print(f"mtpdiag run: {text}", file=sys.stderr, flush=True)


def _own_group() -> dict[str, Any]:
    """Popen's arguments for a child in a process group of its own (the terminal's Ctrl-C reaches us; we pass
    it on)."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


def _forward_signals(child: subprocess.Popen[bytes]) -> None:
    def forward(signum: int, _frame: FrameType | None) -> None:
        try:
            os.killpg(child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)


def job_exit_code(returncode: int) -> int:
    """The child's exit code as a shell gives it: 128 + N for a job ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """The job and its watcher: watch until the job ends, or a hang ends the run (``--on-hang kill|exit``)."""

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        run_dir: RunDir,
        layout: pipeline.LayoutOptions,
        on_hang: OnHang,
        hang_after: float,
        pause_after: float,
        interval: float,
        native: bool,
        native_timeout: float,
        timeout: float,
    ) -> None:
        self.child, self.run_dir, self.layout, self.on_hang = child, run_dir, layout, on_hang
        self.hang_after, self.pause_after, self.interval = hang_after, pause_after, interval
        self.capture_options = {"native": native, "native_timeout": native_timeout, "timeout": timeout}
        self.ray: run_ray.RayWatch | None = None  # a Ray job: watched through --ray's capture
        self.watching = True
        self.watcher = self._new_watcher()
        self.phase: Phase | None = None
        self.called = False  # a hang was called and the job has not moved since
        self.ranks: dict[int, int | None] = {}  # pid -> rank, of every rank seen
        self.logs: dict[int, str | None] = {}  # pid -> the directory of its torchrun log files, if any
        self.failures = 0  # samples that failed in a row
        self.shared: SharedOut | None = None  # the --out every node of a multi-node job shares
        self.submitted: run_ray.RayLaunch | None = None  # ray job submit: stopped through its job server on kill

    def use_ray(self, ray: run_ray.RayWatch) -> None:
        self.ray = ray
        self.watcher = self._new_watcher()

    def _new_watcher(self) -> Watcher:
        if self.ray is not None:
            return self.ray.watcher(self.layout, self.interval, self.hang_after, self.pause_after, self.capture_options)
        from mtpdiag.capture import capture, find_targets
        from mtpdiag.capture.flight_recorder import LiveProgress

        hints: dict[int, dict[str, int]] = {}  # each rank's layout hints, read once

        def take_stacks(targets: list[Any], busy: bool = False) -> Snapshot:
            options = self.capture_options
            return capture(
                targets,
                native=bool(options["native"]) and not busy,
                native_timeout=float(options["native_timeout"]),
                nonblocking=busy,
                timeout=float(options["timeout"]),
                host=self.shared.node if self.shared is not None else None,
                hints_cache=hints,
                expand=False,  # the watcher's targets are workers (find_targets'), not launchers
            )

        return Watcher(
            list_targets=lambda: find_targets([self.child.pid], False),
            take_stacks=take_stacks,
            layout=self.layout,
            interval=self.interval,
            stall=self.hang_after,
            fr_progress=LiveProgress(),
            arm_on_progress=True,
            pause_after=self.pause_after,
            spare=True,
        )

    def run(self) -> int:
        while self.child.poll() is None:
            began = time.monotonic()
            if self.watching:
                code = self._step(began)
                if code is not None:
                    return code
            self._wait(began + self.interval)
        code = job_exit_code(self.child.returncode)
        if self.watcher.tracker.samples:
            self.run_dir.event(sampling_summary(self.watcher))
        self.run_dir.event(f"job exited with code {code}")
        return code

    def _wait(self, until: float) -> None:
        """Wait for the next sample, noting at once a rank that dies meanwhile: torchrun ends a dead worker's peers
        within 0.1 s, and the whole job can be gone before the next sample, which would then not say which rank
        died (a /proc read per rank every 50 ms)."""
        from mtpdiag.capture import procfs

        while (left := until - time.monotonic()) > 0:
            try:
                self.child.wait(timeout=min(left, EXIT_POLL_S))
                return
            except subprocess.TimeoutExpired:
                pass
            if self.watching and self.ray is None and self.ranks:
                self._note_exits([p for p in self.ranks if procfs.is_running(p)])

    def _step(self, now: float) -> int | None:
        """One sample and what follows from it; mtpdiag's own error stops the watching, never the job."""
        try:
            code = self._sample_and_act(now)
            self.failures = 0
            return code
        except JobEnded as ended:
            self._note_exits([])
            self.run_dir.event(f"no ranks left: {ended}")
            self.run_dir.event(sampling_summary(self.watcher))
            self.watcher = self._new_watcher()  # an elastic restart starts new ranks: watch them afresh
        except (InputError, NothingCaptured) as exc:
            if self.watcher.tracker.samples:  # a capture that failed (a loaded node): said, and tried again
                self.failures += 1
                self.run_dir.event(f"sample failed: {exc}")
                if self.failures >= MAX_FAILURES:
                    self._stop(exc)
            # else no ranks yet (start-up): try again at the next sample
        except Exception as exc:
            self._stop(exc)
        return None

    def _stop(self, exc: Exception) -> None:
        path = self.run_dir.error(exc, "watcher")
        self.watching = False
        _say(
            f"stopped watching after an error of mtpdiag's ({type(exc).__name__}: {exc}); see {path}. The job goes on."
        )

    def _sample_and_act(self, now: float) -> int | None:
        sample = self.watcher.sample(now)
        if self.ray is None:  # --ray's targets are (node id, pid): an actor's end is Ray's to report
            self._note_exits(sample.targets)
        if self.shared is not None:  # another node called a hang: this node's ranks go beside its bundle
            for where in self.shared.look(self.watcher, sample.targets):
                _say(f"another node called a hang; this node's ranks are in {where}")
        phase = self.watcher.decide(now)
        if phase != self.phase:
            self.run_dir.event(f"{phase}: {self.watcher.status(sample.targets, now)}")
        if phase == Phase.PROGRESS and self.called:
            self.called = False
            path = self.run_dir.write_recovered(f"the job moved again after hang {self.run_dir.hangs}")
            _say(f"the job recovered after the hang; noted in {path}")
        self.phase = phase
        if phase == Phase.HANG and not self.called:
            return self._call(now)
        return None

    def _note_exits(self, targets: list[Any]) -> None:
        """A rank whose process is gone: said once, with its exit code when its zombie could still be read."""
        from mtpdiag.capture import procfs

        for pid in targets:
            if pid not in self.ranks:
                value = (procfs.read_env(pid) or {}).get("RANK", "")
                self.ranks[pid] = int(value) if value.isdigit() else None
                self.logs[pid] = run_files.rank_log_dir(pid)
        for pid in [p for p in self.ranks if p not in targets]:
            rank = self.ranks.pop(pid)
            code = procfs.zombie_exit_code(pid)
            how = f"with code {code}" if code is not None else "(its exit code went to its launcher)"
            tail = run_files.rank_log_tail(self.logs.pop(pid, None))
            self.run_dir.event(run_files.exit_text(rank, pid, how, tail))
            if code:  # an unknown code is in the launcher's own summary (torchrun prints each failed rank's)
                _say(f"rank {rank} (pid {pid}) exited {how}")

    def _call(self, now: float) -> int | None:
        """The hang: capture, dumps through the pipe, diagnosis, the reports; then --on-hang."""
        stalled = self.watcher.tracker.stalled_for(now)
        last_progress = time.time() - (time.monotonic() - self.watcher.tracker.quiet_since)
        # The dumps the last samples asked for through the pipe (LiveProgress asks each rank again as soon as it
        # answered) are used when they are newer than the last progress: a new request would cost its wait
        # (measured: 4.6 s) for nothing. An older one is asked for again (Watcher.call_hang).
        report = self.watcher.call_hang(now)
        assert self.watcher.last is not None
        timing = {
            "last_progress": utc(last_progress),
            "called": utc(time.time() - (time.monotonic() - now)),
            "written": utc(),
            "stalled_for_s": round(stalled, 2),
            "seconds_from_last_progress_to_report": round(time.time() - last_progress, 2),
            "hang_after_s": self.hang_after,
            "flight_recorder_asked_at_call": self.watcher.fr_requested,
        }
        written = self.run_dir.hangs < run_files.MAX_HANG_REPORTS
        path = self.run_dir.write_hang(report, self.watcher.last, timing) if written else None
        self.called = True
        headline = headline_of(report)
        self.run_dir.event(f"hang called after {stalled:.1f} s without progress: {headline}")
        _say(f"hang after {stalled:.1f} s without progress: {headline}")
        if path is not None:
            _say(f"report: {path} (report.json, report.md, report.html, bundle.json beside it)")
        else:
            self.run_dir.event(f"not written: the run directory keeps the first {run_files.MAX_HANG_REPORTS} hangs")
        if path is not None and self.shared and (where := self.shared.call(report, headline, self.watcher.last, path)):
            _say(f"every node's ranks: mtpdiag analyze {where}")
        code = pipeline.exit_code(report) or EXIT_PROBLEM
        if self.on_hang == OnHang.KILL:
            self._kill_tree()
            _say(f"--on-hang kill: ended the job (pid {self.child.pid} and its processes)")
            if self.submitted is not None:  # the client is gone, the job is not: stopped through its job server
                self.run_dir.event(stopped := run_ray.stop_submitted_job(self.submitted))
                _say(f"--on-hang kill: {stopped}")
            return code
        if self.on_hang == OnHang.EXIT:
            _say(f"--on-hang exit: the job (pid {self.child.pid}) is left running")
            return code
        return None

    def _kill_tree(self) -> None:
        """SIGKILL the launcher and every descendant, by pid (a stopped rank ignores SIGTERM; docs/design.md)."""
        from mtpdiag.capture import procfs
        from mtpdiag.fix.verify.launch import kill_pids

        pids = {self.child.pid, *procfs.descendants(self.child.pid), *self.ranks}
        kill_pids(pids)
        try:
            self.child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.run_dir.event(f"killed the job: {len(pids)} processes")


def headline_of(report: Report) -> str:
    """The report's first sentence on one line (the console report wraps it at the terminal's width)."""
    from mtpdiag.model import printable

    first = report.findings[0].summary if report.findings else "; ".join(report.notes[-1:])
    return printable(f"{str(report.verdict).upper()}: {first}")


def register(app: typer.Typer) -> None:
    app.command("run", context_settings={"allow_interspersed_args": False})(run)
