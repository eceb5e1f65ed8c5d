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
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import typer

from mtpdiag import pipeline
from mtpdiag.commands import options as o
from mtpdiag.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mtpdiag.model import Report, Snapshot
from mtpdiag.pipeline.output import emit
from mtpdiag.pipeline.watcher import JobEnded, Watcher
from mtpdiag.vocabulary.states import WatchPhase as Phase

if TYPE_CHECKING:
    from mtpdiag.capture.ray_cluster import RayCluster


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
    if not pid and not all_ and ray is None:
        raise InputError("give --pid PID (a worker or its torchrun agent), --all or --ray")
    output = o.output_format(fmt, as_json, markdown)  # before the first sample, not after a long watch
    if out is not None:
        from mtpdiag.inputs.bundle import check_destination

        check_destination(str(out))
    layout = pipeline.LayoutOptions(
        tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order, config=config, overrides=tuple(override or ())
    )
    cluster = o.ray_cluster(ray, ray_timeout, pid, all_, command="watch")
    stacks = StackOptions(native, native_timeout, nonblocking, timeout)
    watcher = _watcher(cluster, list(pid or []), all_, stacks, layout, interval, stall)
    status = _Status()
    try:
        code = _watch(watcher, status, duration, out, output, html, cluster)
    except JobEnded as ended:
        status.done()
        print(f"mtpdiag watch: {ended}", file=sys.stderr)
        code = EXIT_OK
    finally:
        if cluster is not None:
            cluster.close()
    raise typer.Exit(code)


class StackOptions(NamedTuple):
    native: bool
    native_timeout: float
    nonblocking: bool
    timeout: float


def _watcher(
    cluster: RayCluster | None,
    pids: list[int],
    all_: bool,
    stacks: StackOptions,
    layout: pipeline.LayoutOptions,
    interval: float,
    stall: float,
) -> Watcher:
    """The Watcher over this host's pids, or (``--ray``) every node's ranks keyed by (node id, pid)."""
    from mtpdiag.capture import capture, find_targets
    from mtpdiag.capture.flight_recorder import LiveProgress

    said: set[str] = set()  # --ray: each node's failure is said once, not at every sample

    def list_targets() -> list[Any]:
        """The ranks now. InputError when there are none."""
        if cluster is None:
            return find_targets(pids, all_)
        readings, _ = cluster.cpu()
        if not readings:
            raise InputError("no node of the Ray cluster runs a process with RANK in its environment")
        return sorted(readings)

    def take_stacks(targets: list[Any], busy: bool = False) -> Snapshot:
        native, nonblocking = stacks.native and not busy, stacks.nonblocking or busy
        if cluster is not None:
            return pipeline.capture_ray(
                cluster,
                said=said,
                native=native,
                native_timeout=stacks.native_timeout,
                nonblocking=nonblocking,
                timeout=stacks.timeout,
            )
        return capture(
            targets,
            native=native,
            native_timeout=stacks.native_timeout,
            nonblocking=nonblocking,
            timeout=stacks.timeout,
        )

    return Watcher(
        list_targets=list_targets,
        take_stacks=take_stacks,
        layout=layout,
        interval=interval,
        stall=stall,
        # The Flight Recorder's progress signal (a job that set TORCH_NCCL_DEBUG_INFO_PIPE_FILE); --ray: polled
        # on each rank's node by its capture task, with the state kept here.
        fr_progress=LiveProgress() if cluster is None else cluster.track_progress(),
        read_cpu=(lambda _targets: cluster.cpu()[0]) if cluster is not None else None,
        local_fr=cluster is None,
    )


def _watch(
    watcher: Watcher,
    status: _Status,
    duration: float | None,
    out: Path | None,
    output: str,
    html: Path | None,
    cluster: RayCluster | None,
) -> int:
    """Sample until a hang (the report, a bundle, 1) or the end of --duration (the report, its code)."""
    while True:
        now = time.monotonic()
        if duration is not None and now - watcher.started >= duration:
            break
        sample = watcher.sample(now)
        status.show(watcher.status(sample.targets, now))
        if watcher.decide(now) is Phase.HANG:
            status.done()
            report = watcher.call_hang(now)
            if cluster is not None:
                cluster.close()  # Ray's messages no longer share stdout with the report
            _save_and_emit(watcher, report, now, out, output, html)
            return EXIT_PROBLEM
        time.sleep(max(0.0, watcher.interval - (time.monotonic() - now)))
    status.done()
    snapshot, end = watcher.last_look()
    if cluster is not None:
        cluster.close()
    report = watcher.progress_report(snapshot, end)
    emit(report, output, html)
    return pipeline.exit_code(report)


def _save_and_emit(
    watcher: Watcher, report: Report, now: float, out: Path | None, output: str, html: Path | None
) -> None:
    from mtpdiag.inputs.bundle import save_bundle

    assert watcher.last is not None
    path = save_bundle(watcher.last, pipeline.hang_bundle_path(out, watcher.last))
    print(
        f"mtpdiag watch: hang after {watcher.tracker.stalled_for(now):.1f} s without progress; "
        f"bundle written to {path}",
        file=sys.stderr,
    )
    emit(report, output, html)


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
