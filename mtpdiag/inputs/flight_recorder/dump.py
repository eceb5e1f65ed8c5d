"""Load a job's Flight Recorder dumps from disk: one file per rank, pickle or JSON, never running code.

torch writes ``<prefix><rank>`` (the prefix is ``TORCH_FR_DUMP_TEMP_FILE``, see ``locate``) as a pickle of
plain dicts, lists, tuples, strings and numbers; ``_dump_nccl_trace_json``/``_dump_fr_trace_json`` give
the same content as JSON, which people save as ``<prefix><rank>`` or ``<prefix><rank>.json``. The
unpickler here refuses every class, callable and persistent id, so a hostile file fails to load instead
of running. This module is the package's only I/O besides ``locate``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat
from collections.abc import Sequence
from typing import Any

from mtpdiag.errors import InputError
from mtpdiag.inputs.flight_recorder.parse import StackCache, groups_completed, rank_dump
from mtpdiag.inputs.flight_recorder.sites import SourceIndex, plain
from mtpdiag.model.flight_recorder import FRDump, FRRankDump, expected_ranks
from mtpdiag.model.group_marks import GroupCompleted

MAX_DUMP_BYTES = 256 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"^(.*?)(\d{1,9})(\.json)?$")

__all__ = ["load_fr_dumps", "read_dump_file", "read_groups_completed"]


class _PlainUnpickler(pickle.Unpickler):
    """Builds only containers and primitives: any class, function or persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:  # noqa: ARG002 - pickle.Unpickler's signature
        raise pickle.UnpicklingError("refuses persistent ids")


def load_fr_dumps(source: str | Sequence[str], qualify: bool = True) -> FRDump:
    """Read every rank's dump from a prefix (``/tmp/fr/rank_``), a directory holding one family of
    ``<prefix><rank>`` files, or a list of files named ``...<rank>``.

    ``missing`` lists ranks that some dump names as a group member but that have no dump (a partial
    set). ``qualify`` reads the stacks' source files, when present here, for qualified function names.
    """
    if isinstance(source, (list, tuple)):
        files = _listed_files(source)
        label = ", ".join(source) if len(source) <= 3 else f"{len(source)} files"
    else:
        files = _dump_files(str(source))
        label = str(source)
    index = SourceIndex() if qualify else None
    stacks: StackCache = {}
    ranks = tuple(
        sorted((read_dump_file(path, rank, index, stacks) for rank, path in files.items()), key=lambda d: d.rank)
    )
    dumped = {d.rank for d in ranks}
    missing = tuple(r for r in expected_ranks(ranks) if r not in dumped)
    notes = [n for d in ranks for n in d.notes]
    versions = sorted({d.version for d in ranks})
    if len(versions) > 1:
        notes.append(f"the dumps carry different Flight Recorder versions ({', '.join(versions)})")
    if missing:
        notes.append(f"no Flight Recorder dump for rank(s) {', '.join(map(str, missing))}")
    return FRDump(source=label, ranks=ranks, missing=missing, notes=tuple(notes))


def read_dump_file(
    path: str, rank: int, index: SourceIndex | None = None, stacks: StackCache | None = None
) -> FRRankDump:
    """One rank's file, pickle or JSON (told apart by the first byte), as an ``FRRankDump``."""
    data = _read(path)
    fmt = "json" if data.lstrip()[:1] == b"{" else "pickle"
    try:
        if fmt == "json":
            content = json.loads(data.decode("utf-8"))
        else:
            content = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed file: truncated, refused class, bad opcode, too deep, bad UTF-8
        raise InputError(f"{path}: not a readable Flight Recorder dump ({_one_line(exc)})") from None
    try:
        return rank_dump(content, rank, path, fmt, index.qualify if index is not None else plain, stacks)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        raise InputError(f"{path}: not a Flight Recorder dump ({_one_line(exc)})") from None


def read_groups_completed(path: str, rank: int, dump_time: float) -> tuple[GroupCompleted, ...]:
    """Each group's last completed op in one rank's dump, dated (``parse.groups_completed``), without reading
    the entries' stacks: ``run`` reads a dump about once a second to see a healthy job move."""
    data = _read(path)
    try:
        if data.lstrip()[:1] == b"{":
            content = json.loads(data.decode("utf-8"))
        else:
            content = _PlainUnpickler(io.BytesIO(data)).load()
        return groups_completed(content, rank, dump_time)
    except Exception as exc:  # malformed or half-written: the same one-line refusal as read_dump_file's
        raise InputError(f"{path}: not a readable Flight Recorder dump ({_one_line(exc)})") from None


def _read(path: str) -> bytes:
    """A regular file's bytes, bounded; a FIFO or device is refused, never opened for a blocking read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file")
        if info.st_size > MAX_DUMP_BYTES:
            raise InputError(f"{path}: {info.st_size} bytes is too large for a Flight Recorder dump")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _listed_files(paths: Sequence[str]) -> dict[int, str]:
    if not paths:
        raise InputError("no Flight Recorder dump files given")
    files: dict[int, str] = {}
    for path in paths:
        match = _RANK_SUFFIX.match(os.path.basename(path))
        if not match:
            raise InputError(f"{path}: a Flight Recorder dump's name ends in its rank (<prefix><rank>)")
        rank = int(match.group(2))
        if rank in files:
            raise InputError(f"two Flight Recorder dumps for rank {rank}: {files[rank]} and {path}")
        files[rank] = path
    return files


def _dump_files(prefix_or_dir: str) -> dict[int, str]:
    if os.path.isdir(prefix_or_dir):
        folder, prefix = prefix_or_dir, None
    else:
        folder, prefix = os.path.dirname(prefix_or_dir) or ".", os.path.basename(prefix_or_dir)
        if not os.path.isdir(folder):
            raise InputError(f"no Flight Recorder dumps at {prefix_or_dir}: {folder} is not a directory")
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise InputError(f"cannot list {folder}: {exc.strerror or exc}") from None
    families: dict[str, dict[int, str]] = {}
    for name in names:
        match = _RANK_SUFFIX.match(name)
        path = os.path.join(folder, name)
        if not match or not os.path.isfile(path) or (prefix is not None and match.group(1) != prefix):
            continue
        family = families.setdefault(match.group(1) + "<rank>" + (match.group(3) or ""), {})
        rank = int(match.group(2))
        if rank in family:
            raise InputError(f"two Flight Recorder dumps for rank {rank}: {family[rank]} and {path}")
        family[rank] = path
    if not families:
        what = f"{prefix}<rank>" if prefix is not None else "<prefix><rank>"
        raise InputError(f"no Flight Recorder dumps named {what} in {folder}")
    if len(families) > 1:
        found = ", ".join(sorted(families))
        raise InputError(f"{folder} holds several dump prefixes ({found}); pass {folder}/<prefix>")
    return next(iter(families.values()))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
