"""The stages wired together, as every command runs them: capture or read → resolve the layout → diagnose →
report (and, for ``watch``, the samples that tell a hang from slow progress). What each stage does lives in its
package; this module only connects them, and says on stderr what the report would otherwise leave a script to
find.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from mtpdiag.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_PROBLEM, InputError, NothingCaptured
from mtpdiag.model import Report, Snapshot, replace, who_and_why
from mtpdiag.vocabulary.states import Verdict

if TYPE_CHECKING:  # watch's and --ray's parts, imported where they run
    from mtpdiag.analysis.stall import StallTracker
    from mtpdiag.capture.ray_cluster import RayCluster
    from mtpdiag.model import RankCapture
    from mtpdiag.model.flight_recorder import FRDump
    from mtpdiag.model.watchdog import WatchdogLog

# The largest world mtpdiag diagnoses; the analysis and the reports are linear in it.
MAX_WORLD_SIZE = 1 << 18


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


class LayoutOptions(msgspec.Struct, frozen=True):
    tp: int | None = None
    cp: int | None = None
    pp: int | None = None
    ep: int | None = None
    etp: int | None = None
    vpp: int | None = None
    order: str | None = None
    config: str | None = None
    overrides: tuple[str, ...] = ()
    world_size: int | None = None

    def flags(self) -> dict[str, int | str | None]:
        out: dict[str, int | str | None] = {k: getattr(self, k) for k in ("tp", "cp", "pp", "ep", "etp", "vpp")}
        if self.order:
            out["order"] = self.order
        return out


def world_size_of(snapshot: Snapshot) -> int | None:
    """``Snapshot.world_size``, under the name ``fix.verify.plan`` still imports."""
    return snapshot.world_size


def with_flight_recorder(snapshot: Snapshot, request: bool = False, wait_s: float = 10.0) -> Snapshot:
    """The snapshot with the Flight Recorder dumps its ranks wrote (or, with ``request``, write now through the
    job's debug-info pipe); what could not be had is said on stderr."""
    from mtpdiag.capture.flight_recorder import with_dumps

    snapshot, notes = with_dumps(snapshot, request=request, wait_s=wait_s)
    for note in notes:
        print(f"mtpdiag: note: {_one_printable_line(note)}", file=sys.stderr)
    return snapshot


def capture_ray(cluster: RayCluster, said: set[str] | None = None, **options: Any) -> Snapshot:
    """``--ray``: every node's ranks, captured through Ray (``capture.ray_cluster``). Each node that could not be
    captured is a stderr line with the reason (once: not again when it is in ``said``), and a line of the
    snapshot's errors (so of the report's notes and of a bundle); the nodes that answered make the snapshot."""
    result = cluster.capture(**options)
    said = set() if said is None else said
    for line in (*result.failed, *result.notes):
        if line not in said:
            said.add(line)
            print(f"mtpdiag: warning: {_one_printable_line(line)}", file=sys.stderr)
    captures = result.snapshot.captures
    if not captures and not result.failed:
        raise InputError(
            f"no node of the Ray cluster at {cluster.address} runs a process with RANK in its "
            f"environment ({len(result.nodes)} nodes asked)"
        )
    if not any(c.threads for c in captures):
        first = result.failed[0] if result.failed else who_and_why(captures[0])
        raise NothingCaptured(
            f"nothing could be captured on the {len(result.nodes)} nodes of the Ray cluster (first: {first})"
        )
    return result.snapshot


def import_ahead(formats: tuple[str, ...]) -> None:
    """Import what ``with_flight_recorder``, ``diagnose_snapshot`` and the renderers of ``formats`` will import.

    ``inspect`` calls this while py-spy dumps the ranks (``capture(meanwhile=...)``): the imports (about a
    third of its start-up) then overlap that wait instead of following it.
    """
    import importlib

    from mtpdiag.report import RENDERERS

    for module in (
        "mtpdiag.capture.flight_recorder",
        "mtpdiag.analysis",
        "mtpdiag.layout.sources",
        *(f"mtpdiag.report.{RENDERERS[fmt].module}" for fmt in formats),
    ):
        importlib.import_module(module)
    if "console" in formats:
        try:  # rich loads its emoji table with the first markup it renders (a private module: skipped if moved)
            importlib.import_module("rich._emoji_codes")
        except ImportError:
            pass


def with_world_size(snapshot: Snapshot, world_size: int) -> Snapshot:
    """Give every capture that lacks WORLD_SIZE the one from --world-size."""
    captures = tuple(
        c if c.world_size else replace(c, env=replace(c.env, WORLD_SIZE=str(world_size))) for c in snapshot.captures
    )
    return replace(snapshot, captures=captures)


def diagnose_snapshot(
    snapshot: Snapshot, layout_options: LayoutOptions, fr: FRDump | None = None, log: WatchdogLog | None = None
) -> Report:
    """Resolve the layout (flags, config, target command lines) and diagnose the snapshot.

    The world size is the captures' WORLD_SIZE (``analyze --world-size`` fills it in), else the config's;
    failing both, the layout of the smallest world the sizes fit that holds every captured rank is assumed,
    and said so. Never the number of files: one node's dumps of a 1,000-rank job are 8 of 1,000 ranks.
    """
    from mtpdiag.analysis import diagnose
    from mtpdiag.layout.sources import resolve_layout

    # The distinct hints only, in capture order: the ranks of one job mostly carry the same ones (so the
    # list stays short and each capture's hints are compared, not copied).
    hints: list[dict[str, int]] = []
    for capture in snapshot.captures:
        if capture.layout_hints and capture.layout_hints not in hints:
            hints.append(dict(capture.layout_hints))
    world_size = snapshot.world_size or layout_options.world_size
    if world_size is None and fr is not None:
        from mtpdiag.analysis.flight_recorder.evidence import world_size as recorded_world

        world_size = recorded_world(fr)
    _check_world_size(world_size, "WORLD_SIZE of the inputs")
    ranks = [c.rank for c in snapshot.captures if c.rank is not None]
    ranks += [d.rank for d in fr.ranks] if fr is not None else []
    ranks += [t.rank for t in log.timeouts if t.rank is not None] if log is not None else []
    _check_world_size(max(ranks) + 1 if ranks else None, "the highest rank in the inputs")
    layout, source = resolve_layout(
        world_size,
        flags=layout_options.flags(),
        config=layout_options.config,
        overrides=list(layout_options.overrides),
        hints=hints,
        holds_rank=max(ranks) if ranks and world_size is None else None,
    )
    _check_world_size(layout.world_size if layout else None, "the config's trainer.nnodes * n_gpus_per_node")
    return diagnose(snapshot, layout, source, fr=fr, log=log)


def _check_world_size(world_size: int | None, source: str) -> None:
    """A corrupt or hostile WORLD_SIZE (10**12) would have the analysis walk every rank for ever."""
    if world_size is not None and world_size > MAX_WORLD_SIZE:
        raise InputError(
            f"world size {world_size} (from {source}) is more than mtpdiag handles ({MAX_WORLD_SIZE} ranks)"
        )


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run a one-shot read → diagnose → report without Python's cyclic garbage collector.

    The model's Structs are untracked by the GC already, but the analysis of 16k ranks still makes
    hundreds of thousands of tuples, dicts and lists: their collections cost 0.12 s of about 0.6 s at
    16k host-bundle ranks. Nothing made here forms a cycle that must be freed before the command exits
    (reference counting frees the rest).

    On the way out, what was made is moved to the oldest generation (``freeze`` then ``unfreeze``)
    rather than left young: otherwise the first allocation after ``enable`` runs a young collection
    over everything made here (0.1 s at 16k ranks, after the report is written).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def warn_incomplete(snapshot: Snapshot) -> None:
    """One stderr line when part of the input could not be read: the report says so too, but a script that
    parses --json, or a person skimming the grid, should not have to look for it."""
    missed = [c for c in snapshot.captures if not c.threads]
    parts = []
    if missed:
        parts.append(f"{len(missed)} of {len(snapshot.captures)} ranks not captured (first: {who_and_why(missed[0])})")
    if snapshot.errors:
        parts.append(f"{len(snapshot.errors)} input(s) skipped (first: {snapshot.errors[0]})")
    if parts:
        rest = (
            "no rank's stack could be read" if len(missed) == len(snapshot.captures) else "the report covers the rest"
        )
        print(f"mtpdiag: warning: {_one_printable_line('; '.join(parts))}; {rest}", file=sys.stderr)


def _one_printable_line(text: str, limit: int = 400) -> str:
    """Text from targets or files, safe for a terminal: no control characters, one line, bounded."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exit_code(report: Report) -> int:
    """1 for a problem, 4 when ranks are stuck but the evidence cannot say why, 0 only when no rank is."""
    if report.verdict == Verdict.PROBLEM:
        return EXIT_PROBLEM
    if report.verdict == Verdict.INCOMPLETE:
        return EXIT_INCOMPLETE
    return EXIT_OK


# ---------------------------------------------------------------- watch: samples until a hang


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
    from mtpdiag.analysis.stall import stack_signatures
    from mtpdiag.capture import procfs

    if read_cpu is None:

        def read_cpu(pids: list[Any]) -> Mapping[Any, int | None]:
            return {p: procfs.main_thread_cpu_ns(p) for p in pids}

    started = time.monotonic()

    def done() -> float:
        """When the sample's readings ended, on the caller's clock (``now`` is when they began)."""
        return now + (time.monotonic() - started)

    cpu = read_cpu(targets)
    if not tracker.samples:
        return tracker.observe(now, cpu, None, done=done()), None
    busy = tracker.cpu_moved(cpu)
    hold = Hold(busy)
    try:
        snapshot = take_stacks(targets, busy)
    except NothingCaptured as exc:  # py-spy got no CPU in time on any rank: a sample without stacks, in which a
        if not exc.timed_out:  # spinning rank's CPU is no progress; the next sample tries again
            raise
        return tracker.skipped(now, cpu, None, done(), held_s=hold.ended()), None
    held = hold.ended()
    if snapshot is None:  # the ranks changed under the dump: that is progress of a kind (a job ending)
        return tracker.observe(now, cpu, None, done=done()), None
    fr_at = on_clock(fr_progress.poll(snapshot.captures), done()) if fr_progress is not None else None
    tracker = tracker.observe(now, cpu, stack_signatures(snapshot), fr_at=fr_at, done=done(), held_s=held)
    if busy:
        return tracker, snapshot
    after = read_cpu(targets)
    return tracker.after_pause(done(), after), snapshot


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


def hang_bundle_path(out: Path | None, snapshot: Snapshot) -> str:
    """``--out FILE`` as given; in a directory (``--out DIR``, or the current one) a new file per hang, named
    for the host and the time, so that the bundle of an earlier hang is never overwritten."""
    directory = str(out) if out is not None and os.path.isdir(out) else None
    if out is not None and directory is None:
        return str(out)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(directory or os.getcwd(), f"mtpdiag-hang-{_safe(snapshot.host)}-{stamp}")
    path, n = base + ".json", 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}.json"
    return path


def _safe(host: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in host) or "unknown"
