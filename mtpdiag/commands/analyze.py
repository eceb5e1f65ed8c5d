"""``mtpdiag analyze``: diagnose saved bundles, py-spy JSON dumps or pasted py-spy text."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mtpdiag.commands import options as o


def analyze(
    paths: List[str] = typer.Argument(..., help="Bundles, py-spy --json dumps, py-spy text, or directories."),
    tp: Optional[int] = o.TP,
    cp: Optional[int] = o.CP,
    pp: Optional[int] = o.PP,
    ep: Optional[int] = o.EP,
    etp: Optional[int] = o.ETP,
    vpp: Optional[int] = o.VPP,
    order: Optional[str] = o.ORDER,
    config: Optional[str] = o.CONFIG,
    override: Optional[List[str]] = o.OVERRIDE,
    world_size: Optional[int] = typer.Option(None, "--world-size", min=1,
                                             help="World size, when the files do not carry WORLD_SIZE."),
    rank_from: Optional[str] = typer.Option(None, "--rank-from", help="A regular expression whose first group is "
                                            "the rank, searched in the lines around each dump, then its path."),
    fr: Optional[str] = typer.Option(None, "--fr", help="torch Flight Recorder dumps to check the stacks "
                                     "against: a directory, or the TORCH_FR_DUMP_TEMP_FILE prefix."),
    as_json: bool = o.JSON,
    markdown: bool = o.MARKDOWN,
    html: Optional[Path] = o.HTML,
) -> None:
    """Diagnose captures saved earlier, from one host or many (bundles are merged by rank)."""
    from mtpdiag.inputs import read_inputs

    fr_dumps = None
    if fr is not None:  # fail fast on a bad --fr, before the stacks are read
        from mtpdiag.flight_recorder import load_fr_dumps

        fr_dumps = load_fr_dumps(fr)
    with o.paused_gc():
        inputs = read_inputs(list(paths), rank_from=rank_from)
        snapshot = inputs.snapshot
        for note in inputs.notes:
            typer.echo(f"mtpdiag: note: {note}", err=True)
        if world_size is not None:
            snapshot = with_world_size(snapshot, world_size)
        layout_options = o.LayoutOptions(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order,
                                         config=config, overrides=tuple(override or ()))
        report = o.diagnose_snapshot(snapshot, layout_options)
        if fr_dumps is not None:
            from dataclasses import replace

            from mtpdiag.flight_recorder import correlate

            report = replace(report, extra={**report.extra, "flight_recorder": correlate(report, fr_dumps)})
        o.emit(report, as_json, markdown, html)
    o.warn_incomplete(snapshot)
    raise typer.Exit(o.exit_code(report))


def with_world_size(snapshot, world_size: int):
    """Give every capture that lacks WORLD_SIZE the one from --world-size."""
    from dataclasses import replace

    captures = tuple(
        c if c.world_size else replace(c, env=tuple(sorted(dict(c.env, WORLD_SIZE=str(world_size)).items())))
        for c in snapshot.captures
    )
    return replace(snapshot, captures=captures)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
