"""Read captures from files: mtpdiag bundles, ``py-spy dump --json`` files and pasted ``py-spy dump`` text.

Rules (the same for every command that reads files):

* Directories are walked recursively; there, only ``.json``, ``.txt``, ``.log``, ``.dump`` and ``.out``
  files are read (a named file is read whatever its name). A path that does not exist, or a directory
  with no such file, is an input error.
* A file that cannot be read as any of the three forms (garbage, truncated JSON, unreadable) is an input
  error when no file could be read at all; otherwise it is recorded, one line, in ``Snapshot.errors``
  and the rest is diagnosed. A file that parses but is partial (a thread missing) is kept as it is.
* The same rank in two files, or two different world sizes, is an input error naming both files.
* A raw dump's rank comes from its file name (``rank3``, ``rank-3``, ``rank_3``, ``r3``) or, failing
  that, from a ``RANK=3`` line in a text file; otherwise it is unknown. Its state is ``"unknown"``:
  py-spy does not record the process state.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass

from mtpdiag import __version__
from mtpdiag.bundle import snapshot_from_data
from mtpdiag.capture.cmdline import layout_hints, merge_hints
from mtpdiag.capture.discover import is_launcher_argv
from mtpdiag.capture.pyspy import display_path, kept_args, threads_from_json
from mtpdiag.errors import InputError, NothingCaptured
from mtpdiag.model import (BUNDLE_SCHEMA, ENV_WHITELIST, Frame, RankCapture, Snapshot, ThreadStack,
                           decimal, printable, world_sizes)

STATE_UNKNOWN = "unknown"
DUMP_SUFFIXES = (".json", ".txt", ".log", ".dump", ".out")
_UNKNOWN_HOST = "unknown"

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)
_R_IN_NAME = re.compile(r"(?:^|[^a-z0-9])r(\d+)(?![0-9])", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Numbers are ASCII and bounded: py-spy never prints others, and int() refuses 5000-digit strings.
_PROCESS = re.compile(r"^Process ([0-9]{1,10}): ?(.*)$")
_PARENT = re.compile(r"^Parent Process ([0-9]{1,10}): ?(.*)$")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]{1,16}|[0-9]{1,10}) \((idle|active|active\+gil)\)(?:: "(.*)")?\s*$')
_LINE_NO = re.compile(r"[0-9]{1,9}")
_FRAME = re.compile(r"^ {4}(?P<function>\S.*?) \((?P<where>[^()]*)\)\s*$")
_LOCAL = re.compile(r"^ {12}(?P<name>[^:\s]+): (?P<repr>.*)$")
_ENV_LINE = re.compile(r"^(?:export\s+)?(?P<key>[A-Z_]+)\s*[=:]\s*(?P<value>\S+)\s*$")


@dataclass(frozen=True)
class _FileCaptures:
    """What one file contributed."""

    path: str
    captures: tuple[RankCapture, ...]
    snapshot: Snapshot | None = None  # set for bundles


def load_paths(paths: list[str]) -> Snapshot:
    """One Snapshot from any mix of bundles, py-spy JSON and py-spy text files and directories."""
    if not paths:
        raise InputError("no input: give bundle files, py-spy dumps or directories")
    files = _expand(paths)
    loaded: list[_FileCaptures] = []
    errors: list[str] = []
    seen_frames: dict = {}  # shared by all files: the hosts of one job hold the same few stacks
    for path in files:
        try:
            loaded.append(load_file(path, seen_frames))
        except InputError as exc:
            errors.append(str(exc))
    if not loaded:
        raise InputError(errors[0] if len(errors) == 1 else f"none of {len(errors)} files could be read "
                         f"(first: {errors[0]})")
    _check_world_sizes(loaded)
    _check_duplicate_ranks(loaded)
    snapshot = _merge(loaded, errors)
    if not any(c.threads for c in snapshot.captures):  # exit 3, as when a live capture reads nothing
        if not snapshot.captures:
            raise NothingCaptured(f"the {len(loaded)} input(s) hold no capture")
        first = snapshot.captures[0]
        raise NothingCaptured(f"no stack in {len(loaded)} input(s): all {len(snapshot.captures)} ranks in them "
                              f"were unreadable (first: {first.error or first.state})")
    return snapshot


def load_file(path: str, seen_frames: dict | None = None) -> _FileCaptures:
    """Captures of one file, whichever of the three forms it is; InputError naming it otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")  # a BOM from a Windows editor is not content
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (expected a bundle or a py-spy dump)") from None
    if not text.strip():
        raise InputError(f"{path}: empty file")
    if text.lstrip()[0] in "[{":
        return _load_json(path, text, seen_frames)
    return _load_text(path, text)


# ---------------------------------------------------------------- forms


def _load_json(path: str, text: str, seen_frames: dict | None = None) -> _FileCaptures:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid or truncated JSON (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a bundle or a py-spy dump") from None
    if isinstance(data, dict) and data.get("schema") == BUNDLE_SCHEMA:
        _set_sources(data, path)
        snapshot = snapshot_from_data(data, path, seen_frames)
        return _FileCaptures(path, snapshot.captures, snapshot)
    schema = data.get("schema") if isinstance(data, dict) else None
    if isinstance(schema, str) and schema.startswith("mtpdiag.bundle/"):
        raise InputError(f"{path}: a {printable(schema)[:40]} bundle; this mtpdiag {__version__} reads "
                         f"{BUNDLE_SCHEMA} (upgrade mtpdiag)")
    if not isinstance(data, list):
        raise InputError(f"{path}: JSON that is neither an {BUNDLE_SCHEMA} bundle nor a py-spy dump")
    try:
        threads = threads_from_json(data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a py-spy --json dump ({exc})") from None
    if not threads:
        raise InputError(f"{path}: a py-spy dump with no threads")
    pids = {t.get("pid") for t in data if isinstance(t, dict) and isinstance(t.get("pid"), int)}
    pid = pids.pop() if len(pids) == 1 else None
    capture = RankCapture(pid=pid, host=_UNKNOWN_HOST, rank=rank_from_name(path), state=STATE_UNKNOWN,
                          threads=threads, source=path)
    return _FileCaptures(path, (capture,))


def _set_sources(data: dict, path: str) -> None:
    """Name the file in every capture before it is parsed (cheaper than a replace() per capture)."""
    captures = data.get("captures")
    if isinstance(captures, list):
        for capture in captures:
            if isinstance(capture, dict):
                capture["source"] = path


def _load_text(path: str, text: str) -> _FileCaptures:
    processes = parse_text_dump(text)
    workers = [p for p in processes if not p.launcher]
    processes = workers or processes  # ``py-spy dump -s`` of torchrun shows the agent first: not a rank
    if not processes:
        raise InputError(f"{path}: not a py-spy dump (no \"Thread N (idle|active)\" lines) "
                         "nor a bundle or py-spy JSON")
    env = _env_lines(text)
    single = len(processes) == 1
    rank = rank_from_name(path) if single else None
    if rank is None and single:
        rank = decimal(env.get("RANK"))
    captures = tuple(
        RankCapture(pid=p.pid, host=_UNKNOWN_HOST, rank=rank, state=STATE_UNKNOWN, threads=p.threads,
                    env=tuple(sorted(env.items())) if single else (),
                    layout_hints=tuple(sorted(p.hints.items())), source=path)
        for p in processes
    )
    return _FileCaptures(path, captures)


@dataclass(frozen=True)
class TextProcess:
    """One ``Process N:`` section of py-spy's text output."""

    pid: int | None
    threads: tuple[ThreadStack, ...]
    hints: dict
    launcher: bool = False  # the section is torchrun's agent


def parse_text_dump(text: str) -> list[TextProcess]:
    """Processes of ``py-spy dump`` text (with or without ``--locals``), threads in JSON order.

    py-spy prints threads in reverse order of its JSON output; they are put back in JSON order. The
    ``Process N: <command line>`` line is reduced to layout hints and dropped.
    """
    processes: list[TextProcess] = []
    pid: int | None = None
    hints: dict = {}
    launcher = False
    threads: list[ThreadStack] = []
    thread: dict | None = None
    frame: dict | None = None

    def close_frame() -> None:
        nonlocal frame
        if thread is not None and frame is not None:
            thread["frames"].append(Frame(function=frame["function"], file=frame["file"], line=frame["line"],
                                          args=kept_args(frame["file"], frame["locals"])))
        frame = None

    def close_thread() -> None:
        nonlocal thread
        close_frame()
        if thread is not None:
            threads.append(ThreadStack(thread_id=thread["thread_id"], name=thread["name"],
                                       native_id=thread["native_id"], active=thread["active"],
                                       frames=tuple(thread["frames"])))
        thread = None

    def close_process() -> None:
        nonlocal threads
        close_thread()
        if threads:
            processes.append(TextProcess(pid=pid, threads=tuple(reversed(threads)), hints=hints,
                                         launcher=launcher))
        threads = []

    for line in _ANSI.sub("", text).replace("\r\n", "\n").split("\n"):
        if m := _PROCESS.match(line):
            close_process()
            argv = m[2].split()
            pid, hints, launcher = int(m[1]), layout_hints(argv), is_launcher_argv(argv)
        elif m := _PARENT.match(line):
            hints = merge_hints(hints, layout_hints(m[2].split()))
        elif m := _THREAD.match(line):
            close_thread()
            ident = m[1]
            native = None if ident.startswith("0x") else int(ident)
            thread = {"thread_id": native if native is not None else int(ident, 16), "native_id": native,
                      "name": printable(m[3] or ""), "active": m[2] != "idle", "frames": []}
        elif thread is not None and (m := _FRAME.match(line)):
            close_frame()
            file, _, line_no = m["where"].rpartition(":")
            if not _LINE_NO.fullmatch(line_no):
                file, line_no = m["where"], "0"
            frame = {"function": printable(m["function"]), "file": display_path(printable(file)),
                     "line": int(line_no), "locals": []}
        elif frame is not None and (m := _LOCAL.match(line)):
            frame["locals"].append((m["name"], m["repr"]))
    close_process()
    return processes


# ---------------------------------------------------------------- names, env


def rank_from_name(path: str) -> int | None:
    """Rank in a file name: ``rank3``, ``rank-3``, ``rank_3`` or ``r3`` (the last one named wins)."""
    name = os.path.basename(path)
    for pattern in (_RANK_IN_NAME, _R_IN_NAME):
        found = pattern.findall(name)
        if found:
            return int(found[-1])
    return None


def _env_lines(text: str) -> dict[str, str]:
    """Whitelisted ``KEY=value`` lines pasted next to a dump (e.g. ``RANK=3``); nothing else."""
    out = {}
    for line in text.splitlines():
        m = _ENV_LINE.match(line.strip())
        if m and m["key"] in ENV_WHITELIST:
            out[m["key"]] = printable(m["value"])
    return out


# ---------------------------------------------------------------- merge


def _expand(paths: list[str]) -> list[str]:
    """The files to read: directories walked, each file once (by device and inode, which a
    ``realpath`` per file found at several times the cost)."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    for path in paths:
        try:
            info = os.stat(path)
        except OSError as exc:
            why = "no such file or directory" if exc.errno == errno.ENOENT else f"cannot read ({exc.strerror or exc})"
            raise InputError(f"{path}: {why}") from None
        if stat.S_ISDIR(info.st_mode):
            found = _walk(path)
            if not found:
                raise InputError(f"{path}: no capture files ({', '.join(DUMP_SUFFIXES)}) in this directory")
        else:
            found = [(path, info)]  # a named file is read whatever it is
        for file, info in found:
            key = (info.st_dev, info.st_ino)
            if key not in seen:
                seen.add(key)
                out.append(file)
    return out


def _walk(directory: str) -> list[tuple[str, os.stat_result]]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(DUMP_SUFFIXES):
                continue
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
            except OSError:  # a dangling link, or gone since the walk
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((path, info))
    return found


def _check_world_sizes(loaded: list[_FileCaptures]) -> None:
    first: tuple[int, str] | None = None
    for item in loaded:
        for size in world_sizes(item.captures):
            if first is None:
                first = (size, item.path)
            elif size != first[0]:
                raise InputError(f"world sizes differ: {first[1]} says {first[0]}, {item.path} says {size}")


def _check_duplicate_ranks(loaded: list[_FileCaptures]) -> None:
    owner: dict[int, str] = {}
    for item in loaded:
        ranks = {c.rank for c in item.captures}
        ranks.discard(None)
        for rank in sorted(ranks):
            if rank in owner:
                raise InputError(f"rank {rank} is in two files: {owner[rank]} and {item.path}")
            owner[rank] = item.path


def _merge(loaded: list[_FileCaptures], errors: list[str]) -> Snapshot:
    captures = tuple(c for item in loaded for c in item.captures)
    bundles = [item.snapshot for item in loaded if item.snapshot is not None]
    hosts = sorted({c.host for c in captures if c.host != _UNKNOWN_HOST})
    created = sorted(b.created for b in bundles if b.created)
    bundle_errors = [e for b in bundles for e in b.errors]
    return Snapshot(
        captures=tuple(sorted(captures, key=lambda c: (c.rank is None, c.rank or 0, c.source or "", c.pid or 0))),
        host=hosts[0] if len(hosts) == 1 else (",".join(hosts) if hosts else _UNKNOWN_HOST),
        created=created[0] if created else "",
        tool_version=__version__,
        errors=tuple(bundle_errors + errors),
    )
