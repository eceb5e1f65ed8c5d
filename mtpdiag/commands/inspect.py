"""``mtpdiag inspect``: capture the live ranks on this host (or, with ``--ray``, on every node of a Ray cluster)
and print the diagnosis."""

from __future__ import annotations

from pathlib import Path

import typer

from mtpdiag.commands import options as o
from mtpdiag.errors import InputError


def inspect(
    pid: list[int] | None = o.PID,
    all_: bool = o.ALL,
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
    fr_dump: bool = typer.Option(
        False,
        "--fr-dump",
        help="Ask every rank for a fresh Flight Recorder dump "
        "through the job's TORCH_NCCL_DEBUG_INFO_PIPE_FILE (the job keeps running).",
    ),
    fr_wait: float = typer.Option(10.0, "--fr-wait", min=0.1, help="Seconds to wait for the dumps --fr-dump asks for."),
    fmt: o.Format | None = o.FORMAT,
    as_json: bool = o.JSON,
    markdown: bool = o.MARKDOWN,
    html: Path | None = o.HTML,
    ray: str | None = o.RAY,
    ray_timeout: float = o.RAY_TIMEOUT,
) -> None:
    """Capture every rank (py-spy, in parallel) and say which collective only part of a group entered."""
    from mtpdiag import pipeline
    from mtpdiag.capture import capture
    from mtpdiag.pipeline.output import emit

    if not pid and not all_ and ray is None:
        raise InputError("give --pid PID (a worker or its torchrun agent), --all or --ray")
    output = o.output_format(fmt, as_json, markdown)  # before any rank is paused
    cluster = o.ray_cluster(ray, ray_timeout, pid, all_)
    if cluster is not None:
        with cluster:
            snapshot = pipeline.capture_ray(
                cluster,
                native=native,
                native_timeout=native_timeout,
                nonblocking=nonblocking,
                timeout=timeout,
                fr_dump=fr_dump,
                fr_wait=fr_wait,
            )
    else:
        formats = (output, "html") if html is not None else (output,)
        snapshot = capture(
            list(pid or []),
            scan_all=all_,
            native=native,
            native_timeout=native_timeout,
            nonblocking=nonblocking,
            timeout=timeout,
            progress=True,
            meanwhile=lambda: pipeline.import_ahead(formats),
        )
        snapshot = pipeline.with_flight_recorder(snapshot, request=fr_dump, wait_s=fr_wait)
    layout_options = pipeline.LayoutOptions(
        tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order, config=config, overrides=tuple(override or ())
    )
    report = pipeline.diagnose_snapshot(snapshot, layout_options, fr=snapshot.flight_recorder)
    emit(report, output, html)
    pipeline.warn_incomplete(snapshot)
    raise typer.Exit(pipeline.exit_code(report))


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)
