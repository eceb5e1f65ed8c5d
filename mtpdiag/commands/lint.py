"""``mtpdiag lint``: find collectives that only some ranks can reach, statically."""

from __future__ import annotations

import json

import msgspec
import typer

from mtpdiag.errors import EXIT_OK, EXIT_PROBLEM


def lint(
    paths: list[str] = typer.Argument(..., help="Python files or directories (walked for *.py)."),
    as_json: bool = typer.Option(False, "--json", help="Print the mtpdiag.lint/1 JSON document."),
) -> None:
    """Flag collectives under a rank-dependent condition that splits their group.

    A pipeline-stage test around a DP×CP collective is not flagged: every member of that group is on the
    same stage. Exit 0: clean; 1: findings; 2: bad input."""
    from mtpdiag.lint import lint_paths

    result = lint_paths(paths)
    for skipped in result.skipped:
        typer.echo(f"mtpdiag: skipped {skipped}", err=True)
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(result.document), indent=2))
    else:
        for f in result.findings:
            typer.echo(f"{f.file}:{f.line}: {f.collective} under `{f.condition}`\n    {f.reason}")
        noun = "file" if result.files == 1 else "files"
        typer.echo(f"{len(result.findings)} finding(s) in {result.files} {noun}")
    raise typer.Exit(EXIT_PROBLEM if result.findings else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("lint")(lint)
