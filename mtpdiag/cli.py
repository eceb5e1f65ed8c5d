"""The ``mtpdiag`` command line: one typer app; each subcommand lives in ``mtpdiag/commands/``."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from mtpdiag import __version__
from mtpdiag.errors import EXIT_USAGE, MtpdiagError

app = typer.Typer(
    name="mtpdiag",
    help="Hang analyzer for distributed PyTorch / Megatron training.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

# Each module defines register(app). Order here is the order of `mtpdiag --help`.
COMMAND_MODULES = ("inspect", "collect", "analyze", "watch", "check", "apply", "verify", "lint")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mtpdiag {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Find the collective that only part of a process group entered, and why."""


for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"mtpdiag.commands.{_name}")
    except ModuleNotFoundError as exc:  # a command not built yet must not break the others
        if exc.name != f"mtpdiag.commands.{_name}":
            raise
        continue
    _module.register(app)


def _click_exceptions() -> tuple[type, ...]:
    """Usage errors: click's, and the copy of click that newer typer vendors as ``typer._click``."""
    import click

    types: list[type] = [click.exceptions.ClickException]
    try:
        from typer._click.exceptions import ClickException as VendoredClickException

        types.append(VendoredClickException)
    except ImportError:
        pass
    return tuple(types)


def main() -> None:
    """Run the app; any MtpdiagError becomes one stderr line and its exit code, never a traceback."""
    try:
        # Without standalone mode click returns the code of a typer.Exit instead of exiting.
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except MtpdiagError as exc:
        typer.echo(f"mtpdiag: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("mtpdiag: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("mtpdiag: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors and anything unforeseen
        if isinstance(exc, _click_exceptions()):
            typer.echo(f"mtpdiag: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
        if os.environ.get("MTPDIAG_DEBUG"):
            raise
        typer.echo(f"mtpdiag: internal error: {type(exc).__name__}: {exc} (set MTPDIAG_DEBUG=1 for a traceback)",
                   err=True)
        sys.exit(EXIT_USAGE)
