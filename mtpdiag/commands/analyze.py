"""``mtpdiag analyze``: diagnose saved bundles, py-spy JSON dumps or pasted py-spy text."""

from __future__ import annotations

from pathlib import Path

import typer

from mtpdiag.commands import options as o


def analyze(
    paths: list[str] | None = typer.Argument(
        None,
        help="Bundles, py-spy (JSON or text), pystack or faulthandler "
        "dumps, or directories. Optional with --fr or --log.",
    ),
    tp: int | None = o.TP,
    cp: int | None = o.CP,
    pp: int | None = o.PP,
    ep: int | None = o.EP,
    etp: int | None = o.ETP,
    vpp: int | None = o.VPP,
    order: str | None = o.ORDER,
    config: str | None = o.CONFIG,
    override: list[str] | None = o.OVERRIDE,
    world_size: int | None = typer.Option(
        None, "--world-size", min=1, help="World size, when the files do not carry WORLD_SIZE."
    ),
    rank_from: str | None = typer.Option(
        None,
        "--rank-from",
        help="A regular expression whose first group is "
        "the rank, searched in the lines around each dump, then its path.",
    ),
    fr: str | None = typer.Option(
        None,
        "--fr",
        help="torch Flight Recorder dumps of the hang: a directory, "
        "or the TORCH_FR_DUMP_TEMP_FILE prefix (stacks optional).",
    ),
    log: list[Path] | None = typer.Option(
        None, "--log", help="A job log with NCCL watchdog timeout lines. Repeatable."
    ),
    fmt: o.Format | None = o.FORMAT,
    as_json: bool = o.JSON,
    markdown: bool = o.MARKDOWN,
    html: Path | None = o.HTML,
) -> None:
    """Diagnose captures saved earlier, from one host or many (bundles are merged by rank), with the Flight
    Recorder's dumps and the watchdog's log lines of the same hang when there are any."""
    from mtpdiag import exits, pipeline
    from mtpdiag.errors import InputError
    from mtpdiag.inputs import read_inputs
    from mtpdiag.model import Snapshot
    from mtpdiag.pipeline.output import emit

    output = o.output_format(fmt, as_json, markdown)
    if not paths and fr is None and not log:
        raise InputError("nothing to analyze: give dump files or directories, --fr PREFIX or --log FILE")
    fr_dumps = watchdog = None
    if fr is not None:  # fail fast on a bad --fr or --log, before the stacks are read
        from mtpdiag.inputs.flight_recorder import load_fr_dumps

        fr_dumps = load_fr_dumps(fr)
    if log:
        from mtpdiag.inputs.watchdog_log import load_watchdog_logs

        watchdog = load_watchdog_logs([str(p) for p in log])
    with pipeline.paused_gc():
        snapshot = Snapshot(captures=())
        if paths:
            inputs = read_inputs(list(paths), rank_from=rank_from)
            snapshot = inputs.snapshot
            for note in inputs.notes:
                typer.echo(f"mtpdiag: note: {note}", err=True)
            if inputs.logs:  # a watchdog log given as a dump: read as --log reads it
                from mtpdiag.inputs.watchdog_log import load_watchdog_logs

                watchdog = load_watchdog_logs([*(str(p) for p in log or ()), *inputs.logs])
        if world_size is not None:
            snapshot = pipeline.with_world_size(snapshot, world_size)
        layout_options = pipeline.LayoutOptions(
            tp=tp,
            cp=cp,
            pp=pp,
            ep=ep,
            etp=etp,
            vpp=vpp,
            order=order,
            config=config,
            overrides=tuple(override or ()),
            world_size=world_size,
        )
        report = pipeline.diagnose_snapshot(
            snapshot, layout_options, fr=fr_dumps or snapshot.flight_recorder, log=watchdog
        )
        emit(report, output, html)
    if paths:
        pipeline.warn_incomplete(snapshot)
    code = pipeline.exit_code(report)
    exits.now(code)  # the snapshot and the report are never freed: the process ends here
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
