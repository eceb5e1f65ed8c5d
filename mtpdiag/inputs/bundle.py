"""mtpdiag bundles (``mtpdiag.bundle/1``): one ``Snapshot`` as versioned JSON, written by ``collect`` and
``watch`` and read back by ``analyze``, alone or among other captures (``READER``).

Saving is atomic (``mtpdiag.atomic``), so a bundle that a job scheduler copies away mid-write is either whole
or absent. Reading is done at 16k-rank scale: parsed once, through ``Snapshot.from_dict`` with the
shared-stack cache, each capture named after its file before parsing rather than copied after.
"""

from __future__ import annotations

import json
import os
import re

from mtpdiag import __version__
from mtpdiag.atomic import write_atomic
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.files import json_start, parse_json
from mtpdiag.model import BUNDLE_SCHEMA, SchemaError, Snapshot, printable

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


def save_bundle(snapshot: Snapshot, path: str) -> str:
    """Write ``snapshot`` to ``path`` atomically; returns the file written."""
    target = bundle_path(snapshot, path)
    check_destination(target)
    text = json.dumps(snapshot.to_dict(), indent=1, sort_keys=False) + "\n"
    try:
        write_atomic(target, text, mode=0o644, prefix=".mtpdiag-")
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def load_bundle(path: str) -> Snapshot:
    """Read a bundle; InputError (naming the file) when it is unreadable, truncated or not a bundle."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a bundle file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid or truncated JSON (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a bundle") from None
    return snapshot_from_data(data, path)


def snapshot_from_data(data: object, path: str, seen_frames: dict | None = None) -> Snapshot:
    """A Snapshot from parsed bundle JSON; ``path`` names the file in errors (``seen_frames``: see
    ``Snapshot.from_dict``)."""
    try:
        return Snapshot.from_dict(data, seen_frames)  # type: ignore[arg-type]
    except (SchemaError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{path}: not a valid mtpdiag bundle ({exc})") from None


def sniff(text: str, path: str) -> bool:
    return json_start(text) == "{"


def read(text: str, path: str, context: ReadContext) -> FileCaptures:
    data = parse_json(text, path, "a bundle or a py-spy dump")
    if isinstance(data, dict) and data.get("schema") == BUNDLE_SCHEMA:
        captures = data.get("captures")
        if isinstance(captures, list):
            for capture in captures:
                if isinstance(capture, dict):
                    capture["source"] = path
        snapshot = snapshot_from_data(data, path, context.seen)
        return FileCaptures(path, snapshot.captures, snapshot, form=FORM)
    schema = data.get("schema") if isinstance(data, dict) else None
    if isinstance(schema, str) and schema.startswith("mtpdiag.bundle/"):
        raise InputError(f"{path}: a {printable(schema)[:40]} bundle; this mtpdiag {__version__} reads "
                         f"{BUNDLE_SCHEMA} (upgrade mtpdiag)")
    raise InputError(f"{path}: JSON that is neither an {BUNDLE_SCHEMA} bundle nor a py-spy dump")


READER = Reader(name=FORM, sniff=sniff, read=read)


READER = Reader(name=FORM, sniff=sniff, read=read)
