"""``run``'s sampling policy (``analysis.stall.stack_read``, ``Watcher(spare=True)``) on samples recorded from
real hung jobs (tests/fixtures/captures/*/bundle.json): a healthy job whose Flight Recorder keeps moving pays
for no py-spy at all, and a hang is still called one window after the last collective completed.

The Flight Recorder's answers are a ``ProgressSignal`` that says "a collective completed (now)" for the samples a
test chooses (``LiveProgress`` against the job's side of the pipe is tests/unit/test_live_progress.py's).
"""

from __future__ import annotations

import os
import time

from mtpdiag.analysis.stall import RUN_POLICY, StallTracker, stack_read, stack_signatures
from mtpdiag.inputs.bundle import load_bundle
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.watcher import RELIST_S, Watcher, sampling_summary
from mtpdiag.vocabulary.states import StackRead
from mtpdiag.vocabulary.states import WatchPhase as Phase
from support.captures import CAPTURES

NS_PER_TICK = 10_000_000
WINDOW = 10.0  # run's --hang-after


def _bundle(scenario: str):
    return load_bundle(os.path.join(CAPTURES, scenario, "bundle.json"))


def _spinning(bundle, second: float) -> dict:
    """Main-thread CPU of ranks that spin at their host sync: a whole core each second."""
    return {(c.host, c.pid): c.main_cpu_ticks * NS_PER_TICK + int(second * 1e9) for c in bundle.captures}


def _run_policy(tracker, times, fr_answers, stacks, cpu_at):
    """Sample at each time as run does: ``fr_answers`` are the times a collective completed was seen."""
    reads = []
    for now in times:
        cpu = cpu_at(now)
        fr = now if now in fr_answers else None  # the collective completed when its answer was read
        how = stack_read(tracker, now, tracker.cpu_moved(cpu), fr, tracker.progressed, None)
        reads.append(how)
        if how == StackRead.SKIP:
            tracker = tracker.skipped(now, cpu, fr, now)
        else:
            tracker = tracker.observe(now, cpu, stacks, fr_at=fr, done=now)
    return tracker, reads


def test_a_job_whose_collectives_keep_completing_reads_no_stacks():
    """A day of samples (one a second) of a job answering the pipe every 2 s: no stack read, no hang."""
    bundle = _bundle("nccl_mtp_cp_pp_spin")
    stacks = stack_signatures(bundle)
    tracker = StallTracker.start(0.0).observe(0.0, _spinning(bundle, 0), None)
    times = [float(t) for t in range(1, 86_401)]
    tracker, reads = _run_policy(tracker, times, set(times[::2]), stacks, lambda t: _spinning(bundle, t))
    assert set(reads) == {StackRead.SKIP}
    assert tracker.progressed and not tracker.is_hang(86_400.0, WINDOW)
    assert tracker.stalled_for(86_400.0) <= 2.0


def test_a_spinning_hang_after_the_last_collective_is_called_one_window_after_it():
    """The hang's ranks spin at one line (CPU rising, the same stacks) once the Flight Recorder stops: the
    stacks taken after the grace are the quiet spell's baseline, not a change, so the window runs from the
    last collective completed and the hang is called when it has passed, not later."""
    bundle = _bundle("nccl_mtp_cp_pp_spin")
    stacks = stack_signatures(bundle)
    tracker = StallTracker.start(0.0).observe(0.0, _spinning(bundle, 0), None)
    times = [float(t) for t in range(1, 21)]
    last_collective = 5.0
    seen = []
    for now in times:
        tracker, reads = _run_policy(
            tracker, [now], {1.0, 3.0, last_collective}, stacks, lambda t: _spinning(bundle, t)
        )
        seen.append((now, reads[0], tracker.quiet_since, tracker.is_hang(now, WINDOW)))
    skipped = [now for now, how, _, _ in seen if how == StackRead.SKIP]
    assert skipped == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # a collective, or one within the grace (2.5 s)
    assert all(how == StackRead.RUNNING for now, how, _, _ in seen if now > 7.0)  # spinning: never paused
    assert {quiet for now, _, quiet, _ in seen if now >= last_collective} == {last_collective}
    called = [now for now, _, _, hang in seen if hang]
    assert called[0] == last_collective + WINDOW


def test_blocked_ranks_are_read_with_a_pause_and_spinning_ones_without():
    bundle = _bundle("mtp_cp_pp")
    tracker = StallTracker.start(0.0).observe(0.0, _spinning(bundle, 0), None)
    assert stack_read(tracker, 1.0, cpu_moved=False, fr_at=None, armed=True, stacks_at=0.0) == StackRead.PAUSED
    assert stack_read(tracker, 1.0, cpu_moved=True, fr_at=None, armed=True, stacks_at=0.0) == StackRead.RUNNING
    assert stack_read(tracker, 1.0, cpu_moved=True, fr_at=1.0, armed=True, stacks_at=0.0) == StackRead.SKIP


def test_before_the_first_progress_stacks_are_read_every_few_seconds_and_a_change_arms():
    """Start-up (imports, compiling) is never a hang: stacks every ``unarmed_every_s``, compared with the last
    ones read, so a job without a Flight Recorder still arms when its stacks move."""
    straggler, frozen = _bundle("straggler"), _bundle("frozen")
    first = stack_signatures(straggler)
    at_rank = {c.rank: (c.host, c.pid) for c in straggler.captures}
    moved = {at_rank[c.rank]: stack_signatures(frozen)[(c.host, c.pid)] for c in frozen.captures}
    assert moved != first
    cpu = {key: 0 for key in first}
    tracker = StallTracker.start(0.0).observe(0.0, cpu, None).observe(1.0, cpu, first)
    every = RUN_POLICY.unarmed_every_s
    reads = [stack_read(tracker, 1.0 + dt, False, None, tracker.progressed, 1.0) for dt in (1.0, every - 0.5, every)]
    assert reads == [StackRead.SKIP, StackRead.SKIP, StackRead.PAUSED]
    tracker = tracker.skipped(2.0, cpu, None, 2.0)
    assert not tracker.progressed and tracker.stacks == first  # a skip keeps the stacks to compare with
    tracker = tracker.observe(1.0 + every, cpu, moved)
    assert tracker.progressed and tracker.quiet_since == 1.0 + every


class _Answers:
    """The Flight Recorder's signal: a collective completed at the polls numbered in ``moving`` (from 1),
    ``age_s`` before the poll read it (0: as it was read)."""

    def __init__(self, moving: range, age_s: float = 0.0) -> None:
        self.moving, self.polls, self.age_s = moving, 0, age_s

    def poll(self, captures) -> float | None:
        assert captures  # the ranks it asks are those last captured
        self.polls += 1
        return time.time() - self.age_s if self.polls in self.moving else None


def test_the_watcher_takes_no_stacks_while_the_flight_recorder_moves_and_lists_the_ranks_rarely():
    """``Watcher(spare=True)`` over a recorded snapshot: a minute of collectives completing, then a spin hang.
    Stacks are read at the second sample (to know the ranks) and once the Flight Recorder is quiet; the ranks
    are listed again only every RELIST_S; the hang is called a window after the last collective."""
    bundle = _bundle("nccl_mtp_cp_pp_spin")
    targets = [c.pid for c in bundle.captures]
    listed, dumped, spun = [], [], [0]
    answers = _Answers(range(1, 61))
    base = time.monotonic()

    def read_cpu(pids):
        spun[0] += 1_000_000_000  # a whole core a second: the ranks spin at their host sync
        return {p: spun[0] for p in pids}

    def take_stacks(_pids, busy):
        dumped.append(busy)
        return bundle

    watcher = Watcher(
        list_targets=lambda: listed.append(1) or list(targets),
        take_stacks=take_stacks,
        layout=LayoutOptions(cp=2, pp=2),
        interval=1.0,
        stall=WINDOW,
        fr_progress=answers,
        read_cpu=read_cpu,
        arm_on_progress=True,
        spare=True,
        started=base,
    )
    phases = []
    for second in range(0, 90):
        now = base + second
        watcher.sample(now)
        phases.append(watcher.decide(now))
        if phases[-1] == Phase.HANG:
            break
    hang_at = phases.index(Phase.HANG)
    last_collective = 60  # poll n is made at second n (the first sample, at 0, is the CPU baseline)
    # The window starts when the sample that saw the last collective ended, a moment after it began: the first
    # sample past it is one second later.
    assert hang_at == last_collective + WINDOW + 1
    assert len(dumped) == 1 + (hang_at - last_collective - 2), dumped  # the 2nd sample; the quiet spell after 2 s
    assert all(dumped)  # spinning ranks are read without a pause
    assert len(listed) == 2 + hang_at // RELIST_S  # the first two samples (not armed yet), then every RELIST_S
    summary = sampling_summary(watcher)
    assert summary.startswith(f"sampling: {hang_at + 1} samples, stacks read at {len(dumped)} ")
    print(f"\n{summary}")


def test_the_grace_after_a_collective_is_at_most_a_quarter_of_the_window():
    """A short --hang-after still gets its two stack samples inside the window."""

    def watcher(stall: float) -> Watcher:
        layout = LayoutOptions()
        return Watcher(list_targets=list, take_stacks=lambda _t, _b: None, layout=layout, interval=1.0, stall=stall)

    assert watcher(10.0)._policy.fr_grace_s == RUN_POLICY.fr_grace_s == 2.5
    assert watcher(4.0)._policy.fr_grace_s == 1.0
    tracker = StallTracker.start(0.0).skipped(0.0, {}, 0.0, 0.0)
    short = watcher(4.0)._policy
    assert stack_read(tracker, 1.0, True, None, True, 0.0, short) == StackRead.SKIP
    assert stack_read(tracker, 1.5, True, None, True, 0.0, short) == StackRead.RUNNING


def test_the_window_runs_from_when_the_last_collective_completed_not_from_the_read_that_showed_it():
    """The dump that shows the last collective was read 3 s after it completed (a rank asked in turn, a monitor
    that answered late): the hang is called one window after the collective, 3 s before the old call."""
    bundle = _bundle("nccl_mtp_cp_pp_spin")
    targets = [c.pid for c in bundle.captures]
    spun = [0]
    base = time.monotonic()

    def read_cpu(pids):
        spun[0] += 1_000_000_000
        return {p: spun[0] for p in pids}

    watcher = Watcher(
        list_targets=lambda: list(targets),
        take_stacks=lambda _pids, _busy: bundle,
        layout=LayoutOptions(cp=2, pp=2),
        interval=1.0,
        stall=WINDOW,
        fr_progress=_Answers(range(1, 31), age_s=3.0),
        read_cpu=read_cpu,
        arm_on_progress=True,
        spare=True,
        started=base,
    )
    for second in range(0, 60):
        watcher.sample(base + second)
        if watcher.decide(base + second) == Phase.HANG:
            break
    last_read = 30  # the poll that read the last collective, made at second 30
    assert base + last_read - 3.0 <= watcher.tracker.quiet_since < base + last_read - 2.0
    assert second == last_read - 3 + WINDOW + 1  # the first sample a window after it (the sample's own time)
