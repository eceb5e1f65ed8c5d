"""watch's and run's sampling: one sample of the ranks (main-thread CPU, then the stacks) folded into the
``StallTracker``, and the report a watch ends with (a hang, or what the time it ran showed). Pure but for the
readings it is handed (``take_stacks``, ``read_cpu``, a ``ProgressSignal``) and the monotonic clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from mtpdiag.errors import NothingCaptured
from mtpdiag.model import Report, Snapshot, replace
from mtpdiag.vocabulary.states import Verdict

if TYPE_CHECKING:
    from mtpdiag.analysis.stall import StallTracker
    from mtpdiag.model import RankCapture


class ProgressSignal(Protocol):
    """``watch``'s Flight Recorder signal: when the newest collective seen completed since the last sample
    completed (time.time(), the wall clock), None when none was. Read from the ranks' dumps on this host
    (``capture.flight_recorder.LiveProgress``), or by each node's capture task while it took ``captures``
    (``capture.cluster_progress.ClusterProgress``). Both also say ``established_at()``: when the signal could
    first see every rank's groups move (``model.group_marks.every_rank_read_at``), which ``Watcher`` waits for
    before it calls a hang; a signal without it is not waited for."""

    def poll(self, captures: tuple[RankCapture, ...]) -> float | None: ...


def on_clock(wall: float | None, clock_now: float) -> float | None:
    """A wall-clock time (``ProgressSignal.poll``'s) on the watcher's own clock, whose reading now is
    ``clock_now`` (monotonic, or a test's): the edge where a collective's completion time meets the tracker.
    Never later than now."""
    if wall is None:
        return None
    return clock_now - max(0.0, time.time() - wall)


def sample_once(
    tracker: StallTracker,
    targets: list[Any],
    now: float,
    take_stacks: Callable[[list[Any], bool], Snapshot | None],
    fr_progress: ProgressSignal | None = None,
    read_cpu: Callable[[list[Any]], Mapping[Any, int | None]] | None = None,
) -> tuple[StallTracker, Snapshot | None]:
    """One sample: main-thread CPU first, then the stacks. ``take_stacks(targets, nonblocking)``.

    When no main thread moved, the stacks are a blocking dump (one short pause per rank) and the CPU read
    after it is the next baseline. When one moved, they are read without pausing anyone (``--nonblocking``):
    a rank that burns CPU may be working, or spinning at a host sync; only its stack can tell.
    Returns the updated tracker and the snapshot (None at the first sample, which is the CPU baseline).
    With ``fr_progress`` (the job set TORCH_NCCL_DEBUG_INFO_PIPE_FILE), a collective completed since the last
    sample is progress too (``--ray``: polled on the nodes during ``take_stacks``), and starts the quiet window
    when it completed. Other progress seen in this sample starts it when the sample ends (``now`` plus the time
    it took), not when it began.
    ``read_cpu(targets)`` reads the CPU elsewhere (``--ray``: on every node); by default the targets are pids of
    this host.
    """
    read_cpu = read_cpu or host_cpu
    started = time.monotonic()
    cpu = read_cpu(targets)
    if not tracker.samples:
        return tracker.observe(now, cpu, None, done=now + (time.monotonic() - started)), None
    busy = tracker.cpu_moved(cpu)
    return read_stacks_into(
        tracker,
        StackReading(now, started, cpu, busy),
        lambda: take_stacks(targets, busy),
        lambda: read_cpu(targets),
        fr_poll=None if fr_progress is None else lambda snapshot: fr_progress.poll(snapshot.captures),
    )


def host_cpu(pids: list[Any]) -> dict[Any, int | None]:
    """Main-thread CPU of this host's pids (``procfs``), None for one that is gone: the default CPU reading."""
    from mtpdiag.capture import procfs

    return {p: procfs.main_thread_cpu_ns(p) for p in pids}


class StackReading(NamedTuple):
    """A sample's stack read about to be made: ``now`` when the sample began and ``started`` (monotonic) when its
    readings did, the main-thread CPU read first, and ``busy``: whether to read the ranks running."""

    now: float
    started: float
    cpu: Mapping[Any, int | None]
    busy: bool


def read_stacks_into(
    tracker: StallTracker,
    reading: StackReading,
    read: Callable[[], Snapshot | None],
    read_cpu: Callable[[], Mapping[Any, int | None]],
    fr_at: float | None = None,
    fr_poll: Callable[[Snapshot], float | None] | None = None,
) -> tuple[StallTracker, Snapshot | None]:
    """The stack half of a sample (``sample_once``'s and the Watcher's sparing one): read the stacks, pausing the
    ranks unless ``busy``, and fold what they show into the tracker.

    A read that py-spy could not make on any rank for want of a CPU is a sample without stacks (held for as long as
    it waited); ranks that changed under the read are progress of a kind (a job ending); after a pause, the CPU read
    again is the next baseline. ``fr_at`` is the Flight Recorder's progress known before the read; ``fr_poll``
    reads it (a wall-clock time) from the ranks the snapshot found, after the read."""
    from mtpdiag.analysis.stall import stack_signatures

    now, started, cpu, busy = reading

    def clock() -> float:
        """Now, on the caller's clock (``now`` is when the sample began)."""
        return now + (time.monotonic() - started)

    hold = Hold(busy)
    try:
        snapshot = read()
    except NothingCaptured as exc:  # py-spy got no CPU in time on any rank: a sample without stacks, in which a
        if not exc.timed_out:  # spinning rank's CPU is no progress; the next sample tries again
            raise
        return tracker.skipped(now, cpu, fr_at, clock(), held_s=hold.ended()), None
    held = hold.ended()
    if snapshot is None:
        return tracker.observe(now, cpu, None, done=clock()), None
    if fr_poll is not None:
        fr_at = on_clock(fr_poll(snapshot), clock())
    tracker = tracker.observe(now, cpu, stack_signatures(snapshot), fr_at=fr_at, done=clock(), held_s=held)
    if not busy:
        tracker = tracker.after_pause(clock(), read_cpu())
    return tracker, snapshot


class Hold:
    """How long a stack read held the ranks stopped, at most: the whole read when it pauses them (a blocking dump,
    ``busy`` False), nothing when it reads them running. A py-spy that paused a rank and then waited for a CPU on a
    loaded node keeps it paused meanwhile (``StallTracker.held_s``)."""

    def __init__(self, busy: bool) -> None:
        self.busy, self.started = busy, time.monotonic()

    def ended(self) -> float:
        return 0.0 if self.busy else time.monotonic() - self.started


def hang_report(report: Report, tracker: StallTracker, now: float, interval: float, stall: float) -> Report:
    """The diagnosis of the last sample; a hang is a problem even when the stacks explain nothing."""
    stalled = (
        f"no rank's stack changed and no collective completed for {tracker.stalled_for(now):.1f} s "
        f"({tracker.stack_samples_while_quiet} stack samples)"
    )
    return replace(
        report, verdict=Verdict.PROBLEM, notes=(*report.notes, stalled), progress=tracker.progress(now, interval, stall)
    )


def progress_report(report: Report, tracker: StallTracker, now: float, interval: float, stall: float) -> Report:
    """The time is up without a hang. When the job was seen to move, a momentary stack sample is not a
    diagnosis, so no findings are claimed: ok. When it was never seen to move (a watch shorter than the stall
    window, or samples that took that long), it is not called ok: the last sample's diagnosis stands, at least
    incomplete, with what to do. Nor is it ok when the time ran out in a window without progress that was not
    called a hang yet (``Watcher`` waits for the Flight Recorder to have watched a whole window too)."""
    progress = tracker.progress(now, interval, stall)
    not_ok = _why_not_ok(tracker, now, stall)
    if not_ok is not None:
        verdict = Verdict.INCOMPLETE if report.verdict == Verdict.OK else report.verdict
        return replace(report, verdict=verdict, notes=(*report.notes, not_ok), progress=progress)
    note = (
        f"the job made progress: in {tracker.samples} samples over {now - tracker.started:.1f} s, "
        f"no {stall:g} s window passed without a stack changing or a collective completing"
    )
    return replace(report, verdict=Verdict.OK, findings=(), mismatches=(), notes=(note,), progress=progress)


def _why_not_ok(tracker: StallTracker, now: float, stall: float) -> str | None:
    """Why a watch whose time ran out cannot say the job made progress, with what to do; None when it can."""
    if not tracker.progressed:
        return (
            f"no progress seen in {tracker.samples} samples over {now - tracker.started:.1f} s, and no "
            f"{stall:g} s window watched to its end either: run watch longer (--duration) to tell a hang "
            f"from slow progress"
        )
    if tracker.is_hang(now, stall):
        return (
            f"no rank's stack changed and no collective completed for the last {tracker.stalled_for(now):.1f} s "
            f"({tracker.stack_samples_while_quiet} stack samples), and the time ran out before the Flight Recorder "
            f"had watched a whole {stall:g} s window: run watch longer (--duration) to tell a hang from slow progress"
        )
    if tracker.quiet_by_the_clock(now, stall):
        return (
            f"no rank's stack changed and no collective completed for the last {now - tracker.quiet_since:.1f} s "
            f"({tracker.stack_samples_while_quiet} stack samples), {tracker.held_s:.1f} s of it with the ranks held "
            f"stopped by mtpdiag's own dumps, and the time ran out before they had been free to run for a whole "
            f"{stall:g} s: run watch longer (--duration) to tell a hang from slow progress"
        )
    return None
