"""The published contract: ``mtpdiag schema`` prints each document's JSON Schema from its types, the schemas in
``docs/schema/`` are those, every part of a report is typed, and the documents the commands write fit them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from conftest import unavailable
from mtpdiag.analysis import diagnose
from mtpdiag.commands.schema import TYPES, Document, schema_of, schema_text
from mtpdiag.inputs.bundle import bundle_text
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.model import FINDING_TYPES, Report, replace
from mtpdiag.report import json_report
from mtpdiag.vocabulary.states import FindingId
from support.captures import load_scenario, scenario_dir, scenarios
from support.jobs_e2e import run_cli_here

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "schema"
REGENERATE = "python -m mtpdiag schema --write docs/schema"


def _validator(document: Document):
    """A JSON Schema validator (jsonschema, which the pinned ray brings) for the published schema."""
    try:
        import jsonschema
    except ImportError:
        unavailable("jsonschema is not installed (ray[default] of requirements-ci.txt brings it)")
    return jsonschema.Draft202012Validator(json.loads(schema_text(document)))


@pytest.mark.parametrize("document", list(Document))
def test_the_committed_schema_is_the_codes(document):
    committed = COMMITTED / f"{document}.json"
    assert committed.is_file(), f"docs/schema/{document}.json is missing: regenerate it with `{REGENERATE}`"
    assert committed.read_bytes() == schema_text(document), (
        f"docs/schema/{document}.json differs from the schema of the code's types: if the change to the "
        f"contract is meant, regenerate it with `{REGENERATE}` and list the change in the changelog"
    )


def test_the_command_prints_the_schema_and_writes_every_one(tmp_path):
    done = run_cli_here("schema", "report")
    assert done.returncode == 0, done.stderr
    assert done.stdout.encode() == schema_text(Document.REPORT) and json.loads(done.stdout)["$defs"]["Report"]
    assert run_cli_here("schema").stdout == done.stdout  # report is the default
    wrote = run_cli_here("schema", "--write", str(tmp_path))
    assert wrote.returncode == 0, wrote.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{d}.json" for d in Document)
    for document in Document:
        assert (tmp_path / f"{document}.json").read_bytes() == schema_text(document)
    bad = run_cli_here("schema", "yaml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def _holes(node: object, where: str = "$") -> list[str]:
    """Places where a schema accepts anything: ``{}`` (``Any``), or an object with neither properties nor a
    type for its values (``dict[str, Any]``)."""
    if isinstance(node, list):
        return [h for i, item in enumerate(node) for h in _holes(item, f"{where}[{i}]")]
    if not isinstance(node, dict):
        return []
    out = []
    if node == {}:
        out.append(where)
    if node.get("type") == "object" and "properties" not in node and not node.get("additionalProperties"):
        out.append(where)
    for key, value in node.items():
        if key in ("properties", "$defs"):
            out += [h for name, sub in value.items() for h in _holes(sub, f"{where}.{name}")]
        elif key not in ("examples", "default", "enum", "mapping", "required"):
            out += _holes(value, f"{where}.{key}")
    return out


@pytest.mark.parametrize("document", list(Document))
def test_no_part_of_a_document_is_an_untyped_object(document):
    schema = schema_of(document)
    assert schema["$defs"], "the control: the schema names its types"
    assert _holes(schema) == []


def test_each_finding_id_has_its_own_type_and_details():
    schema = schema_of(Document.REPORT)
    union = schema["$defs"]["Report"]["properties"]["findings"]["items"]
    assert union["discriminator"]["propertyName"] == "id"
    assert set(union["discriminator"]["mapping"]) == set(FindingId) == set(FINDING_TYPES)
    for ref in union["discriminator"]["mapping"].values():
        finding = schema["$defs"][ref.rsplit("/", 1)[1]]
        assert "details" in finding["properties"]


def _report_documents() -> list[tuple[str, bytes]]:
    """The JSON of every recorded scenario, and of the Flight Recorder's scenarios with and without stacks."""
    out = []
    for name in scenarios():
        snapshot, layout, _ = load_scenario(name)
        out.append((name, json_report.encode(diagnose(snapshot, layout, "scenario.json"))))
        if snapshot.flight_recorder is not None:
            alone = replace(snapshot, captures=())
            out.append((f"{name} (recorder alone)", json_report.encode(diagnose(alone, layout, "scenario.json"))))
    fr_root = Path(scenario_dir("mtp_cp_pp")).parents[1] / "fr"
    for fr in sorted(fr_root.iterdir()):
        if (fr / "rank_0").is_file():
            _, layout, _ = load_scenario("mtp_cp_pp")
            from mtpdiag.model import Snapshot

            snapshot = Snapshot(captures=(), flight_recorder=load_fr_dumps(str(fr / "rank_")))
            out.append((f"fr/{fr.name}", json_report.encode(diagnose(snapshot, None))))
    return out


def test_every_recorded_report_fits_the_published_schema_and_decodes_as_its_type():
    """The schema is not only typed but true: the JSON Schema validator accepts what analyze writes, and the
    typed decoder reads it back into the same report (each finding's details as its id's type)."""
    validator = _validator(Document.REPORT)
    documents = _report_documents()
    with_fr = [name for name, data in documents if b'"divergences"' in data]
    assert len(documents) > 20 and with_fr, "the control: recorded reports, some with the recorder's section"
    for name, data in documents:
        errors = sorted(validator.iter_errors(json.loads(data)), key=str)
        assert not errors, f"{name}: {errors[0].message} at {list(errors[0].absolute_path)}"
        again = msgspec.json.decode(data, type=Report)
        assert json_report.encode(again) == data, name


def test_a_bundle_fits_the_bundle_schema():
    validator = _validator(Document.BUNDLE)
    snapshot, _, _ = load_scenario("nccl_mtp_cp_pp_futex")
    document = json.loads(bundle_text(snapshot))
    assert document["flight_recorder"]["ranks"], "the control: the bundle carries the recorder's dumps"
    assert not list(validator.iter_errors(document))
    document["captures"][0]["threads"][0]["frames"][0]["line"] = "three"
    assert list(validator.iter_errors(document)), "the control: a wrong type is refused"


def test_every_document_type_is_a_tagged_record():
    for document, (module, name) in TYPES.items():
        kind = getattr(__import__(module, fromlist=[name]), name)
        assert kind.__struct_config__.tag_field == "schema", document
        assert str(kind.__struct_config__.tag).startswith("mtpdiag."), document
