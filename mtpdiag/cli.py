"""The ``mtpdiag`` command line: one typer app; each subcommand lives in ``mtpdiag/commands/``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer

from mtpdiag import __version__, exits
from mtpdiag.errors import EXIT_INTERNAL, EXIT_USAGE, MtpdiagError

# Each module defines register(app). Order here is the order of `mtpdiag --help`.
COMMAND_MODULES = ("run", "inspect", "collect", "analyze", "watch", "check", "apply", "verify", "lint", "schema")


# One-shot commands that leave no child process, thread, temporary file or atexit handler behind: they may
# end their process without freeing what they built (mtpdiag.exits).
EXIT_WITHOUT_TEARDOWN = frozenset({"analyze"})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mtpdiag {__version__}")
        raise typer.Exit(0)


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Find the collective that only part of a process group entered, and why."""


def build_app(commands: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The typer app with the given subcommands (all of them unless the caller knows which one runs)."""
    app = typer.Typer(
        name="mtpdiag",
        help="Hang analyzer for distributed PyTorch / Megatron training.",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    for name in commands:
        importlib.import_module(f"mtpdiag.commands.{name}").register(app)
    return app


def __getattr__(name: str) -> typer.Typer:
    """``from mtpdiag.cli import app``: the full app, built on first use."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def invoked_command(argv: list[str]) -> str | None:
    """The subcommand a command line runs, when it is plain to see (``mtpdiag inspect ...``).

    Building only that subcommand keeps start-up short: inspect runs while a job is hung.
    """
    first = argv[0] if argv else None
    return first if first in COMMAND_MODULES else None


def _click_exceptions() -> tuple[type[Any], ...]:
    """Usage errors: those of the copy of click that typer vendors (``typer._click``), and click's own
    where it is installed (older typer depends on it)."""
    types: list[type[Any]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            types.append(importlib.import_module(module).ClickException)
        except ImportError:
            pass
    return tuple(types)


def console_main() -> None:
    """The ``mtpdiag`` console script and ``python -m mtpdiag``: ``main`` in a process of its own, which a
    one-shot command may end without teardown (mtpdiag.exits)."""
    main(own_process=True)


def main(*, own_process: bool = False) -> None:
    """Run the app; any MtpdiagError becomes one stderr line and its exit code, never a traceback.

    In-process callers (tests) keep the default: the command returns, whatever it is. An internal error (exit
    70) writes a crash file (``mtpdiag.crash``) and names it in its one line."""
    argv = sys.argv[1:]
    app: typer.Typer | None = None
    try:
        # Without standalone mode click returns the code of a typer.Exit instead of exiting.
        from mtpdiag.commands.options import fill_optional_values

        argv = fill_optional_values(argv)
        command = invoked_command(argv)
        app = build_app((command,) if command else COMMAND_MODULES)
        if own_process and command in EXIT_WITHOUT_TEARDOWN:
            exits.allow()
        code = app(args=argv, standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except MtpdiagError as exc:
        typer.echo(f"mtpdiag: error: {_one_line(exc)}", err=True)
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
            typer.echo(f"mtpdiag: error: {_one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
        if os.environ.get("MTPDIAG_DEBUG"):
            raise
        typer.echo(
            f"mtpdiag: internal error: {type(exc).__name__}: {_one_line(exc)}; {_crash_file(exc, argv, app)} "
            "(set MTPDIAG_DEBUG=1 for a traceback)",
            err=True,
        )
        sys.exit(EXIT_INTERNAL)


def _crash_file(exc: Exception, argv: list[str], app: typer.Typer | None) -> str:
    """Where the crash file of ``exc`` went, in words; never an error of its own (it would hide the first)."""
    try:
        from mtpdiag.crash import option_kinds, write_crash_file

        command = typer.main.get_command(app) if app is not None else None
        path, why = write_crash_file(exc, argv, option_kinds(command))
    except Exception as err:
        path, why = None, f"{type(err).__name__}: {err}"
    return f"crash report: {path}" if path else f"no crash report ({_one_line(why)})"


def _one_line(message: object) -> str:
    """The error contract is one stderr line: newlines (in a path, in a library's text) become spaces, and no
    control character reaches the terminal."""
    from mtpdiag.model import printable

    return printable(str(message))
