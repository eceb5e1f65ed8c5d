"""``mtpdiag collect``: capture the ranks on this host and save a bundle for ``mtpdiag analyze``.

Run it on every host of a multi-node job (one bundle per host, e.g. into one shared directory),
then ``mtpdiag analyze DIR`` merges the bundles by rank; on a Ray cluster, ``--ray`` captures every node from
here and writes their merged bundle.
"""

from __future__ import annotations

import typer

from mtpdiag import pipeline
from mtpdiag.commands import options as o


def collect(
    out: str = typer.Option(..., "--out", help="Bundle file to write, or a directory (writes <host>.mtpdiag.json)."),
    pid: list[int] | None = o.PID,
    all_: bool = o.ALL,
    host: str | None = typer.Option(None, "--host", help="Host label in the bundle (default: this hostname)."),
    native: bool = o.NATIVE,
    native_timeout: float = o.NATIVE_TIMEOUT,
    nonblocking: bool = o.NONBLOCKING,
    timeout: float = o.TIMEOUT,
    fr_dump: bool = typer.Option(
        False,
        "--fr-dump",
        help="Ask every rank for a fresh Flight Recorder dump through "
        "the job's TORCH_NCCL_DEBUG_INFO_PIPE_FILE, and put it in the bundle.",
    ),
    ray: str | None = o.RAY,
    ray_timeout: float = o.RAY_TIMEOUT,
) -> None:
    """Capture every rank (py-spy, in parallel) and write one bundle; without --pid, like --all."""
    from mtpdiag.capture import capture
    from mtpdiag.inputs.bundle import check_destination, save_bundle

    check_destination(out)  # before any process is paused
    pids = list(pid or [])
    cluster = o.ray_cluster(ray, ray_timeout, pids, all_, host)
    if cluster is not None:
        with cluster:
            snapshot = pipeline.capture_ray(
                cluster,
                native=native,
                native_timeout=native_timeout,
                nonblocking=nonblocking,
                timeout=timeout,
                fr_dump=fr_dump,
            )
    else:
        snapshot = capture(
            pids,
            scan_all=all_ or not pids,
            native=native,
            native_timeout=native_timeout,
            nonblocking=nonblocking,
            timeout=timeout,
            progress=True,
            host=host,
        )
        snapshot = pipeline.with_flight_recorder(snapshot, request=fr_dump)
    written = save_bundle(snapshot, out)
    captured = sum(1 for c in snapshot.captures if c.threads)
    missing = len(snapshot.captures) - captured
    fr = snapshot.flight_recorder
    dumps = f", Flight Recorder dumps of {len(fr.ranks)} ranks" if fr is not None else ""
    typer.echo(f"wrote {written} ({captured} ranks, {missing} unreadable{dumps})", err=True)


def register(app: typer.Typer) -> None:
    app.command("collect")(collect)
