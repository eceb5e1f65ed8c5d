"""The verl MTP/CP hang as NCCL records it, on dumps recorded from the NCCL-behaviour reproducer.

``examples/nccl_behaviour`` (another branch's reproducer) runs the verl bug on a backend that behaves on
the CPU side as ProcessGroupNCCL does (asynchronous collectives, host syncs, NCCL's Flight Recorder and
watchdog), and ``tests/fixtures/record.py`` saved each run's dumps and watchdog log under
``tests/fixtures/captures/nccl_*/fr/``. With NCCL the cp>0 rank does not wait at the gated all_reduce: it
runs on to the distributed optimizer, whose collectives then stand at the same sequence numbers.
"""

from __future__ import annotations

import pytest

from mtpdiag.analysis.flight_recorder import match_groups, mismatches
from mtpdiag.analysis.flight_recorder.calls import group_calls
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.inputs.watchdog_log import parse_watchdog_log
from support.fr_fixtures import nccl_scenarios

SCENARIOS = nccl_scenarios()
pytestmark = pytest.mark.skipif(not SCENARIOS, reason="no NCCL-format fixtures recorded")
DP_CP = "DATA_PARALLEL_GROUP_WITH_CP"


@pytest.fixture(params=SCENARIOS, ids=lambda p: f"{p.parent.name}/{p.name}")
def recorded(request):
    return request.param, load_fr_dumps(str(request.param / "rank_"), qualify=False)


def test_the_gated_all_reduce_is_the_root_and_the_optimizer_follows(recorded):
    directory, fr = recorded
    if not directory.parent.name.startswith("nccl_mtp_"):
        pytest.skip("the verl MTP/CP bug's fixtures only (the look-alikes have their own test)")
    analysis = match_groups(fr)
    [d] = [d for d in analysis.divergences if d.desc == DP_CP]
    assert "op_type" in d.problems
    reduce = next(c for c in d.calls if c.op == "all_reduce")
    assert reduce.site.function == "reduce_loss_in_tracker" and reduce.role == "root"
    assert reduce.absent and all(w.verdict == "skipped" for w in reduce.why.values())
    others = [c for c in d.calls if c is not reduce]
    assert others and all(c.role == "consequence" for c in others)
    assert all(c.op == "reduce_scatter_tensor" for c in others)
    for a in reduce.absent:
        assert reduce.absent_doing[a].startswith(f"reduce_scatter_tensor #{d.seq} at ")
    # every other divergence is a consequence: the skipped ranks are not stuck in those groups
    assert all(c.role == "consequence" for other in analysis.divergences if other is not d for c in other.calls)
    roots = [m for m in mismatches(analysis) if m.role == "root"]
    assert [(m.op, m.group) for m in roots] == [("all_reduce", "dp_cp")]


def test_batched_p2p_takes_the_closing_entrys_state(recorded):
    _, fr = recorded
    dump = fr.rank(0)
    pp = next(g for g in dump.groups if g.desc == "PIPELINE_MODEL_PARALLEL_GROUP")
    if len(pp.ranks) < 2:
        pytest.skip("pp 1: no pipeline sends")
    batches = [c for c in group_calls(dump, pp.name) if c.p2p]
    assert batches and {c.op for c in batches} == {"batch_isend_irecv"}
    assert all(c.closer.profiling_name == "nccl:coalesced" and len(c.entries) >= 2 for c in batches)
    parts = [e for c in batches for e in c.parts]
    assert all(e.in_batch and e.state == c.state for c in batches for e in c.parts)
    assert {(e.src, e.dst) for e in parts} <= {(pp.ranks[0], pp.ranks[1]), (pp.ranks[1], pp.ranks[0])}
    assert match_groups(fr).p2p == ()  # every send found its recv


def test_the_watchdog_log_and_the_dumps_tell_the_same_timeouts(recorded):
    """Two records of one run: each timed-out work in the log is the pending entry of that rank's dump
    in the same group (the log's PG GUID is the dump's group name) at the same sequence number."""
    directory, fr = recorded
    if not (directory / "watchdog.log").is_file():
        pytest.skip("a pipe dump: no watchdog log of its own")
    log = parse_watchdog_log((directory / "watchdog.log").read_text(errors="replace"))
    assert log.timeouts
    for t in log.timeouts:
        dump = fr.rank(t.rank)
        p2p = t.op_type in ("COALESCED", "SEND", "RECV")  # a p2p work carries its p2p sequence number
        [entry] = [
            e
            for e in dump.entries
            if e.group == t.group.name
            and e.is_p2p == p2p
            and not e.in_batch
            and (e.p2p_seq_id if p2p else e.collective_seq_id) == t.seq
        ]
        assert (entry.op, entry.input_numel, entry.output_numel, entry.timeout_ms) == (
            t.op,
            t.numel_in,
            t.numel_out,
            t.timeout_ms,
        )
        assert not entry.done and t.last_enqueued is not None
        if not any(e.is_p2p for e in dump.entries if e.group == t.group.name):
            # A group that carries p2p too (a pipeline group) counts its p2p works in pg_status as well.
            assert t.last_completed < t.seq
        assert dump.group(t.group.name).desc == t.group.desc


@pytest.mark.parametrize(
    "scenario", sorted({p.parent for p in SCENARIOS if (p.parent / "fr_live").is_dir()}), ids=lambda p: p.name
)
def test_a_timeout_dump_holds_the_failed_work_unretired_and_a_later_dump_retired_not_completed(scenario):
    """NCCL's watchdog dumps while the failed work is still in its list (retired: False); a dump taken later
    through the pipe, once the watchdog retired it without its end event, reads retired and not completed:
    a timeout."""
    at_timeout = load_fr_dumps(str(scenario / "fr" / "rank_"), qualify=False)
    later = load_fr_dumps(str(scenario / "fr_live" / "rank_"), qualify=False)
    for before in at_timeout.ranks:
        pending = {e.record_id: e for e in before.entries if not e.done and not e.in_batch}
        assert pending and all(not e.retired and not e.timed_out for e in pending.values())
        after = {e.record_id: e for e in later.rank(before.rank).entries}
        assert all(
            after[r].retired and after[r].timed_out and not after[r].done and after[r].state != "completed"
            for r in pending
        )
