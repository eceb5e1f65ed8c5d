"""The watch loop as named steps, shared by ``watch`` and ``run``: ``sample`` (CPU, then stacks), ``decide``
(progress, slow, paused or hung), ``call_hang`` (the Flight Recorder picked up, the diagnosis of the last
sample made a hang) and, when the time is up, ``last_look`` and ``progress_report``.

The commands keep the I/O that is theirs (the status line, the bundle, the report on stdout, the exit code);
the Watcher only returns what each step found. When the ranks are gone it raises ``JobEnded``.

Two choices are ``run``'s and off for ``watch``, whose behaviour they would change:

* ``arm_on_progress``: no hang is called before the job was first seen to move (start-up: imports,
  compilation, data-loader warm-up and communicator creation look like a quiet job);
* ``pause_after``: a quiet window in which every rank is in a phase of its own (I/O, a sleep, its own code:
  a checkpoint write, an evaluation) is a pause, not a hang, until it has lasted ``pause_after`` seconds
  (``analysis.stall.is_pause``).

``spare`` (``run``'s, for a job watched for days) makes a healthy job pay for almost nothing: the ranks are
listed again only every ``RELIST_S`` or when one is gone, the Flight Recorder is polled first, and the stacks
are read only when it showed no collective completed for a while (``analysis.stall.stack_read``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpdiag.analysis.stall import RUN_POLICY, StackPolicy, StallTracker, is_pause, stack_read
from mtpdiag.errors import InputError, NothingCaptured
from mtpdiag.model import Report, Snapshot
from mtpdiag.vocabulary.states import StackRead
from mtpdiag.vocabulary.states import WatchPhase as Phase

from . import LayoutOptions, diagnose_snapshot, with_flight_recorder
from .sampling import ProgressSignal, StackReading, hang_report, host_cpu, on_clock, read_stacks_into, sample_once
from .sampling import progress_report as _progress_report

RELIST_S = 10.0  # spare: the ranks are listed again this often (and whenever one of them is gone)
# How much longer than the window a hang waits for the ranks with a debug-info pipe to answer a first time (two of
# LiveProgress's REASK_S): ranks that never answer leave the call to the stacks, this much later.
FR_ANSWER_S = 10.0


class JobEnded(Exception):
    """The ranks are gone: the job finished (or was ended) while it was being watched."""

    def __init__(self, elapsed: float, samples: int) -> None:
        super().__init__(f"the job ended after {elapsed:.1f} s of watching ({samples} samples) without a hang")
        self.elapsed = elapsed
        self.samples = samples


@dataclass
class Sample:
    """One sample's result: the ranks it read and their stacks (None at the CPU baseline, or when the ranks
    changed under the dump)."""

    targets: list[Any]
    snapshot: Snapshot | None


@dataclass
class Watcher:
    """``list_targets()`` the ranks now (InputError when there are none); ``take_stacks(targets, busy)`` their
    stacks (``busy``: a main thread moved, so read without pausing); ``fr_progress`` the Flight Recorder's
    progress signal; ``read_cpu(targets)`` the main-thread CPU where it is not this host's /proc;
    ``local_fr``: pick the Flight Recorder dumps up on this host when a hang is called (not for ``--ray``,
    whose capture tasks do it on the nodes)."""

    list_targets: Callable[[], list[Any]]
    take_stacks: Callable[[list[Any], bool], Snapshot]
    layout: LayoutOptions
    interval: float
    stall: float
    fr_progress: ProgressSignal | None = None
    read_cpu: Callable[[list[Any]], Mapping[Any, int | None]] | None = None
    local_fr: bool = True
    arm_on_progress: bool = False
    pause_after: float | None = None
    spare: bool = False
    started: float = field(default_factory=time.monotonic)
    tracker: StallTracker = field(init=False)
    last: Snapshot | None = field(default=None, init=False)
    reads: dict[StackRead, int] = field(default_factory=dict, init=False)  # spare: how each sample read stacks
    starved: int = field(default=0, init=False)  # spare: reads in which py-spy got no CPU in time on any rank
    fr_requested: bool = field(default=False, init=False)  # the last call asked the job for fresh dumps
    _quiet_report: tuple[tuple[float, int], Report] | None = field(default=None, init=False)
    _listed: tuple[float, list[Any]] | None = field(default=None, init=False)  # spare: when, and the ranks
    _stacks_at: float | None = field(default=None, init=False)  # spare: when the stacks were last read
    _policy: StackPolicy = field(default=RUN_POLICY, init=False)

    def __post_init__(self) -> None:
        self.tracker = StallTracker.start(self.started)
        # The grace after a collective is at most a quarter of the window, which leaves room for the two stack
        # samples a hang needs inside it however short --hang-after is.
        self._policy = RUN_POLICY._replace(fr_grace_s=min(RUN_POLICY.fr_grace_s, self.stall / 4))

    # ------------------------------------------------------------------ step 1: sample

    def sample(self, now: float) -> Sample:
        """List the ranks and take one sample (``sampling.sample_once``, or ``spare``'s). The first listing's
        InputError is the caller's (a wrong pid); later, no ranks left is ``JobEnded``."""
        if self.spare and self.local_fr and self.tracker.samples:
            return self._spare_sample(now)
        targets = self._list(now)
        self.tracker, snapshot = sample_once(
            self.tracker, targets, now, self._stacks_or_none, self.fr_progress, self.read_cpu
        )
        self.last = snapshot or self.last
        return Sample(targets, snapshot)

    def _list(self, now: float) -> list[Any]:
        try:
            targets = self.list_targets()
        except InputError:
            if self.tracker.samples == 0:
                raise
            raise self.ended(now) from None
        self._listed = (now, targets)
        return targets

    def _cpu_of_ranks(self, now: float) -> tuple[list[Any], dict[Any, int | None]]:
        """The ranks (listed again every ``RELIST_S``, before the job armed, or when one is gone) and their
        main-thread CPU."""
        read = self.read_cpu or host_cpu
        if self._listed is not None and self.armed and now - self._listed[0] < RELIST_S:
            targets = self._listed[1]
            cpu = dict(read(targets))
            if all(v is not None for v in cpu.values()):
                return targets, cpu
        targets = self._list(now)
        return targets, dict(read(targets))

    def _spare_sample(self, now: float) -> Sample:
        """One sample that reads stacks only when the Flight Recorder showed no recent progress."""
        started = time.monotonic()
        targets, cpu = self._cpu_of_ranks(now)
        known = self.last is not None and {c.pid for c in self.last.captures} >= set(targets)

        def clock() -> float:
            """Now, on the caller's clock (``now`` is when this sample began)."""
            return now + (time.monotonic() - started)

        fr_at = None
        if known and self.fr_progress is not None:
            assert self.last is not None
            fr_at = on_clock(
                self.fr_progress.poll(tuple(c for c in self.last.captures if c.pid in set(targets))), clock()
            )
        cpu_moved = self.tracker.cpu_moved(cpu)
        if known:
            how = stack_read(self.tracker, now, cpu_moved, fr_at, self.armed, self._stacks_at, self._policy)
        else:  # new ranks: their stacks tell who they are (and where the Flight Recorder's pipes are)
            how = StackRead.RUNNING if cpu_moved else StackRead.PAUSED
        if how == StackRead.SKIP:
            self.reads[how] = self.reads.get(how, 0) + 1
            self.tracker = self.tracker.skipped(now, cpu, fr_at, clock())
            return Sample(targets, None)
        busy = how == StackRead.RUNNING
        self._stacks_at = now
        self.tracker, snapshot = read_stacks_into(
            self.tracker,
            StackReading(now, started, cpu, busy),
            lambda: self._counted_read(targets, how),
            lambda: (self.read_cpu or host_cpu)(targets),
            fr_at=fr_at,
            fr_poll=None if known or self.fr_progress is None else self._first_fr_poll,
        )
        self.last = snapshot or self.last
        return Sample(targets, snapshot)

    def _counted_read(self, targets: list[Any], how: StackRead) -> Snapshot | None:
        """The stacks, read as ``how`` says, counted once read (``sampling_summary``); a read starved of CPU is
        counted apart."""
        try:
            snapshot = self._stacks_or_none(targets, how == StackRead.RUNNING)
        except NothingCaptured as exc:
            self.starved += exc.timed_out
            raise
        self.reads[how] = self.reads.get(how, 0) + 1
        return snapshot

    def _first_fr_poll(self, snapshot: Snapshot) -> float | None:
        """The first request to new ranks' Flight Recorder pipes, which their stacks told where to find."""
        assert self.fr_progress is not None
        return self.fr_progress.poll(snapshot.captures)

    def _stacks_or_none(self, targets: list[Any], busy: bool = False) -> Snapshot | None:
        """The stacks, or None when the ranks changed under the dump (a job that is ending: a worker exited, or
        the ranks read before have no Python left, finalized on their way out). A NothingCaptured with
        ``timed_out`` (py-spy got no CPU in time on any rank) goes to the caller: a sample without stacks."""
        try:
            return self.take_stacks(targets, busy)
        except (NothingCaptured, InputError) as exc:  # e.g. a worker that exited between discovery and its dump
            try:
                now_targets = self.list_targets()
            except InputError:
                raise self.ended(time.monotonic()) from None
            if set(now_targets) != set(targets):
                return None
            if isinstance(exc, NothingCaptured) and exc.exiting and self._read_before(targets):
                return None
            raise

    def _read_before(self, targets: list[Any]) -> bool:
        """Whether the last snapshot read the stacks of every one of ``targets`` (so py-spy can read them: one
        it now finds no interpreter in has finalized Python, not run a Python py-spy cannot read)."""
        read = {c.pid for c in self.last.captures if c.threads} if self.last is not None else set()
        return read >= set(targets)

    def ended(self, now: float) -> JobEnded:
        return JobEnded(now - self.started, self.tracker.samples)

    # ------------------------------------------------------------------ step 2: decide

    @property
    def armed(self) -> bool:
        return not self.arm_on_progress or self.tracker.progressed

    def decide(self, now: float) -> Phase:
        """Progress, slow, paused or hung, from the samples so far."""
        if not self.armed:
            return Phase.STARTING
        if not self.tracker.is_hang(now, self.stall) or self.last is None:
            quiet = self.tracker.stalled_for(now)
            return (
                Phase.SLOW if quiet >= 2 * self.interval and self.tracker.stack_samples_while_quiet else Phase.PROGRESS
            )
        if not self._fr_saw_the_window(now):
            return Phase.SLOW
        if self.pause_after is not None and self.tracker.stalled_for(now) < self.pause_after:
            if is_pause(self._quiet_diagnosis()):
                return Phase.PAUSED
        return Phase.HANG

    def _fr_saw_the_window(self, now: float) -> bool:
        """Whether the Flight Recorder signal, where the job has one, had a whole window to see progress in. It
        sees a group move only after a first dump of each rank was read (the group's mark), which takes a few
        samples, and longer when they are slow: a loaded node, a Ray round per sample. A CI run's ``watch --ray``
        called a healthy job hung after 6 s, before its dumps could show the steps it made."""
        established_at = getattr(self.fr_progress, "established_at", None)
        if established_at is None:
            return True
        at: float | None = established_at()
        if at is None:  # a rank with a pipe has not answered yet
            return self.tracker.stalled_for(now) >= self.stall + FR_ANSWER_S
        return time.time() - at >= self.stall

    def _quiet_diagnosis(self) -> Report:
        """The diagnosis of the last sample (made once per quiet spell's sample, for the pause test)."""
        assert self.last is not None
        stamp = (self.tracker.quiet_since, self.tracker.stack_samples_while_quiet)
        if self._quiet_report is None or self._quiet_report[0] != stamp:
            self._quiet_report = (stamp, diagnose_snapshot(self.last, self.layout))
        return self._quiet_report[1]

    def status(self, targets: list[Any], now: float) -> str:
        return (
            f"watching {len(targets)} ranks: sample {self.tracker.samples}, "
            f"no progress for {self.tracker.stalled_for(now):.1f} s"
        )

    # ------------------------------------------------------------------ step 3: capture and diagnose

    def call_hang(self, now: float, request_fr: bool = False, fr_wait_s: float = 10.0) -> Report:
        """The hang's report: the last sample with its Flight Recorder dumps, diagnosed. The dumps the last samples
        asked for are used when every rank's is newer than the last progress (``LiveProgress`` asks again as
        soon as a rank answered); when one is older or missing, or with ``request_fr``, the job is asked through
        its pipe and the fresh ones are waited for (``fr_requested``). The snapshot read (with the dumps) becomes
        ``last``, for the bundle."""
        assert self.last is not None
        if self.local_fr:
            from mtpdiag.capture.flight_recorder import stale_ranks

            last_progress = time.time() - (time.monotonic() - self.tracker.quiet_since)
            stale = stale_ranks(self.last.captures, last_progress)
            self.fr_requested = request_fr or bool(stale)
            self.last = with_flight_recorder(self.last, request=self.fr_requested, wait_s=fr_wait_s)
        report = diagnose_snapshot(self.last, self.layout, fr=self.last.flight_recorder)
        return hang_report(report, self.tracker, now, self.interval, self.stall)

    # ------------------------------------------------------------------ the time is up

    def last_look(self) -> tuple[Snapshot, float]:
        """One more (blocking) sample, so the report shows where the ranks are now, and when it began."""
        end = time.monotonic()
        try:
            targets = self.list_targets()
        except InputError:
            raise self.ended(end) from None
        try:
            snapshot = self._stacks_or_none(targets)
        except NothingCaptured as exc:  # the ranks are there; py-spy got no CPU in time on any of them
            if not exc.timed_out or self.last is None:
                raise
            return self.last, end  # where they were at the last sample that read them
        if snapshot is None:
            raise self.ended(end)
        return snapshot, end

    def progress_report(self, snapshot: Snapshot, end: float) -> Report:
        report = diagnose_snapshot(snapshot, self.layout)
        return _progress_report(report, self.tracker, end, self.interval, self.stall)


def sampling_summary(watcher: Watcher) -> str:
    """One line for ``events.log``: how many samples read stacks, and how (what watching cost the job)."""
    reads = watcher.reads
    took = reads.get(StackRead.RUNNING, 0) + reads.get(StackRead.PAUSED, 0)
    return (
        f"sampling: {watcher.tracker.samples} samples, stacks read at {took} "
        f"({reads.get(StackRead.RUNNING, 0)} without pausing the ranks, {reads.get(StackRead.PAUSED, 0)} with a "
        f"short pause), skipped at {reads.get(StackRead.SKIP, 0)}"
        + (f", starved of CPU at {watcher.starved} (py-spy got none in time on any rank)" if watcher.starved else "")
    )
