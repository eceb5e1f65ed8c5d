"""mtpdiag bundles (``mtpdiag.bundle/1``): one ``Snapshot`` as versioned JSON, written by ``collect`` and
``watch`` and read back by ``analyze``, alone or among other captures (``READER``).

The JSON is the ``Snapshot`` type: msgspec's compiled decoder checks a bundle against it while building it,
and its encoder writes it. Saving is atomic (``mtpdiag.atomic``), so a bundle that a job scheduler copies
away mid-write is either whole or absent.
"""

from __future__ import annotations

import os
import re

import msgspec

from mtpdiag import __version__
from mtpdiag.atomic import write_atomic
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import json_start
from mtpdiag.model import BUNDLE_SCHEMA, Snapshot, printable
from mtpdiag.model.fields import may_hold_unprintable, one_line_error, scrub

FORM = "bundle"
BUNDLE_SUFFIX = ".mtpdiag.json"


def bundle_path(snapshot: Snapshot, path: str) -> str:
    """Where ``save_bundle`` writes: ``path``, or ``<path>/<host>.mtpdiag.json`` for a directory."""
    if os.path.isdir(path):
        host = re.sub(r"[^A-Za-z0-9._-]", "_", snapshot.host) or "unknown"
        return os.path.join(path, host + BUNDLE_SUFFIX)
    return path


def check_destination(path: str) -> None:
    """Fail before capturing anything when ``path`` cannot take a bundle."""
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"cannot write {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {path}: directory {directory} is not writable")


_DECODER = msgspec.json.Decoder(Snapshot)
_ENCODER = msgspec.json.Encoder()


class _Schema(msgspec.Struct):
    """Just the ``schema`` of a document that is not a bundle this version reads, to say what it is."""

    schema: object = None


def save_bundle(snapshot: Snapshot, path: str) -> str:
    """Write ``snapshot`` to ``path`` atomically; returns the file written."""
    target = bundle_path(snapshot, path)
    check_destination(target)
    try:
        write_atomic(target, bundle_text(snapshot), mode=0o644, prefix=".mtpdiag-")
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def bundle_text(snapshot: Snapshot) -> str:
    """The bundle's JSON (``Snapshot.stored``), one key per line as people read it."""
    stored = snapshot.stored()
    try:
        data = _ENCODER.encode(stored)
    except UnicodeEncodeError:  # a lone surrogate (a file name that is not UTF-8) in some text
        data = _ENCODER.encode(scrub(stored))
    return msgspec.json.format(data.decode(), indent=1) + "\n"


def load_bundle(path: str) -> Snapshot:
    """Read a bundle; InputError (naming the file) when it is unreadable, truncated or not a bundle."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a bundle file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return snapshot_from_json(data, path)


def snapshot_from_json(data: bytes, path: str) -> Snapshot:
    """The Snapshot of a bundle's bytes; InputError naming ``path`` for anything that is not an
    ``mtpdiag.bundle/1`` document."""
    try:
        snapshot = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(_not_a_bundle(_schema_of(data), path, exc)) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"{path}: invalid or truncated JSON ({one_line_error(exc)})") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a bundle") from None
    return scrub(snapshot) if may_hold_unprintable(data) else snapshot


def snapshot_from_data(data: object, path: str) -> Snapshot:
    """``snapshot_from_json`` of a document already parsed (``json.loads``'s value)."""
    try:
        snapshot = msgspec.convert(data, Snapshot)
    except msgspec.ValidationError as exc:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise InputError(_not_a_bundle(schema, path, exc)) from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a bundle") from None
    return scrub(snapshot)


def _schema_of(data: bytes) -> object:
    try:
        return msgspec.json.decode(data, type=_Schema).schema
    except (msgspec.MsgspecError, RecursionError):
        return None


def _not_a_bundle(schema: object, path: str, exc: msgspec.ValidationError) -> str:
    if schema == BUNDLE_SCHEMA:
        return f"{path}: not a valid mtpdiag bundle ({one_line_error(exc)})"
    if isinstance(schema, str) and schema.startswith("mtpdiag.bundle/"):
        return (
            f"{path}: a {printable(schema)[:40]} bundle; this mtpdiag {__version__} reads "
            f"{BUNDLE_SCHEMA} (upgrade mtpdiag)"
        )
    return f"{path}: JSON that is neither an {BUNDLE_SCHEMA} bundle nor a py-spy dump"


def sniff(text: str | bytes, _path: str) -> bool:
    return json_start(text) == "{"


def read(text: str | bytes, path: str, _context: ReadContext) -> FileCaptures:
    """The bundle's captures, each naming the file it was read from (what ``analyze`` says of a rank)."""
    snapshot = snapshot_from_json(text.encode() if isinstance(text, str) else text, path)
    named = msgspec.structs.force_setattr  # on captures just decoded, that nothing else holds yet: no copies
    for capture in snapshot.captures:
        named(capture, "source", path)
    return FileCaptures(path, snapshot.captures, snapshot, form=FORM)


READER = Reader(name=FORM, sniff=sniff, read=read)
