"""``mtpdiag check``: is the installed verl's Megatron engine affected by the MTP/CP deadlock?"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import typer

from mtpdiag.errors import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE
from mtpdiag.vocabulary.states import CheckStatus

PATH = typer.Option(
    None,
    "--path",
    help="The engine file (default: the installed verl's verl/workers/engine/megatron/transformer_impl.py).",
)
EXIT_BY_STATUS = {
    CheckStatus.FIXED: EXIT_OK,
    CheckStatus.NOT_APPLICABLE: EXIT_OK,
    CheckStatus.AFFECTED: EXIT_PROBLEM,
    CheckStatus.UNKNOWN: EXIT_USAGE,
}


def engine_path(path: Path | None) -> Path | None:
    """--path, or the installed verl's engine file (None when that verl has no Megatron engine)."""
    from mtpdiag.fix.engine import locate_engine

    return Path(path) if path is not None else locate_engine()


def check(
    path: Path | None = PATH,
    as_json: bool = typer.Option(False, "--json", help="Print the mtpdiag.check/1 JSON document."),
) -> None:
    """Say whether verl's engine gates the MTP loss collection so that cp > 0 ranks skip it (verl #5895).

    Exit 0: fixed or not applicable; 1: affected; 2: unknown shape or a file that cannot be read."""
    from mtpdiag.fix.engine import (
        ENGINE_PARTS,
        EngineCheck,
        check_engine,
        check_text,
        installed_verl_dirs,
        verl_version,
    )

    target = engine_path(path)
    if target is None:  # verl is installed but has no Megatron engine
        where = installed_verl_dirs()[0]
        result = EngineCheck(
            path=str(where.joinpath(*ENGINE_PARTS[1:])),
            verl_version=verl_version(where.joinpath(*ENGINE_PARTS[1:])),
            status=CheckStatus.NOT_APPLICABLE,
            lines=None,
            reason="this verl has no Megatron engine file",
        )
    else:
        result = check_engine(target)
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(result), indent=2))
    else:
        typer.echo(check_text(result, explicit_path=path is not None))
    raise typer.Exit(EXIT_BY_STATUS[result.status])


def register(app: typer.Typer) -> None:
    app.command("check")(check)
