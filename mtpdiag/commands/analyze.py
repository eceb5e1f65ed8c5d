"""``mtpdiag analyze``: diagnose saved bundles, py-spy JSON dumps or pasted py-spy text."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mtpdiag.commands import options as o


def analyze(
    paths: Optional[List[str]] = typer.Argument(None, help="Bundles, py-spy (JSON or text), pystack or faulthandler "
                                                "dumps, or directories. Optional with --fr or --log."),
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
    fr: Optional[str] = typer.Option(None, "--fr", help="torch Flight Recorder dumps of the hang: a directory, "
                                     "or the TORCH_FR_DUMP_TEMP_FILE prefix (stacks optional)."),
    log: Optional[List[Path]] = typer.Option(None, "--log", help="A job log with NCCL watchdog timeout lines. "
                                             "Repeatable."),
    as_json: bool = o.JSON,
    markdown: bool = o.MARKDOWN,
    html: Optional[Path] = o.HTML,
) -> None:
    """Diagnose captures saved earlier, from one host or many (bundles are merged by rank), with the Flight
    Recorder's dumps and the watchdog's log lines of the same hang when there are any."""
    from mtpdiag.errors import InputError
    from mtpdiag.inputs import read_inputs
    from mtpdiag.model import Snapshot

    o.check_formats(as_json, markdown)
    if not paths and fr is None and not log:
        raise InputError("nothing to analyze: give dump files or directories, --fr PREFIX or --log FILE")
    fr_dumps = watchdog = None
    if fr is not None:  # fail fast on a bad --fr or --log, before the stacks are read
        from mtpdiag.inputs.flight_recorder import load_fr_dumps

        fr_dumps = load_fr_dumps(fr)
    if log:
        watchdog = read_logs(log)
    with o.paused_gc():
        snapshot = Snapshot(captures=())
        if paths:
            inputs = read_inputs(list(paths), rank_from=rank_from)
            snapshot = inputs.snapshot
            for note in inputs.notes:
                typer.echo(f"mtpdiag: note: {note}", err=True)
        if world_size is not None:
            snapshot = with_world_size(snapshot, world_size)
        layout_options = o.LayoutOptions(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order,
                                         config=config, overrides=tuple(override or ()), world_size=world_size)
        report = o.diagnose_snapshot(snapshot, layout_options, fr=fr_dumps or snapshot.flight_recorder,
                                     log=watchdog)
        o.emit(report, as_json, markdown, html)
    if paths:
        o.warn_incomplete(snapshot)
    raise typer.Exit(o.exit_code(report))


def read_logs(paths: List[Path]):
    """The watchdog lines of every log, as one ``WatchdogLog`` (a one-line InputError for an unreadable file,
    and for logs that hold no watchdog line at all: a wrong file should not pass for "no timeout")."""
    from mtpdiag.errors import InputError
    from mtpdiag.inputs.watchdog_log import WatchdogLog, load_watchdog_log

    logs = [load_watchdog_log(str(p)) for p in paths]
    if not any(log.timeouts or log.statuses for log in logs):
        raise InputError(f"no NCCL watchdog line (\"Watchdog caught collective operation timeout\") in "
                         f"{', '.join(map(str, paths))}")
    return WatchdogLog(timeouts=tuple(t for log in logs for t in log.timeouts),
                       statuses=tuple(s for log in logs for s in log.statuses),
                       desync=tuple(d for log in logs for d in log.desync))


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
