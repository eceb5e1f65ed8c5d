"""``mtpdiag schema``: the JSON Schema of each document mtpdiag writes, made from its types by msgspec.

The schemas are committed under ``docs/schema/`` (``mtpdiag schema --write docs/schema``), and a unit test
fails when the code's schema and the committed one differ: the contract cannot change without a diff.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import msgspec
import typer

from mtpdiag.errors import InputError
from mtpdiag.vocabulary.states import StrEnum

JSON_SCHEMA = "https://json-schema.org/draft/2020-12/schema"


class Document(StrEnum):
    """A document mtpdiag writes, by the name ``mtpdiag schema`` takes."""

    REPORT = "report"  # inspect/analyze/watch --json: mtpdiag.report/2
    BUNDLE = "bundle"  # collect's bundle files: mtpdiag.bundle/1
    CHECK = "check"  # check --json: mtpdiag.check/1
    LINT = "lint"  # lint --json: mtpdiag.lint/1
    VERIFY = "verify"  # verify --json: mtpdiag.verify/1


# Each document's type: (module, name), imported only when its schema is asked for.
TYPES = {
    Document.REPORT: ("mtpdiag.model", "Report"),
    Document.BUNDLE: ("mtpdiag.model", "Snapshot"),
    Document.CHECK: ("mtpdiag.fix.engine", "EngineCheck"),
    Document.LINT: ("mtpdiag.lint.rules", "LintReport"),
    Document.VERIFY: ("mtpdiag.fix.verify", "VerifyResult"),
}


def schema_of(document: Document) -> dict[str, object]:
    """The JSON Schema of ``document``: msgspec's, under the draft it follows and the tag it is for."""
    module, name = TYPES[document]
    kind = getattr(importlib.import_module(module), name)
    body = msgspec.json.schema(kind)
    return {"$schema": JSON_SCHEMA, "$comment": f"{kind.__struct_config__.tag}: `mtpdiag schema {document}`", **body}


def schema_text(document: Document) -> bytes:
    """``schema_of`` as the file ``docs/schema/<document>.json`` holds: indented, with a final newline."""
    return msgspec.json.format(msgspec.json.encode(schema_of(document)), indent=2) + b"\n"


def write_schemas(directory: Path) -> list[Path]:
    """Every document's schema as ``directory/<document>.json`` (atomically); the paths written."""
    from mtpdiag.atomic import shared_mode, write_atomic

    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory")
    written = []
    for document in Document:
        path = directory / f"{document}.json"
        try:
            write_atomic(path, schema_text(document), mode=shared_mode())
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        written.append(path)
    return written


def schema(
    document: Document = typer.Argument(Document.REPORT, help="The document whose schema to print."),
    write: Path | None = typer.Option(
        None, "--write", metavar="DIR", help="Write every document's schema to DIR/<document>.json instead."
    ),
) -> None:
    """Print the JSON Schema of a document mtpdiag writes (report, bundle, check, lint or verify)."""
    if write is not None:
        for path in write_schemas(write):
            typer.echo(f"wrote {path}")
        return
    typer.echo(schema_text(document).decode(), nl=False)


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
