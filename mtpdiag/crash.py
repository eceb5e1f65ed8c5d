"""Exit 70 keeps its evidence: an internal error writes a crash file, whose path its one-line error names.

A hang that was killed cannot be rerun with ``MTPDIAG_DEBUG=1``, so the traceback goes to a file, as
pre-commit writes ``~/.cache/pre-commit/pre-commit.log``: ``$XDG_STATE_HOME/mtpdiag/`` (else
``~/.local/state/mtpdiag/``, else the temporary directory), one ``crash-<UTC time>-<pid>.log`` per error,
readable by its owner only. It holds:

* the traceback, the mtpdiag and Python versions, the platform;
* the command line with every value that could carry a secret reduced to its shape: option names, flags,
  numbers and choices are kept; paths, regular expressions, overrides and addresses become ``<file, 2.1 kB>``,
  ``<directory, 17 files>`` or ``<text, 23 chars>``;
* the input's shape: how many files, their sizes, and the formats the readers sniff in them.

Never an environment value: nothing is read from ``os.environ`` but where the file goes.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from mtpdiag import __version__

# How each option's value is written: dropped for flags, kept for numbers and choices, else its shape.
FLAG, KEEP, SHAPE = "flag", "keep", "shape"
# click's value types (by class name: typer vendors its own click) that cannot carry a secret of any length.
KEPT_TYPES = frozenset(
    {"IntParamType", "FloatParamType", "IntRange", "FloatRange", "Choice", "TyperChoice", "BoolParamType"}
)
# The options whose values are inputs, and what their files are; the arguments' files are sniffed.
INPUT_OPTIONS = {"--fr": "Flight Recorder dump", "--log": "log"}
_SNIFFED = 2000  # files sniffed at most (the first ones): a 16k-rank input's shape needs no more
_HEAD = 64 * 1024  # bytes of each file the readers sniff


def crash_dirs() -> list[Path]:
    """Where a crash file may go, in order: ``$XDG_STATE_HOME/mtpdiag``, ``~/.local/state/mtpdiag``, then the
    temporary directory's ``mtpdiag-<uid>``."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return [Path(state) / "mtpdiag", Path(tempfile.gettempdir()) / f"mtpdiag-{os.getuid()}"]


def write_crash_file(exc: BaseException, argv: list[str], options: Mapping[str, str]) -> tuple[str | None, str]:
    """Write the crash file of ``exc`` for the command line ``argv`` (``options``: each option's spelling to
    ``FLAG``, ``KEEP`` or ``SHAPE``); the path written, or None and why none could be."""
    text = crash_text(exc, argv, options)
    name = f"crash-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
    why = "no place to write it"
    for directory in crash_dirs():
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write(text)
            return str(directory / name), ""
        except OSError as err:
            why = f"{directory}: {err.strerror or err}"
    return None, why


def option_kinds(command: object) -> dict[str, str]:
    """Each option's spellings (``--cp``, ``--no-color``) → how the crash file writes its value, from the click
    command the typer app builds (its subcommands' options too)."""
    kinds = {"--help": FLAG}
    for cmd in (command, *getattr(command, "commands", {}).values()):
        for param in getattr(cmd, "params", ()):
            if getattr(param, "param_type_name", "") != "option":
                continue
            if param.is_flag or param.count:
                kind = FLAG
            else:
                kind = KEEP if any(t.__name__ in KEPT_TYPES for t in type(param.type).__mro__) else SHAPE
            kinds.update(dict.fromkeys((*param.opts, *param.secondary_opts), kind))
    return kinds


def crash_text(exc: BaseException, argv: list[str], options: Mapping[str, str]) -> str:
    lines = [
        "mtpdiag crash report",
        f"time: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"mtpdiag: {__version__}",
        f"python: {platform.python_version()} ({platform.python_implementation()})",
        f"platform: {platform.platform()}",
        f"command: mtpdiag {' '.join(shaped_command_line(argv, options))}",
        "inputs:",
        *(f"  {line}" for line in _input_shape(argv, options)),
        "",
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip(),
        "",
    ]
    return "\n".join(lines)


def shaped_command_line(argv: list[str], options: Mapping[str, str]) -> list[str]:
    """``argv`` with each value that could carry a secret reduced to its shape (see the module)."""
    out: list[str] = []
    pending: str | None = None  # the option whose value comes next
    for i, arg in enumerate(argv):
        if pending is not None:
            out.append(arg if options.get(pending) == KEEP else shape_of(arg))
            pending = None
        elif i == 0 and not arg.startswith("-"):
            out.append(arg if arg.isidentifier() else shape_of(arg))  # the subcommand
        elif arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            kind = options.get(name)
            if kind is None:
                out.append("<unknown option>")
            elif eq:
                out.append(f"{name}={value if kind == KEEP else shape_of(value)}")
            else:
                out.append(name)
                pending = None if kind == FLAG else name
        else:
            out.append(shape_of(arg))
    return out


def shape_of(value: str) -> str:
    """What a value is, without what it says: a file and its size, a directory and its file count, or text and
    its length."""
    try:
        if os.path.isdir(value):
            count = sum(len(files) for _, _, files in os.walk(value))
            return f"<directory, {count} file{'s' if count != 1 else ''}>"
        if os.path.isfile(value):
            return f"<file, {_size(os.path.getsize(value))}>"
    except (OSError, ValueError):
        pass
    return f"<text, {len(value)} chars>"


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _input_shape(argv: list[str], options: Mapping[str, str]) -> list[str]:
    """How many input files, how big, and which formats the readers sniff in them (never a name)."""
    try:
        files = _input_files(argv, options)
        if not files:
            return ["no input files"]
        sizes = [os.path.getsize(f) for f, _ in files]
        formats: dict[str, int] = {}
        for path, given_as in files[:_SNIFFED]:
            kind = given_as or sniffed(path)
            formats[kind] = formats.get(kind, 0) + 1
        sniffed_how = "" if len(files) <= _SNIFFED else f" (the first {_SNIFFED} sniffed)"
        return [
            f"{len(files)} file{'s' if len(files) > 1 else ''}, {_size(sum(sizes))} in all, "
            f"the largest {_size(max(sizes))}",
            "formats: " + ", ".join(f"{k} x{n}" for k, n in sorted(formats.items())) + sniffed_how,
        ]
    except Exception as err:  # the shape is a courtesy: its own failure must not hide the crash
        return [f"could not be read ({type(err).__name__})"]


def _input_files(argv: list[str], options: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The input files (directories walked as ``analyze`` walks them), each with what its option says it is
    (None for the arguments, whose format is sniffed)."""
    from mtpdiag.inputs.files import expand

    named: list[tuple[str, str | None]] = []
    pending: str | None = None
    for arg in argv[1:]:
        if pending is not None:
            named += [(p, INPUT_OPTIONS[pending]) for p in _prefixed(arg)] if pending in INPUT_OPTIONS else []
            pending = None
        elif arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            if eq and name in INPUT_OPTIONS:
                named += [(p, INPUT_OPTIONS[name]) for p in _prefixed(value)]
            elif not eq and options.get(name) not in (FLAG, None):
                pending = name
        elif os.path.exists(arg):
            named.append((arg, None))
    return [(f, given_as) for path, given_as in named for f in expand([path])]


def _prefixed(value: str) -> list[str]:
    """A ``--fr`` prefix names the files it starts (``/tmp/fr/rank_`` → ``rank_0``, ...); a path itself."""
    if os.path.exists(value):
        return [value]
    directory, prefix = os.path.split(value)
    try:
        return sorted(os.path.join(directory or ".", n) for n in os.listdir(directory or ".") if n.startswith(prefix))
    except OSError:
        return []


def sniffed(path: str) -> str:
    """The reader that would read the file, from its first bytes (the registry's order)."""
    from mtpdiag.inputs.files import json_start
    from mtpdiag.inputs.lines import without_escapes
    from mtpdiag.inputs.registry import readers

    with open(path, "rb") as f:
        head = f.read(_HEAD)
    start = json_start(head)
    if start:
        return "JSON object (a bundle?)" if start == "{" else "py-spy JSON"
    text = without_escapes(head.decode("utf-8", "replace"))
    return next((r.name for r in readers() if r.sniff(text, path)), "not recognised")
