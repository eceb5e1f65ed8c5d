"""Fuzz every parser of outside input: any bytes in gives a result or a one-line mtpdiag error, nothing else.

Parsers: bundles, ``py-spy dump --json``, ``py-spy dump`` text, faulthandler and pystack output, bare frame
lines, failed captures (every reader of ``mtpdiag.inputs``), verl configs with hydra overrides and torch
Flight Recorder pickles. Two kinds of input: arbitrary bytes/values, and the recorded fixtures with random
mutations (a key dropped, a value of the wrong type, a list cut short), which reach deeper code than noise.
What loads must also diagnose and render, so a mutation cannot slip a bad value past the loader into the
analysis. Each test is bounded (``max_examples``) and has no deadline: the file runs in well under a minute.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpdiag.analysis.flight_recorder import correlate
from mtpdiag.errors import InputError, MtpdiagError
from mtpdiag.inputs import READERS, ReadContext, load_paths, parse_text_dump
from mtpdiag.inputs.bundle import load_bundle, snapshot_from_data
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.inputs.pyspy_json import threads_from_json
from mtpdiag.layout.sources import read_verl_config
from mtpdiag.model import Snapshot, ThreadStack
from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot
from mtpdiag.report import console, html, json_report, markdown
from support.captures import CAPTURES, scenarios

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "fixtures" / "configs"

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
FEW = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

# JSON values of every type, nested a few levels.
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)

# Text that looks like py-spy output in places: its line shapes with hostile fields in between.
_NUMBER = st.sampled_from(["0", "7", "8824", "0x7F3A", "²", "٣", "-1", "9" * 5000, "", " 12", "1e3"])
_WORD = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_LINE = st.one_of(
    st.builds("Process {}: {}".format, _NUMBER, _WORD),
    st.builds("Parent Process {}: {}".format, _NUMBER, _WORD),
    st.builds('Thread {} ({}): "{}"'.format, _NUMBER, st.sampled_from(["idle", "active", "active+gil", "x"]), _WORD),
    st.builds("    {} ({}:{})".format, _WORD, st.sampled_from(["torch/distributed/c10d.py", "a.py", "(", ""]), _NUMBER),
    st.builds("            {}: {}".format, st.sampled_from(["dst", "src", "tag", "x"]), _NUMBER | _WORD),
    st.builds("{}={}".format, st.sampled_from(["RANK", "WORLD_SIZE", "export RANK"]), _NUMBER),
    _WORD,
)
PYSPY_TEXT = st.lists(_LINE, max_size=25).map("\n".join)

# Lines of the other text forms, and what pastes put around them, with the same hostile fields.
_HEX = st.sampled_from(["0x00007f68893e4b80", "0x0", "0x" + "F" * 40, "0xZZ", "12"])
_PASTE_LINE = st.one_of(
    _LINE,
    st.builds("{} {} (most recent call first):".format, st.sampled_from(["Thread", "Current thread", "Stack"]), _HEX),
    st.builds(
        '  File "{}", line {} in {}'.format,
        st.sampled_from(["/x/torch/distributed/c10d.py", "a.py", '"', ""]),
        _NUMBER,
        _WORD,
    ),
    st.builds(
        "Traceback for thread {} ({}) [{}] (most recent call last):".format,
        _NUMBER,
        _WORD,
        st.sampled_from(["", "Has the GIL", "]", "Garbage collecting"]),
    ),
    st.builds(
        '    (Python) File "{}", line {}, in {}'.format,
        st.sampled_from(["/t/torch/distributed/x.py", "b.py"]),
        _NUMBER,
        _WORD,
    ),
    st.builds(
        '    (C) File "{}", line {}, in {} ({})'.format,
        st.sampled_from(["???", "x.c"]),
        _NUMBER,
        _WORD,
        st.sampled_from(["libc.so.6", "(", ""]),
    ),
    st.builds("The frame stack for thread {} is empty".format, _NUMBER),
    st.builds(
        "{}{}".format,
        st.sampled_from(
            [
                "[rank3]: ",
                "rank1: ",
                "[2026-01-29 13:12:37 TP1] ",
                "[default0]:",
                "(WorkerDict pid=12, ip=1.2.3.4) ",
                "[",
                "\x1b[1;32m",
            ]
        ),
        _WORD,
    ),
    st.builds(
        "{} {}".format,
        st.sampled_from(["$ py-spy dump --pid", "root@n:~# pystack remote", "$ sudo py-spy dump -p", "==>"]),
        _NUMBER,
    ),
    st.sampled_from(
        [
            "Error: Failed to get stack traces",
            "Caused by:",
            "    0: Failed to suspend process",
            "\U0001f480 Engine error: Operation not permitted \U0001f480",
            "Permission Denied: x",
            "Arguments:",
            "Locals:",
            "Timeout (0:00:05)!",
            "Fatal Python error: Aborted",
            "",
            "\r",
            "Python v3.11.7 (/usr/bin/python3)",
            "--------",
            'Thread 12 (idle): "MainThread"',
        ]
    ),
)
PASTE_TEXT = st.lists(_PASTE_LINE, max_size=30).map("\n".join)


def _fixture_files(suffix: str) -> list[Path]:
    return sorted(
        p for name in scenarios() for p in (Path(CAPTURES) / name).glob(f"*{suffix}") if p.name != "scenario.json"
    )


BUNDLES = {p: json.loads(p.read_text()) for p in _fixture_files("bundle.json")}
RAW_JSON = {p: json.loads(p.read_text()) for p in _fixture_files(".json") if p.name.startswith("rank")}
RAW_TEXT = {p: p.read_text() for p in _fixture_files(".txt")}
PASTES = Path(__file__).resolve().parent.parent / "fixtures" / "pastes"
RAW_PASTES = {p: p.read_text() for p in sorted(PASTES.glob("*/*.txt"))}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(folder: Path, name: str, data: bytes) -> str:
    path = folder / name
    path.write_bytes(data)
    return str(path)


def _result_or_clean_error(fn, *args):
    """Call ``fn``; an MtpdiagError with a one-line message is fine, any other exception fails the test."""
    try:
        return fn(*args)
    except MtpdiagError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))
        return None


def _diagnoses_and_renders(snapshot: Snapshot) -> None:
    """What the loader accepted must go through diagnosis and every renderer."""
    report = _result_or_clean_error(diagnose_snapshot, snapshot, LayoutOptions())
    if report is None:
        return
    json.loads(json_report.render(report))
    console.render(report, color=False, width=120)
    markdown.render(report)
    html.render(report)


# ---------------------------------------------------------------- mutations of recorded documents


def _paths(doc, prefix=()):
    """Every (container path, key) in a JSON document, the root's own children included."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield prefix, key
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield prefix, index
            yield from _paths(value, prefix + (index,))


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


# A fresh copy of each value: a later mutation of the same example may write into a drawn [] or {}, and
# a shared one would change what the strategy hands out (hypothesis then fails with FlakyStrategyDefinition).
WRONG_TYPES = st.sampled_from([None, True, -1, 2**70, 1.5, float("inf"), "", "x", "7", [], {}, [1], {"a": 1}]).map(
    copy.deepcopy
)


def _mutate(data, doc):
    """The document with 1-3 random mutations: drop a key/item, set a wrong-typed value, cut a list."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        places = list(_paths(doc))
        if not places:
            break
        path, key = data.draw(st.sampled_from(places))
        parent = _at(doc, path)
        action = data.draw(st.sampled_from(["drop", "wrong", "cut"]))
        if action == "drop":
            del parent[key]
        elif action == "wrong":
            parent[key] = data.draw(WRONG_TYPES | JSON)
        elif isinstance(parent[key], list):
            del parent[key][data.draw(st.integers(0, len(parent[key]))) :]
    return doc


# ---------------------------------------------------------------- bundles


@FUZZ
@given(data=JSON)
def test_bundle_from_any_json_value(data):
    snapshot = _result_or_clean_error(snapshot_from_data, data, "fuzz.json")
    assert snapshot is None or isinstance(snapshot, Snapshot)


@FUZZ
@given(raw=st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()))
def test_load_bundle_on_any_bytes(scratch, raw):
    snapshot = _result_or_clean_error(load_bundle, _write(scratch, "any.mtpdiag.json", raw))
    assert snapshot is None or isinstance(snapshot, Snapshot)


@FUZZ
@given(data=st.data())
def test_mutated_recorded_bundles_load_or_fail_cleanly_and_what_loads_renders(scratch, data):
    source = data.draw(st.sampled_from(sorted(BUNDLES)))
    doc = _mutate(data, BUNDLES[source])
    path = _write(scratch, "mutated.mtpdiag.json", json.dumps(doc).encode())
    snapshot = _result_or_clean_error(load_paths, [path])
    if snapshot is not None:
        _diagnoses_and_renders(snapshot)


def test_hostile_bundle_values_are_input_errors(scratch):
    """Values a mutation rarely builds: Infinity, deep nesting, a negative rank."""
    base = json.dumps(BUNDLES[Path(CAPTURES) / "mtp_cp_pp" / "bundle.json"])
    cases = {
        "infinite peer": base.replace('"dst": 2', '"dst": Infinity', 1),
        "deep nesting": '{"schema": "mtpdiag.bundle/1", "captures": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "negative rank": base.replace('"rank": 0', '"rank": -1', 1),
        "float hint": base.replace('"cp": 2', '"cp": 2.5', 1),
    }
    for what, text in cases.items():
        assert text != base, what
        path = _write(scratch, "hostile.mtpdiag.json", text.encode())
        for reader in (load_bundle, lambda p: load_paths([p])):
            with pytest.raises(MtpdiagError) as exc:
                reader(path)
            assert "hostile.mtpdiag.json" in str(exc.value) and "\n" not in str(exc.value), what


# ---------------------------------------------------------------- py-spy JSON


@FUZZ
@given(data=JSON)
def test_threads_from_any_json_value(data):
    """The parser's contract is ValueError on bad input (both callers turn it into their own error)."""
    try:
        threads = threads_from_json(data)
    except ValueError:
        return
    assert all(isinstance(t, ThreadStack) for t in threads)


@FUZZ
@given(data=st.data())
def test_mutated_recorded_pyspy_json_loads_or_fails_cleanly(scratch, data):
    source = data.draw(st.sampled_from(sorted(RAW_JSON)))
    doc = _mutate(data, RAW_JSON[source])
    path = _write(scratch, "rank1.json", json.dumps(doc).encode())
    snapshot = _result_or_clean_error(load_paths, [path])
    if snapshot is not None:
        assert [c.rank for c in snapshot.captures] == [1]
        _diagnoses_and_renders(snapshot)


# ---------------------------------------------------------------- py-spy text and any file


def _spliced(data, lines: list[str], noise, actions: list[str], most: int) -> list[str]:
    """Lines of a real dump deleted, duplicated, cut, stripped, prefixed or replaced with noise, as a bad paste
    would leave them (1 to ``most`` edits)."""
    for _ in range(data.draw(st.integers(1, most))):
        i = data.draw(st.integers(0, len(lines)))
        what = data.draw(st.sampled_from(actions))
        if what == "cut":
            lines = lines[:i]
        elif what == "noise":
            lines.insert(i, data.draw(noise))
        elif i == len(lines):
            continue
        elif what == "drop":
            del lines[i]
        elif what == "dup":
            lines.insert(i, lines[i])
        elif what == "strip":
            lines[i] = lines[i].strip()
        else:
            lines[i] = data.draw(st.sampled_from(["[rank1]: ", "\t", "  ", "$ "])) + lines[i]
    return lines


@FUZZ
@given(raw=st.binary(max_size=400), suffix=st.sampled_from([".json", ".txt", ".log", ".dump"]))
def test_load_paths_on_any_bytes(scratch, raw, suffix):
    snapshot = _result_or_clean_error(load_paths, [_write(scratch, "rank0" + suffix, raw)])
    assert snapshot is None or snapshot.captures


@FUZZ
@given(text=PYSPY_TEXT)
def test_pyspy_shaped_text_parses_or_fails_cleanly(scratch, text):
    processes = parse_text_dump(text)
    assert all(p.threads for p in processes)
    snapshot = _result_or_clean_error(load_paths, [_write(scratch, "rank2.txt", text.encode())])
    if snapshot is not None:
        _diagnoses_and_renders(snapshot)


@FUZZ
@given(data=st.data())
def test_recorded_text_dumps_cut_and_spliced_parse(scratch, data):
    """Lines of real dumps deleted, duplicated or replaced with noise, as a bad paste would."""
    source = data.draw(st.sampled_from(sorted(RAW_TEXT)))
    lines = _spliced(data, RAW_TEXT[source].splitlines(), _LINE, ["drop", "dup", "noise", "cut"], 4)
    text = "\n".join(lines)
    snapshot = _result_or_clean_error(load_paths, [_write(scratch, "rank3.txt", text.encode())])
    if snapshot is not None:
        _diagnoses_and_renders(snapshot)


@FUZZ
@given(
    text=PASTE_TEXT,
    name=st.sampled_from(["rank2.txt", "paste.log", "rank0.dump"]),
    rank_from=st.none() | st.sampled_from([r"rank(\d+)", r"TP(\d+)", r"(\d+)", r"(x)?"]),
)
def test_paste_shaped_text_of_every_form_loads_or_fails_cleanly(scratch, text, name, rank_from):
    snapshot = _result_or_clean_error(
        lambda p: load_paths([p], rank_from=rank_from), _write(scratch, name, text.encode())
    )
    if snapshot is not None:
        assert all(c.threads or (c.state == "unreadable" and c.error) for c in snapshot.captures)
        _diagnoses_and_renders(snapshot)


@FUZZ
@given(text=PASTE_TEXT | st.text(max_size=300))
def test_every_reader_reads_what_it_sniffs_or_says_why(text):
    """Each reader on its own: after its sniff accepts, a result or a one-line InputError, nothing else."""
    for reader in READERS:
        if not reader.sniff(text, "fuzz.txt"):
            continue
        try:
            found = reader.read(text, "fuzz.txt", ReadContext())
        except InputError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        for c in found.captures:
            assert c.threads or (c.state == "unreadable" and c.error and "\n" not in c.error), reader.name


@pytest.mark.skipif(not RAW_PASTES, reason="no recorded pastes")
@FUZZ
@given(data=st.data())
def test_recorded_pastes_cut_spliced_and_mangled_load_or_fail_cleanly(scratch, data):
    """Real faulthandler, pystack and py-spy pastes with lines dropped, doubled, cut, reindented or noised."""
    source = data.draw(st.sampled_from(sorted(RAW_PASTES)))
    lines = _spliced(
        data, RAW_PASTES[source].splitlines(), _PASTE_LINE, ["drop", "dup", "noise", "cut", "strip", "prefix"], 5
    )
    text = data.draw(st.sampled_from(["\n", "\r\n"])).join(lines)
    snapshot = _result_or_clean_error(load_paths, [_write(scratch, source.name, text.encode())])
    if snapshot is not None:
        assert all(c.threads or (c.state == "unreadable" and c.error) for c in snapshot.captures)
        _diagnoses_and_renders(snapshot)


def test_hostile_text_numbers_are_not_read_as_numbers(scratch):
    """A superscript or 5000-digit line number, pid or local is kept as text, never passed to int()."""
    text = (
        "Process 12: python x.py --tp " + "9" * 5000 + " --cp ٣ --pp 2\n"
        'Thread 12 (idle): "MainThread"\n'
        "    send (torch/distributed/distributed_c10d.py:²)\n"
        "            dst: " + "9" * 5000 + "\n"
        "    f (a.py:" + "9" * 5000 + ")\n"
        "    g (b.py:٣)\n"
    )
    (proc,) = parse_text_dump(text)
    frames = proc.threads[0].frames
    assert [f.line for f in frames] == [0, 0, 0] and frames[0].args is None
    assert proc.hints == {"pp": 2}
    assert load_paths([_write(scratch, "rank0.txt", text.encode())]).captures[0].rank == 0


def test_hostile_env_numbers_are_ignored(scratch):
    """RANK/WORLD_SIZE lines with unicode or 5000 digits give no rank or world size instead of a crash."""
    dump = RAW_TEXT[Path(CAPTURES) / "mtp_cp_pp" / "rank0.txt"]
    for value in ("²", "٣", "9" * 5000):
        path = _write(scratch, "dump.txt", f"RANK={value}\nWORLD_SIZE={value}\n{dump}".encode())
        (capture,) = load_paths([path]).captures
        assert capture.rank is None and capture.world_size is None, value


def test_a_fifo_in_a_directory_is_skipped_not_read(tmp_path):
    """A named pipe would block the read forever; a directory walk takes regular files only."""
    (tmp_path / "rank0.json").write_bytes(next(iter(RAW_JSON)).read_bytes())
    os.mkfifo(tmp_path / "rank1.txt")
    snapshot = load_paths([str(tmp_path)])
    assert [c.rank for c in snapshot.captures] == [0]


# ---------------------------------------------------------------- verl configs

_OVERRIDE = st.one_of(
    st.text(max_size=40),
    st.builds(
        "{}={}".format,
        st.sampled_from(
            [
                "actor_rollout_ref.actor.megatron.context_parallel_size",
                "+actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
                "++engine.tensor_model_parallel_size",
                "trainer.nnodes",
                "actor_rollout_ref",
                "a.b.c",
                "x.0.y",
                "+engine@engine",
                "actor_rollout_ref.actor.megatron",
            ]
        ),
        st.text(max_size=20)
        | st.sampled_from(
            [
                "2",
                "null",
                "&a [*a]",
                "[" * 2000,
                "${oc.env:HOME}",
                "${x}",
                "1e400",
                "true",
                "!!python/object:os.system x",
                "{a: 1}",
            ]
        ),
    ),
    st.builds("~{}".format, st.sampled_from(["actor_rollout_ref.actor.megatron", "engine", "a..b", ""])),
)


@FUZZ
@given(raw=st.binary(max_size=300), overrides=st.lists(_OVERRIDE, max_size=3))
def test_verl_config_from_any_bytes_and_overrides(scratch, raw, overrides):
    sizes = _result_or_clean_error(read_verl_config, _write(scratch, "any.yaml", raw), overrides)
    assert sizes is None or all(isinstance(v, int) and v >= 1 for v in sizes.values())


@FUZZ
@given(data=st.data(), overrides=st.lists(_OVERRIDE, max_size=3))
def test_recorded_verl_configs_with_mutations_and_overrides(scratch, data, overrides):
    source = data.draw(st.sampled_from(sorted(CONFIGS.glob("*.yaml"))))
    lines = source.read_text().splitlines()
    for _ in range(data.draw(st.integers(0, 3))):
        if lines:
            i = data.draw(st.integers(0, len(lines) - 1))
            lines[i] = data.draw(
                st.sampled_from(
                    ["", "  x: [", "\t", lines[i] + ": 1", lines[i][: len(lines[i]) // 2], "- 1", "&a b: *a", "{"]
                )
            )
    path = _write(scratch, "mutated.yaml", "\n".join(lines).encode())
    sizes = _result_or_clean_error(read_verl_config, path, overrides)
    assert sizes is None or all(isinstance(v, int) and v >= 1 for v in sizes.values())


def test_deep_yaml_and_self_referencing_override_are_input_errors(scratch):
    deep = _write(scratch, "deep.yaml", ("a: " + "[" * 5000 + "]" * 5000 + "\n").encode())
    with pytest.raises(MtpdiagError, match="nested too deeply"):
        read_verl_config(deep)
    good = str(CONFIGS / "ppo_megatron_cp2_pp2.yaml")
    for override in ("a=&x [*x]", "a=" + "[" * 3000):
        with pytest.raises(MtpdiagError, match="bad override"):
            read_verl_config(good, [override])


# ---------------------------------------------------------------- Flight Recorder pickles

_FR_VALUE = st.recursive(
    JSON_SCALARS | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)

RECORD_FR = """
import os, sys, tempfile
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from worker import write_dump  # examples/flight_recorder: torch's pickle plus gloo's group membership
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
sub = dist.new_group([0], group_desc="FUZZ_GROUP")
t = torch.ones(2)
dist.all_reduce(t); dist.broadcast(t, 0, group=sub); dist.all_gather([torch.zeros(2)], t); dist.barrier()
write_dump(sys.argv[1])
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def recorded_fr(tmp_path_factory) -> dict:
    """A real Flight Recorder dump of a one-rank gloo world (torch's own pickle), the seed for mutations."""
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("fr") / "rank_0"
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="100", MASTER_ADDR="127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-c", RECORD_FR, str(path), str(REPO / "examples" / "flight_recorder")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with open(path, "rb") as f:
        dump = pickle.load(f)
    (loaded,) = load_fr_dumps(str(path)[:-1]).ranks  # the real dump loads as it is
    assert len(loaded.entries) >= 4 and {g.desc for g in loaded.groups} >= {"FUZZ_GROUP"}
    return dump


def _fr_dir(scratch: Path, name: str, raw: bytes) -> str:
    folder = scratch / name
    folder.mkdir(exist_ok=True)
    (folder / "rank_0").write_bytes(raw)
    return str(folder / "rank_")


@pytest.fixture(scope="module")
def recorded_report():
    """The diagnosis of the recorded MTP-CP hang, to correlate fuzzed dumps with (as ``analyze --fr`` does)."""
    return diagnose_snapshot(load_paths([str(Path(CAPTURES) / "mtp_cp_pp" / "bundle.json")]), LayoutOptions())


def _load_and_correlate(prefix: str, report) -> None:
    dump = _result_or_clean_error(load_fr_dumps, prefix)
    if dump is not None:
        msgspec.json.encode(correlate(report, dump))


@FUZZ
@given(raw=st.binary(max_size=300))
def test_fr_dump_from_any_bytes(scratch, recorded_report, raw):
    _load_and_correlate(_fr_dir(scratch, "fr_bytes", raw), recorded_report)


@FUZZ
@given(value=_FR_VALUE)
def test_fr_dump_of_any_plain_pickle(scratch, recorded_report, value):
    _load_and_correlate(_fr_dir(scratch, "fr_value", pickle.dumps(value)), recorded_report)


@FEW
@given(data=st.data())
def test_mutated_real_fr_dump_loads_or_fails_cleanly(scratch, recorded_fr, recorded_report, data):
    doc = _mutate(data, recorded_fr)
    _load_and_correlate(_fr_dir(scratch, "fr_mutated", pickle.dumps(doc)), recorded_report)


def _entry(**fields) -> dict:
    return {
        "process_group": ("0", "default_pg"),
        "record_id": 0,
        "collective_seq_id": 1,
        "p2p_seq_id": 0,
        "profiling_name": "gloo:all_reduce",
        "state": "completed",
        **fields,
    }


@pytest.mark.parametrize(
    "dump",
    [
        pytest.param({"entries": [_entry(process_group=[])]}, id="empty-process-group"),
        pytest.param({"entries": [], "pg_config": {"0": {"ranks": [float("inf")]}}}, id="infinite-rank"),
        pytest.param({"entries": [_entry(input_sizes=[[float("inf")]])]}, id="infinite-size"),
        pytest.param({"entries": [_entry(process_group=("²", "d"))]}, id="unicode-digit-group-name"),
    ],
)
def test_fr_dumps_that_once_crashed_fail_cleanly(scratch, recorded_report, dump):
    _load_and_correlate(_fr_dir(scratch, "fr_known", pickle.dumps(dump)), recorded_report)
