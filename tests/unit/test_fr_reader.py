"""Reading Flight Recorder dumps: torch's pickle and JSON forms, versions, groups, names, batches, bad input.

Fixtures are real dumps of hung gloo jobs (``tests/fixtures/fr``). NCCL-only fields and names are tested on
variants derived from them; each such test says which field of torch's writer it sets and why.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading

import msgspec
import pytest

from mtpdiag.analysis.flight_recorder.calls import group_calls
from mtpdiag.errors import InputError
from mtpdiag.inputs.flight_recorder import load_fr_dumps, op_name, parse_profiling_name, read_dump_file
from mtpdiag.inputs.flight_recorder.sites import SourceIndex
from mtpdiag.model import Site, replace
from mtpdiag.model.flight_recorder import FRDump
from support.fr_fixtures import FR_FIXTURES, entries_of, group_name, raw, write_set

PP = FR_FIXTURES / "gloo_mtp_cp_pp"
DP_CP = "DATA_PARALLEL_GROUP_WITH_CP"


@pytest.fixture(scope="module")
def pp() -> FRDump:
    return load_fr_dumps(str(PP / "rank_"))


# ---------------------------------------------------------------- torch's pickle, as a real job wrote it


def test_a_real_dump_reads_every_field_torch_writes(pp):
    assert [d.rank for d in pp.ranks] == [0, 1, 2, 3] and pp.missing == () and pp.notes == ()
    rank2 = pp.rank(2)
    assert (rank2.version, rank2.format) == ("2.10", "pickle")
    [pending] = [e for e in rank2.entries if e.group_desc == DP_CP]
    assert (pending.op, pending.profiling_name, pending.backend) == ("all_reduce", "gloo:all_reduce", "gloo")
    assert (pending.collective_seq_id, pending.p2p_seq_id, pending.is_p2p) == (1, 0, False)
    assert (pending.input_sizes, pending.output_sizes) == (((1,),), ((1,),))
    assert (pending.input_dtypes, pending.output_dtypes) == (("Float",), ("Float",))
    assert pending.timeout_ms == 1_800_000 and pending.time_created_ns > 1_600_000_000 * 10**9
    assert (pending.state, pending.retired, pending.done, pending.timed_out) == ("scheduled", False, False, False)
    assert pending.duration_ms is None  # torch writes duration_ms only with timing enabled
    # gloo has no events: a finished op stays "scheduled" and is retired, which is what done means for gloo
    finished = [e for e in rank2.entries if e.group_desc == "CONTEXT_PARALLEL_GROUP"]
    assert [(e.state, e.retired, e.done, e.timed_out) for e in finished] == [("scheduled", True, True, False)]


def test_call_sites_are_named_as_the_stack_analysis_names_them(pp):
    [pending] = [e for e in pp.rank(2).entries if e.group_desc == DP_CP]
    # first frame outside torch (c10d_logger's wrapper included), site-packages-relative, qualified from source
    assert pending.site == Site(
        "megatron/core/transformer/multi_token_prediction.py", 359, "MTPLossLoggingHelper.reduce_loss_in_tracker"
    )
    assert pending.frames[0].file == "torch/distributed/distributed_c10d.py"
    assert [f.function for f in pending.frames[:3]] == [
        "all_reduce",
        "_exception_logger.<locals>.wrapper",
        "MTPLossLoggingHelper.reduce_loss_in_tracker",
    ]
    plain = load_fr_dumps(str(PP / "rank_"), qualify=False)
    [raw_pending] = [e for e in plain.rank(2).entries if e.group_desc == DP_CP]
    assert raw_pending.site.function == "reduce_loss_in_tracker"


def test_pg_config_and_pg_status_give_groups_and_progress(pp):
    rank3 = pp.rank(3)
    cp = next(g for g in rank3.groups if g.desc == "CONTEXT_PARALLEL_GROUP")
    assert (cp.ranks, cp.global_rank(0), cp.global_rank(1), cp.global_rank(2)) == ((2, 3), 2, 3, None)
    [status] = rank3.status
    assert (status.group, status.last_enqueued, status.last_completed, status.last_started) == (cp.name, 2, 1, -1)
    rank2 = pp.rank(2)
    by_group = {s.group: (s.last_enqueued, s.last_completed) for s in rank2.status}
    assert by_group[group_name(raw("gloo_mtp_cp_pp", 2), DP_CP)] == (1, -1)


def test_torchs_json_form_reads_the_same_as_its_pickle(pp):
    js = load_fr_dumps(str(PP / "json" / "rank_"))
    assert {d.format for d in js.ranks} == {"json"}
    for a, b in zip(pp.ranks, js.ranks, strict=True):
        keys = lambda d: [
            (e.record_id, e.group, e.op, e.seq, e.input_sizes, e.input_dtypes, e.state, e.retired, e.timeout_ms)
            for e in d.entries
        ]
        assert keys(a) == keys(b)
        # JSON writes pg_status counters as strings and no stacks (FlightRecorderDetail.hpp dump_json)
        assert [(s.pg_id, s.last_enqueued, s.last_completed) for s in a.status] == [
            (s.pg_id, s.last_enqueued, s.last_completed) for s in b.status
        ]
        assert all(e.frames == () and e.site is None for e in b.entries)
    raw_json = json.loads((PP / "json" / "rank_3").read_text())
    assert isinstance(next(iter(raw_json["pg_status"].values()))["last_enqueued_collective"], str)


def test_a_prefix_a_directory_and_a_list_of_files_load_alike(pp, tmp_path):
    files = [str(PP / f"rank_{r}") for r in range(4)]
    for other in (load_fr_dumps(str(PP)), load_fr_dumps(files)):
        assert [(d.rank, d.entries) for d in other.ranks] == [(d.rank, d.entries) for d in pp.ranks]
    for r in range(4):
        shutil.copy(PP / "json" / f"rank_{r}", tmp_path / f"trace_{r}.json")
    assert [d.rank for d in load_fr_dumps(str(tmp_path)).ranks] == [0, 1, 2, 3]


def test_a_partial_set_names_the_missing_ranks(tmp_path):
    for r in (0, 1, 2):
        shutil.copy(PP / f"rank_{r}", tmp_path / f"rank_{r}")
    fr = load_fr_dumps(str(tmp_path))
    assert fr.missing == (3,)
    assert any("no Flight Recorder dump for rank(s) 3" in n for n in fr.notes)


# ---------------------------------------------------------------- versions (FlightRecorder.hpp version_val)


@pytest.mark.parametrize(
    "version, note",
    [("2.10", None), ("2.2", None), ("2.11", "newer than 2.10"), ("1.5", "predates"), ("banana", "unrecognised")],
)
def test_known_and_unknown_versions(tmp_path, version, note):
    data = raw("gloo_mtp_cp_pp", 2)
    data["version"] = version
    fr = load_fr_dumps(write_set(tmp_path, {2: data}))
    assert fr.version == version and len(fr.rank(2).entries) == 2
    about_version = [n for n in fr.notes if "format" in n or "version" in n]
    assert (about_version == []) if note is None else any(note in n for n in about_version)


def test_a_newer_major_version_is_one_line_asking_to_upgrade(tmp_path):
    data = raw("gloo_mtp_cp_pp", 2)
    data["version"] = "3.0"
    with pytest.raises(InputError, match=r"rank_2: Flight Recorder format 3\.0 is newer .*; upgrade mtpdiag$"):
        load_fr_dumps(write_set(tmp_path, {2: data}))


# ---------------------------------------------------------------- NCCL's names and fields (derived)


@pytest.mark.parametrize(
    "name, op",
    [
        ("nccl:all_reduce", "all_reduce"),
        ("nccl:_all_gather_base", "all_gather_into_tensor"),
        ("nccl:_reduce_scatter_base", "reduce_scatter_tensor"),
        ("nccl:all_reduce_barrier", "barrier"),
        ("nccl:allreduce_coalesced", "all_reduce_coalesced"),
        ("nccl:all_gather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"),
        ("nccl:reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced"),
        ("nccl:_broadcast_oop", "broadcast"),
        ("nccl:all_to_all", "all_to_all"),
        ("nccl:send 1->0", "send"),
        ("nccl:recv 0<-1", "recv"),
        ("gloo:all_gather", "all_gather"),
        ("gloo:_allgather_base", "all_gather_into_tensor"),
        ("gloo:barrier", "barrier"),
    ],
)
def test_profiling_names(name, op):
    assert op_name(name) == op


def test_send_and_recv_name_group_ranks():
    send, recv = parse_profiling_name("nccl:send 1->0"), parse_profiling_name("nccl:recv 0<-1")
    assert (send.src, send.dst, send.is_p2p) == (1, 0, True)
    assert (recv.src, recv.dst) == (1, 0)
    assert parse_profiling_name("nccl:send 1->x").src is None


def _as_nccl_p2p(tmp_path, sender_state: str):
    """Rank 3's CP all_gather #2 rewritten as ProcessGroupNCCL records a batch_isend_irecv of one send to
    group rank 0: the part is ``nccl:send <me>-><peer>`` in group-local ranks with ``p2p_seq_id`` set,
    ``collective_seq_id`` 0, ``is_p2p`` true and no events (state "scheduled", never retired), then the
    closing ``nccl:coalesced`` entry with the same ``p2p_seq_id`` holds the state (test_c10d_nccl.py
    test_batched_send_recv shows that layout)."""
    data = raw("gloo_mtp_cp_pp", 3)
    entry = entries_of(data, "CONTEXT_PARALLEL_GROUP")[-1]
    entry.update(
        profiling_name="nccl:send 1->0",
        collective_seq_id=0,
        p2p_seq_id=1,
        is_p2p=True,
        state="scheduled",
        retired=False,
    )
    closer = dict(
        entry,
        record_id=entry["record_id"] + 1,
        profiling_name="nccl:coalesced",
        input_sizes=[],
        output_sizes=[],
        input_dtypes=[],
        output_dtypes=[],
        state=sender_state,
        retired=sender_state == "completed",
        time_discovered_completed_ns=None,
    )
    data["entries"].append(closer)
    return load_fr_dumps(write_set(tmp_path, {3: data})).rank(3), entry["process_group"][0]


def test_a_batch_takes_its_closing_entrys_state_and_p2p_ends_map_to_global_ranks(tmp_path):
    dump, group = _as_nccl_p2p(tmp_path, "completed")
    part = next(e for e in dump.entries if e.profiling_name == "nccl:send 1->0")
    assert (part.src, part.dst) == (3, 2)  # group [2, 3]: group rank 1 is global 3, group rank 0 is global 2
    assert (part.state, part.done, part.in_batch) == ("completed", True, True)
    [call] = [c for c in group_calls(dump, group) if c.p2p]
    assert (call.op, call.seq, call.state, len(call.entries)) == ("batch_isend_irecv", 1, "completed", 2)
    assert call.site.function == "ring_attention"  # the parts' site, not where the batch closed


def test_retired_but_not_completed_is_a_timeout_on_nccl(tmp_path):
    """NCCL's watchdog retires a timed-out work (``retired`` true) whose end event never fired (state not
    completed); a retired and completed work is simply done."""
    data = raw("gloo_mtp_cp_pp", 2)
    dp, cp = entries_of(data, DP_CP)[0], entries_of(data, "CONTEXT_PARALLEL_GROUP")[0]
    dp.update(profiling_name="nccl:all_reduce", state="started", retired=True)
    cp.update(profiling_name="nccl:_all_gather_base", state="completed", retired=True, duration_ms=0.5)
    dump = load_fr_dumps(write_set(tmp_path, {2: data})).rank(2)
    timed, ok = (next(e for e in dump.entries if e.group_desc == d) for d in (DP_CP, "CONTEXT_PARALLEL_GROUP"))
    assert (timed.timed_out, timed.done, timed.state) == (True, False, "started")
    assert (ok.timed_out, ok.done, ok.duration_ms, ok.op) == (False, True, 0.5, "all_gather_into_tensor")


# ---------------------------------------------------------------- bundles carry dumps


def test_the_stored_form_round_trips_and_keeps_nothing_else(pp):
    document = json.loads(msgspec.json.encode(pp.packed()))
    assert FRDump.from_dict(document).ranks[2].entries == pp.rank(2).entries
    assert FRDump.from_dict(document).ranks == tuple(replace(r, format="bundle") for r in pp.ranks)
    text = json.dumps(document)
    assert "thread_name" not in text and "nccl_comm_state" not in text and "time_discovered" not in text
    rank = document["ranks"][1]
    assert len(rank["stacks"]) < len(rank["entries"])  # a rank's repeated stacks are stored once


# ---------------------------------------------------------------- bad input


def test_hostile_and_broken_files_are_one_line_input_errors(tmp_path):
    deep = b"(" * 100_000 + b"."  # MARK opcodes deep enough to exhaust the unpickler
    cases = {
        "rank_0": pickle.dumps({"version": "2.10", "entries": [{"process_group": 5}]}),
        "rank_1": b"{not json",
        "rank_2": deep,
        "rank_3": json.dumps([1, 2]).encode(),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError) as err:
            read_dump_file(str(tmp_path / name), 0)
        assert "\n" not in str(err.value) and str(tmp_path / name) in str(err.value)


def test_a_fifo_is_never_opened_for_a_blocking_read(tmp_path):
    fifo = tmp_path / "rank_0"
    os.mkfifo(fifo)
    result = {}
    reader = threading.Thread(target=lambda: result.setdefault("error", _error_of(str(fifo))), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and "not a regular file" in result["error"]
    with pytest.raises(InputError, match="no Flight Recorder dumps"):
        load_fr_dumps(str(tmp_path))  # a listing skips it


def _error_of(path: str) -> str:
    try:
        read_dump_file(path, 0)
    except InputError as exc:
        return str(exc)
    return ""


def test_qualified_names_come_from_source_and_only_when_the_name_agrees(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text(
        "class Outer:\n    class Inner:\n        def step(self):\n            return 1\n\n"
        "def train():\n    def helper():\n        return [x for x in ()]\n    return helper\n"
    )
    index = SourceIndex(roots=())
    path = str(src)
    assert index.qualify(path, 4, "step") == "Outer.Inner.step"
    assert index.qualify(path, 8, "helper") == "train.<locals>.helper"
    assert index.qualify(path, 8, "<listcomp>") == "train.<locals>.helper.<locals>.<listcomp>"
    assert index.qualify(path, 4, "renamed") == "renamed"  # another version of the file: keep torch's name
    assert index.qualify(str(tmp_path / "missing.py"), 1, "f") == "f"
    os.mkfifo(tmp_path / "pipe.py")
    assert index.qualify(str(tmp_path / "pipe.py"), 1, "f") == "f"  # not read, and not blocked on
