"""``mtpdiag apply``: rewrite verl's affected MTP block into the fixed form (or --revert it)."""

from __future__ import annotations

from pathlib import Path

import typer

from mtpdiag.commands.check import PATH, engine_path
from mtpdiag.errors import InputError


def apply(
    path: Path | None = PATH,
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the diff; change nothing."),
    revert: bool = typer.Option(False, "--revert", help="Restore the original from the backup, byte for byte."),
    backup_dir: Path | None = typer.Option(
        None, "--backup-dir", help="Keep FILE.mtpdiag.bak here instead of beside FILE."
    ),
) -> None:
    """Fix the MTP/CP deadlock (verl #5895) in place: gate the collection on the last pipeline stage.

    Keeps the original as FILE.mtpdiag.bak and writes atomically. A fixed file is left alone (exit 0);
    a shape mtpdiag does not know is refused (exit 2, file untouched)."""
    from mtpdiag.fix.rewrite import apply_fix, revert_fix

    target = engine_path(path)
    if target is None:
        typer.echo("this verl has no Megatron engine file: nothing to do")
        raise typer.Exit(0)
    if revert:
        if dry_run:
            raise InputError("--revert and --dry-run do not go together")
        backup = revert_fix(target, backup_dir=backup_dir)
        typer.echo(f"restored {target} from {backup}")
        raise typer.Exit(0)
    outcome = apply_fix(target, dry_run=dry_run, backup_dir=backup_dir)
    where = f" (lines {outcome.lines[0]}-{outcome.lines[1]})" if outcome.lines else ""
    if outcome.action == "already-fixed":
        typer.echo(f"{target} is already fixed{where}: nothing to do")
    elif outcome.action == "not-applicable":
        typer.echo(f"{target} collects no MTP loss: nothing to do")
    else:
        typer.echo(outcome.diff, nl=False)
        extra = " and imported megatron.core.parallel_state as mpu" if outcome.added_import else ""
        if outcome.action == "would-patch":
            typer.echo(f"dry run: {target} not changed; run without --dry-run to apply")
        else:
            typer.echo(f"patched {target}{where}{extra}; original saved as {outcome.backup}")
            typer.echo(f"check it with: mtpdiag check --path {target}")
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    app.command("apply")(apply)
