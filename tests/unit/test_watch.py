"""``StallTracker`` decisions on samples recorded from real hung jobs (tests/fixtures/captures/*/bundle.json).

A recorded bundle is one real sample: each worker's pid, main-thread CPU ticks and py-spy stack. A hang
looks like the same sample again and again, which tests/e2e/test_watch_e2e.py checks on live jobs; these
tests pin the rules: the stall window, two stack samples, what counts as progress.
"""

from __future__ import annotations

import os

import msgspec
import pytest

from mtpdiag.analysis.stall import MIN_PROGRESS_NS, StallTracker, cpu_moved, stack_signatures
from mtpdiag.inputs.bundle import load_bundle
from mtpdiag.model import replace
from mtpdiag.vocabulary.states import Verdict
from support.captures import CAPTURES

NS_PER_TICK = 10_000_000
# The largest main-thread CPU cost of one blocking py-spy pause seen on a hung gloo job (ns).
PAUSE_COST_NS = 138_275


def _recorded(scenario: str):
    bundle = load_bundle(os.path.join(CAPTURES, scenario, "bundle.json"))
    cpu = {(c.host, c.pid): c.main_cpu_ticks * NS_PER_TICK for c in bundle.captures}
    ranks = {c.rank: (c.host, c.pid) for c in bundle.captures}
    return cpu, stack_signatures(bundle), ranks


def _feed(tracker, cpu, stacks, times):
    """The same sample at each time, stacks from the second on (watch takes none at its first)."""
    out = []
    for i, now in enumerate(times):
        tracker = tracker.observe(now, cpu, stacks if i else None)
        out.append(tracker)
    return out


def test_signatures_are_the_main_threads_frames_and_locals_key_per_pid():
    _, stacks, ranks = _recorded("mtp_cp_pp")
    assert sorted(stacks) == sorted(ranks.values())
    innermost = {rank: stacks[pid][0][0][0] for rank, pid in ranks.items()}
    assert innermost == {0: "send", 1: "all_gather", 2: "all_reduce", 3: "all_gather"}
    assert all(len(frame) == 3 and isinstance(frame[2], int) for sig in stacks.values() for frame in sig[0])
    assert all(sig[1] is None for sig in stacks.values())  # a bundle never carries the locals key


def test_a_spinning_rank_burns_cpu_at_one_place_and_is_not_progress():
    """NCCL ranks spin (or poll) at their host sync: main-thread CPU rises every sample while the stack,
    locals included, stays put. Once there is a stack to compare with, CPU alone is not progress."""
    cpu, stacks, _ = _recorded("mtp_cp_pp")
    tracker = StallTracker.start(0.0).observe(0.0, cpu, None)
    for second in range(1, 7):
        spun = {pid: ns + second * 1_000_000_000 for pid, ns in cpu.items()}  # a whole core each second
        tracker = tracker.observe(float(second), spun, stacks)
    assert tracker.quiet_since == 1.0  # the first stack sample; nothing changed after it
    assert tracker.is_hang(6.0, 5.0)


def test_new_locals_at_the_same_line_are_progress():
    """A healthy loop that is at the same line at every sample (a 3 s device step) has new locals each time."""
    cpu, stacks, ranks = _recorded("mtp_cp_pp")
    tracker = StallTracker.start(0.0).observe(0.0, cpu, None).observe(1.0, cpu, stacks)
    next_step = dict(stacks) | {ranks[2]: (stacks[ranks[2]][0], 12345)}
    tracker = tracker.observe(2.0, cpu, next_step)
    assert tracker.quiet_since == 2.0
    tracker = tracker.observe(3.0, cpu, next_step, fr_at=3.0)
    assert tracker.quiet_since == 3.0  # the Flight Recorder saw a collective complete


@pytest.mark.parametrize("scenario", ["mtp_cp_pp", "mtp_cp_dp", "p2p_count", "straggler", "tp_broadcast"])
def test_a_repeated_hang_sample_is_called_once_the_stall_window_has_passed(scenario):
    cpu, stacks, _ = _recorded(scenario)
    seen = _feed(StallTracker.start(0.0), cpu, stacks, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert [t.is_hang(now, 5.0) for t, now in zip(seen, range(6), strict=True)] == [False] * 5 + [True]
    assert msgspec.to_builtins(seen[-1].progress(5.0, 1.0, 5.0)) == {
        "samples": 6,
        "interval_s": 1.0,
        "stalled_for_s": 5.0,
        "hang": True,
    }


def test_two_stack_samples_are_needed_even_past_the_window():
    cpu, stacks, _ = _recorded("mtp_cp_pp")
    seen = _feed(StallTracker.start(0.0), cpu, stacks, [0.0, 10.0, 20.0])
    assert [t.stack_samples_while_quiet for t in seen] == [0, 1, 2]
    assert [t.is_hang(now, 5.0) for t, now in zip(seen, [0.0, 10.0, 20.0], strict=True)] == [False, False, True]


def test_flat_cpu_alone_never_calls_a_hang():
    cpu, _, _ = _recorded("mtp_cp_pp")
    tracker = StallTracker.start(0.0)
    for now in range(30):
        tracker = tracker.observe(float(now), cpu, None)
    assert tracker.stalled_for(29.0) == 29.0
    assert not tracker.is_hang(29.0, 5.0)


def test_a_changed_stack_is_progress():
    """The straggler's ranks, then the frozen job's stacks on the same ranks: someone moved."""
    cpu, straggler, ranks = _recorded("straggler")
    _, frozen, frozen_ranks = _recorded("frozen")
    moved_on = {ranks[rank]: frozen[pid] for rank, pid in frozen_ranks.items()}
    assert moved_on != straggler
    tracker = _feed(StallTracker.start(0.0), cpu, straggler, [0.0, 1.0, 2.0, 3.0])[-1]
    tracker = tracker.observe(4.0, cpu, moved_on)
    assert tracker.quiet_since == 4.0 and tracker.stack_samples_while_quiet == 1
    tracker = tracker.observe(9.0, cpu, moved_on)
    assert tracker.is_hang(9.0, 5.0)


def test_a_rank_whose_stack_is_missing_is_a_change():
    cpu, stacks, ranks = _recorded("mtp_cp_pp")
    tracker = _feed(StallTracker.start(0.0), cpu, stacks, [0.0, 1.0, 2.0])[-1]
    fewer = {pid: sig for pid, sig in stacks.items() if pid != ranks[3]}
    assert tracker.observe(3.0, cpu, fewer).quiet_since == 3.0


def test_main_thread_cpu_below_the_threshold_is_not_progress():
    cpu, _, ranks = _recorded("mtp_cp_pp")
    paused = {pid: ns + PAUSE_COST_NS for pid, ns in cpu.items()}
    assert PAUSE_COST_NS < MIN_PROGRESS_NS
    assert not cpu_moved(cpu, paused)
    one_tick = {pid: ns + (NS_PER_TICK if pid == ranks[2] else 0) for pid, ns in cpu.items()}
    assert cpu_moved(cpu, one_tick)
    a_small_step = {pid: ns + (MIN_PROGRESS_NS if pid == ranks[0] else 0) for pid, ns in cpu.items()}
    assert cpu_moved(cpu, a_small_step)


def test_ranks_that_come_go_or_become_unreadable_are_progress():
    cpu, _, ranks = _recorded("mtp_cp_pp")
    assert cpu_moved({}, cpu)
    assert cpu_moved(cpu, {pid: ns for pid, ns in cpu.items() if pid != ranks[1]})
    assert cpu_moved(cpu, dict(cpu) | {ranks[1]: None})
    assert not cpu_moved(dict(cpu) | {ranks[1]: None}, dict(cpu) | {ranks[1]: None})


def test_the_reading_after_a_pause_is_the_next_baseline():
    cpu, stacks, ranks = _recorded("mtp_cp_pp")
    tracker = _feed(StallTracker.start(0.0), cpu, stacks, [0.0, 1.0, 2.0])[-1]
    after = {pid: ns + PAUSE_COST_NS for pid, ns in cpu.items()}
    rebased = tracker.after_pause(2.0, after)
    assert rebased.quiet_since == 0.0 and rebased.stack_samples_while_quiet == 2
    assert not rebased.cpu_moved(after)
    assert rebased.cpu_moved(cpu) is False  # the pause cost is below the threshold either way
    # A rank that ran during the pause made progress: the stacks just taken may be stale.
    ran = {pid: ns + (5 * MIN_PROGRESS_NS if pid == ranks[3] else 0) for pid, ns in cpu.items()}
    reset = tracker.after_pause(2.0, ran)
    assert reset.quiet_since == 2.0 and reset.stack_samples_while_quiet == 0 and reset.stacks == {}


def test_the_window_starts_when_the_sample_that_saw_progress_ended():
    """On a loaded node one capture took 6 s: the next sample, right after it, is no evidence of a 6 s stall."""
    cpu, stacks, ranks = _recorded("mtp_cp_pp")
    spun = {pid: ns + 10 * MIN_PROGRESS_NS for pid, ns in cpu.items()}
    tracker = StallTracker.start(0.0).observe(0.0, cpu, None)
    slow = tracker.observe(1.0, spun, stacks, done=7.0)  # CPU moved: progress, seen until 7 s
    assert slow.quiet_since == 7.0
    after = slow.observe(7.1, spun, stacks, done=7.5)
    assert after.stack_samples_while_quiet == 2 and not after.is_hang(7.1, 5.0)
    assert after.observe(12.5, spun, stacks, done=12.9).is_hang(12.5, 5.0)  # 5.5 s seen without progress
    # Without ``done``, the sample counts from its start, as before.
    assert tracker.observe(1.0, spun, stacks).quiet_since == 1.0


def test_cpu_before_a_stack_baseline_is_not_progress_seen():
    """A spinning rank moves its CPU at every sample: without a stack to compare with, that is not the job
    seen to move (``progressed``), though it resets the window as before."""
    cpu, stacks, ranks = _recorded("mtp_cp_pp")
    spun = {pid: ns + 10 * MIN_PROGRESS_NS for pid, ns in cpu.items()}
    tracker = StallTracker.start(0.0).observe(0.0, cpu, None).observe(1.0, spun, stacks)
    assert tracker.quiet_since == 1.0 and not tracker.progressed
    assert not tracker.observe(2.0, spun, stacks).progressed  # the same stacks again
    assert tracker.observe(2.0, spun, stacks, fr_at=2.0).progressed
    moved_on = {**stacks, ranks[0]: (stacks[ranks[1]][0], None)}
    assert tracker.observe(2.0, spun, moved_on).progressed
    ran = {pid: ns + (5 * MIN_PROGRESS_NS if pid == ranks[3] else 0) for pid, ns in spun.items()}
    assert tracker.after_pause(2.0, ran).progressed  # a main thread ran during a pause


def test_a_watch_that_never_saw_the_job_move_is_not_ok():
    """The time ran out before any progress was seen against a baseline: the last sample's diagnosis stands,
    at least incomplete (exit 4), with a note to watch longer; once progress was seen, ok."""
    from mtpdiag.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_PROBLEM
    from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot, exit_code
    from mtpdiag.pipeline.sampling import progress_report

    bundle = load_bundle(os.path.join(CAPTURES, "mtp_cp_pp", "bundle.json"))
    cpu, stacks, _ = _recorded("mtp_cp_pp")
    diagnosis = diagnose_snapshot(bundle, LayoutOptions(cp=2, pp=2))
    assert exit_code(diagnosis) == EXIT_PROBLEM
    quiet = StallTracker.start(0.0).observe(0.0, cpu, None).observe(1.0, cpu, stacks).observe(2.0, cpu, stacks)
    assert not quiet.progressed and not quiet.is_hang(3.0, 5.0)
    kept = progress_report(diagnosis, quiet, 3.0, 1.0, 5.0)
    assert exit_code(kept) == EXIT_PROBLEM and kept.findings == diagnosis.findings
    assert "watch longer" in kept.notes[-1] and kept.progress is not None and kept.progress.hang is False
    calm = replace(diagnosis, verdict=Verdict.OK, findings=(), mismatches=())
    assert exit_code(progress_report(calm, quiet, 3.0, 1.0, 5.0)) == EXIT_INCOMPLETE
    moved = quiet.observe(3.0, cpu, {}, fr_at=3.0)
    assert moved.progressed and exit_code(progress_report(diagnosis, moved, 4.0, 1.0, 5.0)) == EXIT_OK
    # Moved, then a whole window without progress that the watcher had not called yet (it waits for the Flight
    # Recorder to have watched a window too) when the time ran out: never ok.
    stuck = moved.observe(4.0, cpu, stacks).observe(5.0, cpu, stacks).observe(9.0, cpu, stacks)
    assert stuck.progressed and stuck.is_hang(9.0, 5.0)
    late = progress_report(calm, stuck, 9.0, 1.0, 5.0)
    assert exit_code(late) == EXIT_INCOMPLETE and "run watch longer" in late.notes[-1]
    assert exit_code(progress_report(diagnosis, stuck, 9.0, 1.0, 5.0)) == EXIT_PROBLEM
