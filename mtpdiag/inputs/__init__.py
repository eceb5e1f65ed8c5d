"""Read captures from files: bundles, py-spy (JSON and text), faulthandler, pystack, bare frame lines,
and the error output of a capture that failed; and the Flight Recorder's dumps (``flight_recorder``) and the
NCCL watchdog's log lines (``watchdog_log``) of the same hang. Bundles are also saved here (``bundle``).

Rules (the same for every command that reads files):

* Each file is read by the first reader in ``registry.readers()`` that recognises it (one module per
  format, each a ``Reader``: ``sniff(text, path)`` and ``read(text, path, context)``).
* A file that no reader recognises, or that is not text, is an input error when no file could be read
  at all; otherwise it is recorded, one line, in ``Snapshot.errors`` and the rest is diagnosed.
* A file (or one process in it) that is recognised but yields no frame is a rank that could not be
  read: ``state="unreadable"`` and ``error`` saying why. So is a failed capture (py-spy's or pystack's
  error text) and an empty file named after a rank. Frames never vanish into a healthy-looking rank.
  Inputs whose every rank is unreadable are diagnosed too (``incomplete``, with how to get the stacks);
  only inputs that hold no capture at all are ``NothingCaptured``.
* One rank in several files is one capture when they are of one process and moment (a py-spy JSON and a
  text dump of it, its Python and ``--native`` dumps), the richest kept; captures of it that differ are all
  kept, as a conflict naming the files (``merge``). Two different world sizes are an input error naming both.
* Ranks: ``identity.rank_of`` (file name, ``RANK=`` lines, log prefixes, process titles, ``--rank N``,
  or ``rank_from``). World size: ``WORLD_SIZE`` (or ``SLURM_NTASKS``) in the dumps, never the file count.
* A raw dump's state is ``"unknown"``: none of these tools records the process state.
"""

from __future__ import annotations

import msgspec

from mtpdiag.errors import InputError, NothingCaptured
from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import DUMP_SUFFIXES, expand, read_bytes
from mtpdiag.model import STATE_UNKNOWN, STATE_UNREADABLE, Snapshot

__all__ = [
    "DUMP_SUFFIXES",
    "READERS",
    "STATE_UNKNOWN",
    "STATE_UNREADABLE",
    "Dumped",
    "FileCaptures",
    "Inputs",
    "ReadContext",
    "Reader",
    "TextProcess",
    "load_file",
    "load_paths",
    "parse_text_dump",
    "rank_from_name",
    "read_inputs",
]


_LAZY = {
    "READERS": ("mtpdiag.inputs.registry", "READERS"),  # the text readers load with the first text file
    "rank_from_name": ("mtpdiag.inputs.identity", "rank_from_name"),  # as py-spy's JSON reader does
    "TextProcess": ("mtpdiag.inputs.pyspy_text", "TextProcess"),
    "parse_text_dump": ("mtpdiag.inputs.pyspy_text", "parse_text_dump"),
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Inputs(msgspec.Struct, frozen=True):
    """What ``read_inputs`` found: the snapshot, notes on what was merged or chosen (one line each), and the
    files that are NCCL watchdog logs rather than captures (for the caller to read as ``--log`` would)."""

    snapshot: Snapshot
    notes: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()


def load_paths(paths: list[str], *, rank_from: str | None = None) -> Snapshot:
    """One Snapshot from any mix of input files and directories (see the module's rules)."""
    return read_inputs(paths, rank_from=rank_from).snapshot


def read_inputs(paths: list[str], *, rank_from: str | None = None) -> Inputs:
    """``load_paths`` plus its notes. ``rank_from``: a regex whose first group is the rank (``--rank-from``)."""
    if not paths:
        raise InputError("no input: give bundle files, py-spy dumps or directories")
    # The registry (and the bundle reader it holds) loads with the first file: a live capture reads py-spy's
    # output with pyspy_json alone.
    from mtpdiag.inputs.merge import check_world_sizes, merge
    from mtpdiag.inputs.registry import read_file

    context = ReadContext()
    if rank_from is not None:  # the rank rules load with the first file that is not a bundle, or with this
        from mtpdiag.inputs.identity import compile_rank_from

        context = ReadContext(rank_from=compile_rank_from(rank_from))
    files = expand(paths)
    loaded: list[FileCaptures] = []
    errors: list[str] = []
    logs: list[str] = []
    for path in files:
        try:
            loaded.append(read_file(read_bytes(path), path, context))
        except InputError as exc:
            if _is_watchdog_log(path):
                logs.append(path)
            else:
                errors.append(str(exc))
    if not loaded and logs and not errors:
        return Inputs(
            Snapshot(captures=()), tuple(f"{p}: NCCL watchdog lines, read as --log {p}" for p in logs), tuple(logs)
        )
    if not loaded:
        raise InputError(
            errors[0] if len(errors) == 1 else f"none of {len(errors)} files could be read (first: {errors[0]})"
        )
    snapshot = merge(loaded, errors)
    merged = len(snapshot.captures) < sum(len(item.captures) for item in loaded)  # a rank's captures made one
    check_world_sizes(loaded, None if merged else snapshot.world_sizes)
    if not snapshot.captures:  # exit 3, as when a live capture reads nothing
        raise NothingCaptured(f"the {len(loaded)} input(s) hold no capture")
    # Ranks whose every capture failed (py-spy missing or refused, a dump that printed nothing) are still the
    # ranks of a stuck job: the diagnosis says so, with what to collect next (incomplete, never a refusal).
    notes = (
        *(note for item in loaded for note in item.notes),
        *(f"{p}: NCCL watchdog lines, read as --log {p}" for p in logs),
    )
    return Inputs(snapshot, notes, tuple(logs))


def _is_watchdog_log(path: str) -> bool:
    """Whether a file that is no capture holds NCCL watchdog lines (then it is read as ``--log`` would read it)."""
    from mtpdiag.inputs.watchdog_log import load_watchdog_log

    try:
        log = load_watchdog_log(path)
    except InputError:
        return False
    return bool(log.timeouts or log.statuses or log.desync)


def load_file(path: str, context: ReadContext | None = None) -> FileCaptures:
    """Captures of one file, whichever form it is; InputError naming it otherwise."""
    from mtpdiag.inputs.registry import read_file

    return read_file(read_bytes(path), path, context or ReadContext())
