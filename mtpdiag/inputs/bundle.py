"""mtpdiag bundles (``mtpdiag.bundle/1``, written by ``collect`` and ``watch``).

Read at 16k-rank scale: parsed once, through ``Snapshot.from_dict`` with the shared-stack cache, each
capture named after its file before parsing rather than copied after.
"""

from __future__ import annotations

from mtpdiag import __version__
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures, ReadContext, Reader
from mtpdiag.inputs.bundles import snapshot_from_data
from mtpdiag.inputs.files import json_start, parse_json
from mtpdiag.model import BUNDLE_SCHEMA, printable

FORM = "bundle"


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
