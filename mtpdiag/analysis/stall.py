"""Hang versus slow progress, from repeated samples (pure; ``watch`` does the sampling).

A rank has made progress between two samples when its main-thread stack signature changed: its frames,
or the values of their local variables (a loop that came back to the same line has a new step counter
or new tensors), or when the Flight Recorder shows a collective it completed since. Main-thread CPU is
the fast signal when there is no stack to compare with: a main thread that ran for at least
``MIN_PROGRESS_NS`` made progress (the *process* CPU time keeps rising in a hang because gloo/NCCL and
store threads tick, so only the main thread counts). Once there is a stack, CPU alone is not progress:
on NCCL a hung rank spins at its host sync (CUDA's default) or polls, burning CPU at one line.
A hang is called only when no rank has made progress for the whole stall window, seen by at least
two stack samples. The window is counted from the *end* of the sample that last saw progress: a sample
describes some moment between its start and its end, and on a loaded node one capture can take longer
than the window, so counting from its start would call a hang on the strength of a gap nobody looked at.

Why a threshold on nanoseconds rather than "the ticks changed": a tick is 10 ms, and a job whose
step is 1-2 s of data-loader wait plus a few ms of compute moves its main thread's ticks only every
few steps, so ticks alone look flat for longer than the stall window. A blocked main thread, on the
other hand, does not run at all, except for the tens of microseconds each py-spy pause costs it
(measured: 20-80 us per pause on a gloo job hung in all_reduce), and a Python polling loop such as
``while not ready: time.sleep(0.5)`` costs it well under a millisecond a second.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from mtpdiag.model import Progress, Report, Snapshot, replace
from mtpdiag.vocabulary.states import RankState, StackRead
from mtpdiag.vocabulary.waits import WaitKind

Signature = tuple[
    tuple[tuple[str, str, int], ...], object
]  # the main thread's frames, innermost first ((function, file, line), ...), and its locals key
Process = tuple[str, int]  # (host, pid): the ranks of a Ray cluster's nodes may share pids (a pid namespace per pod)
Target = Hashable  # what a CPU reading is keyed by: a pid, or (node id, pid) on a Ray cluster

K = TypeVar("K", bound=Target)  # a reading's key: pids or (node id, pid), the same in both readings

MIN_PROGRESS_NS = 1_000_000  # main-thread CPU between two readings that counts as progress

# What a rank does in a phase of its own that leaves the job quiet for a while without a hang: a checkpoint
# write (I/O), a sleep (a retry, a rate limit), its own code (an evaluation, a compilation in a C call).
PAUSE_WAITS = frozenset({WaitKind.IO, WaitKind.SLEEP, WaitKind.RUNNING})


def stack_signatures(snapshot: Snapshot) -> dict[Process, Signature]:
    """(host, pid) -> main-thread stack signature, for every capture that has a stack."""
    out: dict[Process, Signature] = {}
    for c in snapshot.captures:
        thread = c.main_thread
        if c.pid is not None and thread is not None:
            out[(c.host, c.pid)] = (tuple((f.function, f.file, f.line) for f in thread.frames), thread.locals_key)
    return out


def cpu_moved(
    before: Mapping[K, int | None], after: Mapping[K, int | None], min_progress_ns: int = MIN_PROGRESS_NS
) -> bool:
    """Whether any main thread ran ``min_progress_ns`` between two readings (pid -> CPU ns, None when
    unreadable), or the set of ranks changed."""
    if not before or set(before) != set(after):
        return True
    for pid, now in after.items():
        then = before[pid]
        if (now is None) != (then is None):
            return True
        if now is not None and then is not None and abs(now - then) >= min_progress_ns:
            return True
    return False


@dataclass(frozen=True)
class StallTracker:
    """What watch has seen so far. ``quiet_since`` is the sample at which progress was last seen.

    ``cpu_ns`` is the latest main-thread CPU reading per target (pid), ``stacks`` the latest stack signatures
    seen since that progress (empty until the first stack sample of a quiet spell). ``progressed``: progress
    was seen against a baseline at least once (a stack that changed since the last stack sample, a collective
    completed, a main thread that ran during a pause, ranks that changed); main-thread CPU before there is a
    stack to compare with is not enough, since a hung NCCL rank spins. ``fr_moved_at``: when the newest
    collective the Flight Recorder showed completed (when it completed, not when its dump was read);
    ``skipping``: the samples since the last stack sample took no stacks (``skipped``), so the next stacks are a
    baseline, not a change. ``held_s``: how much of the quiet spell mtpdiag's own blocking dumps held the ranks
    stopped. A stopped rank cannot make progress, so the window does not count that time: on a loaded node a
    py-spy that pauses a rank and then waits seconds for a CPU held a healthy job still for longer than the window
    (CI-64: "hang after 5.3 s without progress" of a job whose 3 s steps went on as soon as it was let go).
    """

    started: float
    quiet_since: float
    samples: int = 0
    stack_samples_while_quiet: int = 0
    cpu_ns: Mapping[Target, int | None] = field(default_factory=dict)
    stacks: Mapping[Process, Signature] = field(default_factory=dict)
    min_progress_ns: int = MIN_PROGRESS_NS
    progressed: bool = False
    fr_moved_at: float | None = None
    skipping: bool = False
    held_s: float = 0.0

    @staticmethod
    def start(now: float, min_progress_ns: int = MIN_PROGRESS_NS) -> StallTracker:
        return StallTracker(started=now, quiet_since=now, min_progress_ns=min_progress_ns)

    def cpu_moved(self, cpu_ns: Mapping[Target, int | None]) -> bool:
        """Whether a main thread made progress since the last reading: then stacks need not be taken."""
        return cpu_moved(self.cpu_ns, cpu_ns, self.min_progress_ns)

    def observe(
        self,
        now: float,
        cpu_ns: Mapping[Target, int | None],
        stacks: Mapping[Process, Signature] | None,
        fr_at: float | None = None,
        done: float | None = None,
        held_s: float = 0.0,
    ) -> StallTracker:
        """Fold in one sample, taken from ``now`` until ``done`` (the same moment when not given). ``stacks``
        is None when the stacks were not captured this time; ``fr_at``: when the newest collective the Flight
        Recorder showed completed since the last sample completed (on this clock); ``held_s``: how long its dumps
        held the ranks stopped (at most). A changed stack starts the quiet window at ``done``; a collective, when
        it completed (never before the window's start)."""
        if stacks is not None and self.stacks:
            moved = seen = dict(stacks) != dict(self.stacks)  # a spinning main thread burns CPU at one place
        elif stacks is not None and self.skipping:
            moved = seen = False  # the first stacks after samples that took none: the baseline of a quiet spell
        else:
            moved = self.cpu_moved(cpu_ns)
            seen = moved and stacks is None and self.samples > 0  # the ranks changed under the dump
        end = now if done is None else max(now, done)
        since = end if moved else self._fr_since(fr_at, end)
        progressed = self.progressed or seen or fr_at is not None
        if since is not None:
            return replace(
                self,
                quiet_since=since,
                samples=self.samples + 1,
                stack_samples_while_quiet=0 if stacks is None else 1,
                cpu_ns=dict(cpu_ns),
                stacks={} if stacks is None else dict(stacks),
                progressed=progressed,
                fr_moved_at=self._fr_latest(fr_at, end),
                skipping=False,
                held_s=_held_after(since, end, held_s),
            )
        return replace(
            self,
            samples=self.samples + 1,
            stack_samples_while_quiet=self.stack_samples_while_quiet + (stacks is not None),
            cpu_ns=dict(cpu_ns),
            stacks=self.stacks if stacks is None else dict(stacks),
            progressed=progressed,
            fr_moved_at=self._fr_latest(fr_at, end),
            skipping=False,
            held_s=self.held_s + held_s,
        )

    def skipped(
        self, now: float, cpu_ns: Mapping[Target, int | None], fr_at: float | None, done: float, held_s: float = 0.0
    ) -> StallTracker:
        """Fold in a sample that took no stacks (``stack_read`` said SKIP, or py-spy got no CPU in time: then it may
        have held the ranks stopped for ``held_s``): a collective completed is progress, from when it completed;
        main-thread CPU is not (with no stack to compare, a spinning rank would look busy)."""
        end = max(now, done)
        since = self._fr_since(fr_at, end)
        if since is not None:
            return replace(
                self,
                quiet_since=since,
                samples=self.samples + 1,
                stack_samples_while_quiet=0,
                cpu_ns=dict(cpu_ns),
                stacks={},
                progressed=True,
                fr_moved_at=self._fr_latest(fr_at, end),
                skipping=True,
                held_s=_held_after(since, end, held_s),
            )
        return replace(
            self,
            samples=self.samples + 1,
            cpu_ns=dict(cpu_ns),
            progressed=self.progressed or fr_at is not None,
            fr_moved_at=self._fr_latest(fr_at, end),
            skipping=True,
            held_s=self.held_s + held_s,
        )

    def _fr_since(self, fr_at: float | None, end: float) -> float | None:
        """Where a collective completed at ``fr_at`` starts the quiet window: then (never after ``end``), or
        None when the window already started later (a dump read late, of a collective before the last progress)."""
        if fr_at is None or min(fr_at, end) <= self.quiet_since:
            return None
        return min(fr_at, end)

    def _fr_latest(self, fr_at: float | None, end: float) -> float | None:
        """The newest collective completed seen so far (``stack_read``'s grace runs from it)."""
        if fr_at is None:
            return self.fr_moved_at
        at = min(fr_at, end)
        return at if self.fr_moved_at is None else max(at, self.fr_moved_at)

    def after_pause(self, now: float, cpu_ns: Mapping[Target, int | None]) -> StallTracker:
        """Take the readings made right after the stacks as the new baseline.

        A py-spy pause costs a blocked thread tens of microseconds, which must not count as progress
        at the next sample; a thread that ran ``min_progress_ns`` during the pause did make progress,
        and the stacks taken meanwhile may be from its old place.
        """
        if self.cpu_moved(cpu_ns):
            return replace(
                self,
                quiet_since=now,
                stack_samples_while_quiet=0,
                cpu_ns=dict(cpu_ns),
                stacks={},
                progressed=True,
                held_s=0.0,
            )
        return replace(self, cpu_ns=dict(cpu_ns))

    def stalled_for(self, now: float) -> float:
        """How long no progress was seen, not counting the time mtpdiag held the ranks stopped (``held_s``)."""
        return max(0.0, now - self.quiet_since - self.held_s)

    def is_hang(self, now: float, stall_s: float) -> bool:
        return self.stack_samples_while_quiet >= 2 and self.stalled_for(now) >= stall_s

    def quiet_by_the_clock(self, now: float, stall_s: float) -> bool:
        """Whether the quiet spell is a whole window by the clock, the time mtpdiag held the ranks included (and seen
        by two stack samples): ``held_s`` may delay a hang's call, but such a spell is never progress."""
        return self.stack_samples_while_quiet >= 2 and now - self.quiet_since >= stall_s

    def progress(self, now: float, interval_s: float, stall_s: float) -> Progress:
        """The report's ``progress`` section (docs/design.md)."""
        return Progress(
            samples=self.samples,
            interval_s=interval_s,
            stalled_for_s=round(self.stalled_for(now), 2),
            hang=self.is_hang(now, stall_s),
        )


def _held_after(since: float, end: float, held_s: float) -> float:
    """The part of a sample's hold (``held_s``, ending by ``end``) that can fall after progress seen at ``since``."""
    return max(0.0, min(held_s, end - since))


class StackPolicy(NamedTuple):
    """``run``'s sampling policy (``stack_read``)."""

    # torch's monitor answers the pipe once a second: a moving job answers every 1-2 s (the Watcher keeps this
    # within a quarter of --hang-after)
    fr_grace_s: float = 2.5
    unarmed_every_s: float = 5.0  # before the first progress, stacks this often (start-up: imports, compiling)


RUN_POLICY = StackPolicy()


def stack_read(
    tracker: StallTracker,
    now: float,
    cpu_moved: bool,
    fr_at: float | None,
    armed: bool,
    stacks_at: float | None,
    policy: StackPolicy = RUN_POLICY,
) -> StackRead:
    """How ``run`` reads the stacks at this sample, so that a healthy job pays for no py-spy at all.

    A collective seen completed in this sample (``fr_at``: when), or one that completed within ``fr_grace_s``,
    is progress that stacks could add nothing to: SKIP. Before the job was first seen to move no hang can be
    called, so stacks (last read at ``stacks_at``) are read only every ``unarmed_every_s``, enough to see
    start-up end. Otherwise the job looks quiet and the stacks decide, as ``watch`` reads them: without pausing
    the ranks when a main thread ran (RUNNING), with a short pause when none did (PAUSED). The quiet window is
    counted from the last progress either way, so skipping delays no hang's call: the window leaves room for
    the two stack samples it needs.
    """
    recent = tracker.fr_moved_at is not None and now - tracker.fr_moved_at <= policy.fr_grace_s
    if fr_at is not None or recent:
        return StackRead.SKIP
    if not armed and stacks_at is not None and now - stacks_at < policy.unarmed_every_s:
        return StackRead.SKIP
    return StackRead.RUNNING if cpu_moved else StackRead.PAUSED


def is_pause(report: Report) -> bool:
    """Whether a quiet job is in a phase of its own rather than hung: every rank does I/O, sleeps or runs its
    own code (``PAUSE_WAITS``: a checkpoint every rank writes, an evaluation) and none waits on the others (in a
    collective, at a host sync, on a lock or a data loader). ``run``'s ``--pause-after`` bounds how long.

    One rank in such a phase while the others wait for it is not a pause: that is a straggler, the hang
    ``examples/gated_collectives`` reproduces (a rank sleeping in its data loading while its group waits). A
    checkpoint that rank 0 writes while the others wait at a barrier moves rank 0's stack, which is progress."""
    if not report.ranks:
        return False
    for view in report.ranks:
        kind = view.wait.kind if view.wait is not None else None
        if view.state != RankState.RUNNING and kind not in PAUSE_WAITS:
            return False
    return True
