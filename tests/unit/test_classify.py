"""Classification of recorded stacks: op, call site, peer and state of each rank."""

from __future__ import annotations

import pytest

from mtpdiag.analysis.classify import classify_capture, rank_state
from mtpdiag.analysis.gate import gate_of
from mtpdiag.analysis.known_sites import is_mtp_site, lookup
from mtpdiag.analysis.mismatch import choose_kind, doing
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Mismatch, RankView, replace
from support.captures import load_scenario


def _captures(name: str) -> dict:
    snapshot, _, _ = load_scenario(name)
    return {c.rank: c for c in snapshot.captures}


def test_mtp_ranks_read_as_the_recorded_hang():
    caps = _captures("mtp_cp_pp")
    reduce = classify_capture(caps[2])
    assert reduce.op == "all_reduce"
    assert reduce.site.function == "MTPLossLoggingHelper.reduce_loss_in_tracker"
    assert reduce.site.file.endswith("megatron/core/transformer/multi_token_prediction.py")
    assert reduce.site.line == 359
    assert reduce.peer is None
    for rank in (1, 3):
        gather = classify_capture(caps[rank])
        assert (gather.op, gather.site.function) == ("all_gather", "ring_attention")
    send = classify_capture(caps[0])
    assert (send.op, send.site.function, send.peer) == ("send", "send_forward", 2)


def test_site_skips_the_c10d_logger_wrapper():
    caps = _captures("tp_broadcast")
    frames = caps[1].main_thread.frames
    assert frames[1].function == "_exception_logger.<locals>.wrapper"  # the recorded stack has it
    barrier = classify_capture(caps[1])
    assert barrier.op == "barrier"
    assert (barrier.site.function, barrier.site.line) == ("end_of_step_sync", frames[2].line)


def test_p2p_peers_come_from_torch_frame_arguments():
    caps = _captures("p2p_count")
    peers = {rank: classify_capture(c).peer for rank, c in caps.items()}
    assert peers == {0: 2, 1: 3, 2: 0, 3: 1}
    assert {classify_capture(c).site.function for c in caps.values()} == {"send_forward", "send_backward"}


def test_a_sleeping_straggler_is_running_at_its_own_frame():
    caps = _captures("straggler")
    straggler = classify_capture(caps[3])
    assert straggler.op is None
    assert straggler.site.function == "load_batch"  # the caller of time.sleep
    assert rank_state(caps[3], straggler).state == "running"
    assert rank_state(caps[0], classify_capture(caps[0])).state == "collective"


@pytest.mark.parametrize(
    "letter, state",
    [
        ("T", "stopped"),
        ("t", "stopped"),
        ("D", "stopped"),
        ("Z", "gone"),
        ("gone", "gone"),
        ("S", "collective"),
        ("unknown", "collective"),
    ],
)
def test_process_states_map_to_report_states(letter, state):
    capture = _captures("frozen")[0]
    recorded = replace(capture, state=letter)
    result = rank_state(recorded, classify_capture(recorded))
    assert result.state == state
    if letter == "D":
        assert "uninterruptible" in result.error


def test_a_capture_without_threads_is_unreadable():
    capture = replace(_captures("frozen")[2], state="unreadable", threads=(), error="py-spy timed out")
    classified = classify_capture(capture)
    assert classified.op is None and classified.site is None
    assert rank_state(capture, classified).state == "unreadable"
    assert rank_state(capture, classified).error == "py-spy timed out"


def test_known_sites_name_the_groups_megatron_uses():
    caps = _captures("mtp_cp_pp")
    mtp_site = classify_capture(caps[2]).site
    assert lookup(mtp_site).kinds == ("dp_cp",)
    assert is_mtp_site(mtp_site)
    assert lookup(classify_capture(caps[1]).site).kinds == ("cp",)
    send_row = lookup(classify_capture(caps[0]).site)
    assert send_row.p2p and send_row.peer == "next"
    mappings = replace(mtp_site, file="megatron/core/tensor_parallel/mappings.py", function="_reduce")
    assert lookup(mappings).kinds[0] == "tp"
    a2a = replace(mtp_site, file="megatron/core/tensor_parallel/mappings.py", function="_AllToAll.forward")
    assert lookup(a2a).kinds[0] == "ep"
    assert lookup(replace(mtp_site, file="worker.py", function="broadcast_vocab_stats")) is None


def test_kind_inference_prefers_the_smallest_consistent_group():
    layout = ParallelLayout.for_world(4, tp=2)  # tp2 dp2
    kinds = ("tp", "dp", "tp_dp", "world")
    assert choose_kind([0, 2], kinds, layout) == "tp"  # both tp groups half entered
    assert choose_kind([0, 1, 2, 3], kinds, layout) == "tp"  # nothing split anywhere
    assert choose_kind([0, 1, 2], kinds, layout) == "tp_dp"  # tp and dp mix whole and split groups


def test_gate_only_counts_coordinates_that_vary_in_the_group():
    layout = ParallelLayout.for_world(4, cp=2, pp=2)
    split = Mismatch(op="all_reduce", site=None, group="dp_cp", members=(2, 3), entered=(2,), absent=(3,), gate=None)
    assert gate_of([split], layout.coords) == {"cp": 0}  # pp is 1 for both: not a gate
    layout8 = ParallelLayout.for_world(8, tp=2, cp=2)  # tp2 cp2 dp2
    world = tuple(range(8))
    conj = Mismatch(
        op="x", site=None, group="world", members=world, entered=(0, 4), absent=(1, 2, 3, 5, 6, 7), gate=None
    )
    assert gate_of([conj], layout8.coords) == {"tp": 0, "cp": 0}
    mixed = Mismatch(
        op="x", site=None, group="world", members=world, entered=(0, 3), absent=(1, 2, 4, 5, 6, 7), gate=None
    )
    assert gate_of([mixed], layout8.coords) is None


def test_doing_words():
    caps = _captures("straggler")
    view = RankView(
        rank=3,
        pid=1,
        host="h",
        state="running",
        coords=None,
        op=None,
        site=classify_capture(caps[3]).site,
        stack=None,
        wait=None,
    )
    assert doing(view) == "running in load_batch"
    assert doing(None) == "not captured"
    assert doing(replace(view, state="stopped")) == "stopped"
