"""``mtpdiag verify``: run a verl engine's MTP-loss gate on real megatron-core (CPU, gloo) and judge it.

The layout comes from flags, a verl config, or a hung job (``--pid``); the gate from ``--engine``
(buggy, fixed, both, the installed verl, or an engine file). Exit 0: the engine is safe on this layout
(for ``both``: buggy hangs exactly where cp > 1 and fixed logs the right metric); 1: it is not; 2: bad
input.
"""

from __future__ import annotations

import json
import sys

import msgspec
import typer

from mtpdiag.commands import options as o
from mtpdiag.errors import EXIT_OK, EXIT_PROBLEM


def verify(
    tp: int | None = o.TP,
    cp: int | None = o.CP,
    pp: int | None = o.PP,
    dp: int | None = typer.Option(
        None,
        "--dp",
        min=1,
        help="Data-parallel replicas in the verify world "
        "(default: the fewest the layout allows, usually 1; the job's with --pid).",
    ),
    ep: int | None = o.EP,
    etp: int | None = o.ETP,
    vpp: int | None = o.VPP,
    order: str | None = o.ORDER,
    engine: str = typer.Option(
        "installed",
        "--engine",
        help="fixed | buggy | both | installed | a path to verl's workers/engine/megatron/transformer_impl.py.",
    ),
    config: str | None = o.CONFIG,
    override: list[str] | None = o.OVERRIDE,
    pid: int | None = typer.Option(
        None, "--pid", help="Take the parallel sizes from this hung job (a worker or its launcher)."
    ),
    timeout: float = typer.Option(
        180.0,
        "--timeout",
        min=5.0,
        help="Seconds one world may run before it counts as an error (a hang is called within seconds).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the mtpdiag.verify/1 JSON document."),
) -> None:
    """Prove on your parallel layout that an MTP-loss gate completes with the right metric, or show it hang."""
    from mtpdiag.fix.verify import OUTCOME_DEADLOCK, RunResult, VerifyResult
    from mtpdiag.fix.verify.plan import choose_engine, require_runtime, resolve_verify_layout
    from mtpdiag.fix.verify.render import indent, intro_line, phases_line, report_text, run_line, verdict_line
    from mtpdiag.fix.verify.runner import RunSpec, WatchSettings, run_all

    flags = {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp, "vpp": vpp}
    layout, source = resolve_verify_layout(
        flags, dp=dp, order=order, config=config, overrides=list(override or ()), pid=pid
    )
    choice = choose_engine(engine)
    require_runtime()
    if not as_json:
        typer.echo(intro_line(layout, source, choice))

    def show(run: RunResult) -> None:
        if not as_json:
            typer.echo(run_line(run))
            if run.report is not None and run.outcome == OUTCOME_DEADLOCK:
                typer.echo(indent(report_text(run.report)))

    runs = run_all(layout, [RunSpec(e, g) for e, g in choice.runs], WatchSettings(timeout_s=timeout), on_result=show)
    result = VerifyResult.of(layout, choice.mode, runs, engine_path=choice.path, layout_source=source)
    if as_json:
        sys.stdout.write(json.dumps(msgspec.to_builtins(result), indent=2) + "\n")
    else:
        typer.echo(phases_line(runs))
        typer.echo(verdict_line(result))
    raise typer.Exit(EXIT_OK if result.passed else EXIT_PROBLEM)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
