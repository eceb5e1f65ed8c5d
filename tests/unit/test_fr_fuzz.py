"""Fuzz the Flight Recorder parsers: any input gives a result or a one-line mtpdiag error, nothing else.

Parsers: dump files (pickle and JSON), bundled dumps (``FRDump.from_dict``), profiling names and watchdog logs.
Inputs are arbitrary bytes and values, and the recorded fixtures with random mutations (a key dropped, a
value of the wrong type, a list cut short), which reach deeper code than noise. What loads must also match
and serialize, so a mutation cannot slip a bad value past the reader into the analysis
(``tests/unit/test_fuzz_parsers.py`` does the same for the other parsers).
"""

from __future__ import annotations

import copy
import json
import pickle

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpdiag.analysis.flight_recorder import match_groups
from mtpdiag.errors import InputError
from mtpdiag.inputs.flight_recorder import parse_profiling_name, read_dump_file
from mtpdiag.inputs.watchdog_log import parse_watchdog_log
from mtpdiag.model import SchemaError
from mtpdiag.model.flight_recorder import FRDump
from mtpdiag.model.flight_recorder import FRDump as Records
from support.fr_fixtures import raw

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
FIXTURES = [raw(s, r) for s in ("gloo_mtp_cp_pp", "gloo_tp_broadcast") for r in range(4)]


def _load_or_error(tmp_path, data: bytes):
    path = tmp_path / "rank_0"
    path.write_bytes(data)
    try:
        dump = read_dump_file(str(path), 0)
    except InputError as exc:
        assert "\n" not in str(exc)
        return None
    analysis = match_groups(FRDump(source="fuzz", ranks=(dump,)))
    msgspec.json.encode(analysis)
    stored = FRDump(source="x", ranks=(dump,)).packed()
    assert Records.from_dict(json.loads(msgspec.json.encode(stored))).ranks[0].entries == dump.entries
    return dump


@FUZZ
@given(data=st.binary(max_size=300))
def test_any_bytes(tmp_path_factory, data):
    _load_or_error(tmp_path_factory.mktemp("b"), data)


@FUZZ
@given(value=JSON)
def test_any_value_pickled_or_as_json(tmp_path_factory, value):
    tmp = tmp_path_factory.mktemp("v")
    _load_or_error(tmp, pickle.dumps(value))
    _load_or_error(tmp, json.dumps({"version": "2.10", "entries": value}).encode())


def _mutate(data: dict, path_choice: int, action: int, junk) -> dict:
    out = copy.deepcopy(data)
    spots: list[tuple[object, object]] = []

    def walk(node):
        if isinstance(node, dict):
            for k in list(node):
                spots.append((node, k))
                walk(node[k])
        elif isinstance(node, list):
            for i in range(len(node)):
                spots.append((node, i))
                walk(node[i])

    walk(out)
    parent, key = spots[path_choice % len(spots)]
    if action == 0 and isinstance(parent, dict):
        del parent[key]
    elif action == 1 and isinstance(parent[key], list):
        del parent[key][len(parent[key]) // 2 :]
    else:
        parent[key] = junk
    return out


@FUZZ
@given(which=st.integers(0, len(FIXTURES) - 1), spot=st.integers(0, 10_000), action=st.integers(0, 2), junk=JSON)
def test_mutated_real_dumps(tmp_path_factory, which, spot, action, junk):
    mutated = _mutate(FIXTURES[which], spot, action, junk)
    _load_or_error(tmp_path_factory.mktemp("m"), pickle.dumps(mutated))


@FUZZ
@given(value=JSON)
def test_bundled_dumps(value):
    for doc in (value, {"schema": "mtpdiag.fr/1", "ranks": value}, {"schema": "mtpdiag.fr/1", "ranks": [value]}):
        try:
            FRDump.from_dict(doc)
        except SchemaError as exc:
            assert "\n" not in str(exc)


_LINE = st.one_of(
    st.builds(
        "[rank{}]:[E] [PG ID {} PG GUID {}({}) Rank {}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum={}, OpType={}, NumelIn={}, NumelOut={}, Timeout(ms)={}) ran for {} milliseconds".format,
        *[st.sampled_from(["0", "3", "-1", "x", "9" * 30, ""]) for _ in range(11)],
    ),
    st.builds(
        ("[PG {} Rank {}] Timeout at NCCL work: {}, last enqueued NCCL work: {}, last completed NCCL work: {}.").format,
        *[st.sampled_from(["0", "7", "-1", "", "1" * 25]) for _ in range(5)],
    ),
    st.builds(
        "[{}] joined but didn't finish collective #{}".format,
        st.text("0123456789, ", max_size=30),
        st.sampled_from(["1", "", "9" * 40]),
    ),
    st.text(max_size=80),
)


@FUZZ
@given(lines=st.lists(_LINE, max_size=20))
def test_watchdog_logs(lines):
    log = parse_watchdog_log("\n".join(lines))
    msgspec.json.encode([t.logged() for t in log.timeouts])
    msgspec.json.encode(log)


@FUZZ
@given(name=st.text(max_size=40))
def test_profiling_names(name):
    parsed = parse_profiling_name(name)
    assert isinstance(parsed.op, str)


def test_a_huge_counter_does_not_make_the_matcher_count_to_it(tmp_path):
    """``pg_status`` counters are the dump's word: 2**62 must not turn into a loop of 2**62 numbers."""
    data = raw("gloo_mtp_cp_pp", 3)
    for status in data["pg_status"].values():
        status["last_enqueued_collective"] = 2**62
    dump = _load_or_error(tmp_path, pickle.dumps(data))
    assert dump is not None


def test_a_bundled_dump_whose_group_holds_a_negative_rank_is_diagnosed_not_a_crash(tmp_path):
    """Found by test_fuzz_parsers: a recorded NCCL bundle whose Flight Recorder group lists rank -1 made the
    layout check index the layout's groups with it (KeyError, exit 70)."""
    from support.jobs_e2e import ROOT, run_cli

    path = f"{ROOT}/tests/fixtures/captures/lookalike_aux_loss_sizes_nccl/bundle.json"
    data = json.loads(open(path).read())
    (group,) = [
        g for g in data["flight_recorder"]["ranks"][0]["groups"] if g["desc"] == "DATA_PARALLEL_GROUP_WITH_CP"
    ]  # a Megatron group the layout is checked against
    group["ranks"][0] = -1
    damaged = tmp_path / "bundle.json"
    damaged.write_text(json.dumps(data))
    done = run_cli("analyze", str(damaged), "--json")
    assert done.returncode in (1, 4) and "internal error" not in done.stderr, done.stderr
    section = json.loads(done.stdout)["flight_recorder"]
    assert any("rank -1, outside the layout's world" in d for d in section["disagreements"]), section["disagreements"]
