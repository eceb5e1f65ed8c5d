"""``mtpdiag watch``: sample a job until it hangs (diagnose, save a bundle, exit 1) or the time is up (exit 0
when the job was seen to move; when it never was, the last sample's diagnosis, at least incomplete, exit 4).

Each sample first reads every worker's main-thread CPU time from /proc (schedstat, in ns; the 10 ms
ticks of stat where schedstat is missing), which costs the targets nothing, then the stacks: a blocking
py-spy dump (one short pause per rank) when no main thread moved, a non-blocking one (no pause) when one
did, because a rank that burns CPU may be spinning at a host sync as NCCL ranks do. See
``mtpdiag.analysis.stall`` for when a hang is called. The defaults (a sample a second, a 5 s stall window)
call a hang within about 8 s of its onset, and tolerate steps that keep the main thread at one place
(a data-loader wait, a slow collective, a long device step) for up to about 4 s; raise ``--stall`` for
longer ones.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer

from mtpdiag import pipeline
from mtpdiag.analysis.stall import StallTracker
from mtpdiag.capture.flight_recorder import LiveProgress
from mtpdiag.commands import options as o
from mtpdiag.errors import EXIT_OK, EXIT_PROBLEM, InputError, NothingCaptured
from mtpdiag.model import Snapshot
from mtpdiag.pipeline.output import emit


def watch(
    pid: list[int] | None = o.PID,
    all_: bool = o.ALL,
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between samples."),
    stall: float = typer.Option(
        5.0,
        "--stall",
        min=0.5,
        help="Call a hang after this many seconds in which no main thread ran "
        "and no stack changed; raise it when a healthy step idles longer "
        "(a data-loader wait, a slow collective).",
    ),
    duration: float | None = typer.Option(
        None,
        "--duration",
        min=0.1,
        help="Stop after this many seconds: exit 0 if the job was seen to move, "
        "4 if it was never seen to (watch longer).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Bundle to write on a hang (default ./mtpdiag-hang-HOST-TIME.json; a directory works)."
    ),
    native: bool = o.NATIVE,
    native_timeout: float = o.NATIVE_TIMEOUT,
    nonblocking: bool = o.NONBLOCKING,
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
    fmt: o.Format | None = o.FORMAT,
    as_json: bool = o.JSON,
    markdown: bool = o.MARKDOWN,
    html: Path | None = o.HTML,
    ray: str | None = o.RAY,
    ray_timeout: float = o.RAY_TIMEOUT,
) -> None:
    """Tell a hang from slow progress: sample until nothing moves for --stall seconds."""
    from mtpdiag.capture import capture, find_targets
    from mtpdiag.inputs.bundle import check_destination, save_bundle

    if not pid and not all_ and ray is None:
        raise InputError("give --pid PID (a worker or its torchrun agent), --all or --ray")
    output = o.output_format(fmt, as_json, markdown)  # before the first sample, not after a long watch
    if out is not None:
        check_destination(str(out))
    layout_options = pipeline.LayoutOptions(
        tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order, config=config, overrides=tuple(override or ())
    )
    cluster = o.ray_cluster(ray, ray_timeout, pid, all_, command="watch")
    status = _Status()
    # The Flight Recorder's progress signal (a job that set TORCH_NCCL_DEBUG_INFO_PIPE_FILE); --ray: polled on
    # each rank's node by its capture task, with the state kept here.
    fr_progress = LiveProgress() if cluster is None else cluster.track_progress()
    start = time.monotonic()
    tracker = StallTracker.start(start)
    last: Snapshot | None = None

    def list_targets() -> list:
        """The ranks now: pids here, or (node id, pid) across the Ray cluster. InputError when there are none."""
        if cluster is None:
            return find_targets(list(pid or []), all_)
        readings, _ = cluster.cpu()
        if not readings:
            raise InputError("no node of the Ray cluster runs a process with RANK in its environment")
        return sorted(readings)

    def take_stacks(targets: list, busy: bool = False) -> Snapshot | None:
        """The stacks, or None when the ranks changed under the dump (a job that is ending)."""
        try:
            if cluster is not None:
                return pipeline.capture_ray(
                    cluster,
                    said=said,
                    native=native and not busy,
                    native_timeout=native_timeout,
                    nonblocking=nonblocking or busy,
                    timeout=timeout,
                )
            return capture(
                targets,
                native=native and not busy,
                native_timeout=native_timeout,
                nonblocking=nonblocking or busy,
                timeout=timeout,
            )
        except (NothingCaptured, InputError):  # e.g. a worker that exited between discovery and its dump
            now_targets = _targets_now(list_targets)
            if now_targets is None:
                _ended(status, tracker, time.monotonic() - start)
            if set(now_targets) != set(targets):
                return None
            raise

    said: set[str] = set()  # --ray: each node's failure is said once, not at every sample
    read_cpu = (lambda targets: cluster.cpu()[0]) if cluster is not None else None
    try:
        while True:
            now = time.monotonic()
            if duration is not None and now - start >= duration:
                break
            try:
                targets = list_targets()
            except InputError:
                if tracker.samples == 0:
                    raise
                _ended(status, tracker, now - start)
            tracker, snapshot = pipeline.sample_once(tracker, targets, now, take_stacks, fr_progress, read_cpu)
            last = snapshot or last
            status.show(
                f"watching {len(targets)} ranks: sample {tracker.samples}, "
                f"no progress for {tracker.stalled_for(now):.1f} s"
            )
            if tracker.is_hang(now, stall) and last is not None:
                status.done()
                # The dumps the last samples asked for (or the watchdog wrote) are fresh: no new request, no wait.
                if cluster is None:
                    last = pipeline.with_flight_recorder(last)
                report = pipeline.hang_report(
                    pipeline.diagnose_snapshot(last, layout_options, fr=last.flight_recorder),
                    tracker,
                    now,
                    interval,
                    stall,
                )
                if cluster is not None:
                    cluster.close()  # Ray's messages no longer share stdout with the report
                path = save_bundle(last, pipeline.hang_bundle_path(out, last))
                print(
                    f"mtpdiag watch: hang after {tracker.stalled_for(now):.1f} s without progress; "
                    f"bundle written to {path}",
                    file=sys.stderr,
                )
                emit(report, output, html)
                raise typer.Exit(EXIT_PROBLEM)
            time.sleep(max(0.0, interval - (time.monotonic() - now)))

        status.done()
        end = time.monotonic()
        try:
            targets = list_targets()
        except InputError:
            _ended(status, tracker, end - start)
        snapshot = take_stacks(targets)  # one more pause, so the report shows where the ranks are now
    finally:
        if cluster is not None:
            cluster.close()
    if snapshot is None:
        _ended(status, tracker, end - start)
    report = pipeline.progress_report(
        pipeline.diagnose_snapshot(snapshot, layout_options), tracker, end, interval, stall
    )
    emit(report, output, html)
    raise typer.Exit(pipeline.exit_code(report))


def _targets_now(list_targets: Callable[[], list]) -> list | None:
    """The workers now; None when there are none left (the job ended)."""
    try:
        return list_targets()
    except InputError:
        return None


def _ended(status: _Status, tracker: StallTracker, elapsed: float) -> NoReturn:
    """The workers are gone: the job finished (or was ended) while it was still making progress."""
    status.done()
    print(
        f"mtpdiag watch: the job ended after {elapsed:.1f} s of watching ({tracker.samples} samples) without a hang",
        file=sys.stderr,
    )
    raise typer.Exit(EXIT_OK)


class _Status:
    """A one-line live status on stderr, only on a TTY."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._shown = False

    def show(self, text: str) -> None:
        if self._tty:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
            self._shown = True

    def done(self) -> None:
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)
