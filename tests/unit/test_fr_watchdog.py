"""NCCL watchdog lines of a job log, in the formats ProcessGroupNCCL.cpp has written from torch 2.3 to 2.13.

Each line below is what torch's format strings produce for the values given (the source of each is named
next to it), with glog's ``[rankN]:[E<date> <time> <tid> ProcessGroupNCCL.cpp:<line>]`` prefix that torch
adds, torchrun's ``[default3]:`` tee prefix on some, and unrelated lines interleaved.
"""

from __future__ import annotations

from mtpdiag.inputs.watchdog_log import load_watchdog_log, parse_watchdog_log

# torch 2.13: WorkNCCL::checkTimeout with WorkNCCL::logPrefix "[Rank <group rank>] " and operator<<(WorkNCCL);
# then the watchdog's "failure detected" line with the group's createLogPrefix (PG ID, GUID, desc), the
# heartbeat monitor's dump-signal message, and the exception again as the watchdog thread dies.
LOG_2_13 = """\
[default2]:[rank2]:[E1130 10:00:01.123456789 1234 ProcessGroupNCCL.cpp:685] [Rank 0] Watchdog caught collective \
operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 \
milliseconds before timing out.
some training output 12.5 it/s
[rank2]:[E1130 10:00:01.123500000 1234 ProcessGroupNCCL.cpp:2056] [PG ID 2 PG GUID 3(DATA_PARALLEL_GROUP_WITH_CP) \
Rank 0]  failure detected by watchdog at work sequence id: 2 PG status: last enqueued work: 3, last completed work: 1
[rank3]:[E1130 10:00:02.000000000 1240 ProcessGroupNCCL.cpp:685] [Rank 1] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=2, OpType=_ALLGATHER_BASE, NumelIn=1024, NumelOut=2048, Timeout(ms)=600000) ran for 600001 \
milliseconds before timing out.
\x1b[31mgarbage \xff line\x1b[0m
[rank3]:[E1130 10:00:02.000100000 1240 ProcessGroupNCCL.cpp:2056] [PG ID 2 PG GUID 3(DATA_PARALLEL_GROUP_WITH_CP) \
Rank 1]  failure detected by watchdog at work sequence id: 2 PG status: last enqueued work: 2, last completed work: 1
[rank0]:[E1130 10:00:03.000000000 1250 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received \
a dump signal due to a collective timeout from  rank 2 and we will try our best to dump the debug info. Last enqueued \
NCCL work: 7, last completed NCCL work: 7.This is most likely caused by incorrect usages of collectives
[rank2]:[E1130 10:00:04.000000000 1234 ProcessGroupNCCL.cpp:1900] [PG ID 2 PG GUID 3(DATA_PARALLEL_GROUP_WITH_CP) \
Rank 0] Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 \
milliseconds before timing out.
  what():  [PG ID 2 PG GUID 3(DATA_PARALLEL_GROUP_WITH_CP) Rank 0] Process group watchdog thread terminated with \
exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, \
NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.
"""

# torch 2.4: createLogPrefix "[PG <name> (<desc>) Rank <r>] ", the "Exception ... detected" and "Timeout at NCCL
# work" lines; torch 2.3: "[PG <uid> Rank <r>] ". Also a blocking-wait timeout (WorkNCCL::wait).
LOG_2_4 = """\
[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, \
OpType=BROADCAST, NumelIn=131072, NumelOut=131072, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.
[rank1]:[E ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either an error or timeout) detected by \
watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.
[rank1]:[E ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 6463, last enqueued NCCL \
work: 6463, last completed NCCL work: 6462.
[rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 5 Rank 0] Timeout at NCCL work: 9, last enqueued NCCL work: 9, last \
completed NCCL work: 8.
[rank0]:[E ProcessGroupNCCL.cpp:900] [Rank 0] Work WorkNCCL(SeqNum=9, OpType=SEND, NumelIn=6, NumelOut=6, \
Timeout(ms)=5000) timed out in blocking wait.
"""

# TraceUtils.h retrieveDesyncReport (TORCH_NCCL_DESYNC_DEBUG=1); group ranks.
DESYNC = """\
[rank0]:[E ProcessGroupNCCL.cpp:600] [Rank 0] Timeout at collective: ALLREDUCE, #5
	 - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
[rank0]:	   - [0, 2] joined but didn't finish collective #5 (count from 1)
[rank0]:	     [1] finished collective #5, but didn't join collective #6 (count from 1)
[rank4]:	 - To our best knowledge, ranks [3] are the lagging ranks that caused this timeout. They never joined \
any collectives
"""


def test_torch_2_13_timeouts_with_their_groups_and_progress():
    log = parse_watchdog_log(LOG_2_13)
    assert len(log.timeouts) == 2  # the exception repeats rank 2's timeout twice: it is reported once
    reduce, gather = log.timeouts
    assert (reduce.rank, reduce.seq, reduce.op_type, reduce.op, reduce.numel_in, reduce.numel_out) == (
        2,
        2,
        "ALLREDUCE",
        "all_reduce",
        1,
        1,
    )
    assert (reduce.timeout_ms, reduce.ran_for_ms, reduce.blocking_wait, reduce.line) == (600000, 600012, False, 1)
    assert (reduce.group.pg_id, reduce.group.name, reduce.group.desc, reduce.group.rank) == (
        2,
        "3",
        "DATA_PARALLEL_GROUP_WITH_CP",
        0,
    )
    assert (reduce.last_enqueued, reduce.last_completed) == (3, 1)
    assert (gather.rank, gather.op, gather.numel_out, gather.last_enqueued, gather.group.desc) == (
        3,
        "all_gather_into_tensor",
        2048,
        2,
        "DATA_PARALLEL_GROUP_WITH_CP",
    )
    signal = next(s for s in log.statuses if s.signal_from)
    assert (signal.rank, signal.signal_from, signal.last_enqueued, signal.last_completed, signal.group.desc) == (
        0,
        "rank 2",
        7,
        7,
        "default_pg",
    )


def test_torch_2_3_and_2_4_formats_and_blocking_wait():
    log = parse_watchdog_log(LOG_2_4)
    broadcast, send = log.timeouts
    assert (broadcast.rank, broadcast.seq, broadcast.op, broadcast.timeout_ms) == (1, 6463, "broadcast", 1800000)
    assert (broadcast.group.name, broadcast.group.desc, broadcast.last_enqueued, broadcast.last_completed) == (
        "0",
        "default_pg",
        6463,
        6462,
    )
    assert (send.op, send.blocking_wait, send.ran_for_ms, send.group.name, send.last_completed) == (
        "send",
        True,
        None,
        "5",
        8,
    )
    assert [s.failed_seq for s in log.statuses] == [6463, 6463, 9]


def test_the_desync_report():
    joined, finished, never = parse_watchdog_log(DESYNC).desync
    assert (joined.rank, joined.seq, joined.joined_not_finished) == (0, 5, (0, 2))
    assert (finished.seq, finished.finished_not_joined) == (5, (1,))
    assert (never.rank, never.never_joined) == (4, (3,))


def test_a_log_without_watchdog_lines_is_empty_and_the_file_reader(tmp_path):
    assert parse_watchdog_log("epoch 1 loss 2.3\nWorkNCCL(broken\n[Rank x] Watchdog") == parse_watchdog_log("")
    path = tmp_path / "job.log"
    path.write_bytes(LOG_2_13.encode() + b"\xff\xfe\n")
    assert len(load_watchdog_log(str(path)).timeouts) == 2
    assert parse_watchdog_log(LOG_2_13).timeouts[0].logged().pg_desc == "DATA_PARALLEL_GROUP_WITH_CP"


# torch 1.7 to 1.9: operator<<(WorkNCCL) printed "WorkNCCL(OpType=…, TensorShape=[…], Timeout(ms)=…)" (no SeqNum; the
# shape only when the work kept its outputs), the watchdog "[Rank r] Watchdog caught collective operation timeout: …
# ran for N milliseconds before timing out.", and 1.7's blocking wait "[Rank r] Caught collective operation timeout
# for work: …" (ProcessGroupNCCL.cpp of those releases). glog's "[E ProcessGroupNCCL.cpp:566]", no [rankN]: prefix.
LOG_1_X = """\
[E ProcessGroupNCCL.cpp:566] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, \
TensorShape=[2048, 16], Timeout(ms)=1800000) ran for 1800445 milliseconds before timing out.
[E ProcessGroupNCCL.cpp:566] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(OpType=BROADCAST, \
Timeout(ms)=1800000) ran for 1800402 milliseconds before timing out.
I1002 15:18:52.161238 1821930 ProcessGroupNCCL.cpp:388] [Rank 2] Caught collective operation timeout for work: \
WorkNCCL(OpType=ALLREDUCE, TensorShape=[2048, 16], Timeout(ms)=1000)
"""


def test_torch_1_x_without_sequence_numbers_is_compared_by_op_and_says_so():
    from mtpdiag.analysis.log_evidence import fold_log
    from mtpdiag.analysis.log_words import NO_GLOBAL_NOTE, NO_SEQ_NOTE

    log = parse_watchdog_log(LOG_1_X)
    reduce1, broadcast, reduce2 = log.timeouts
    assert (reduce1.seq, reduce1.op, reduce1.tensor_shape, reduce1.group.rank, reduce1.rank) == (
        None,
        "all_reduce",
        "[2048, 16]",
        1,
        None,
    )
    assert (broadcast.op, broadcast.ran_for_ms, reduce2.ran_for_ms, reduce2.timeout_ms) == (
        "broadcast",
        1800402,
        None,
        1000,
    )
    folded = fold_log(log, None, None)
    # Ranks 0 and 1 timed out in different ops: that is all a log without numbers can say, and it says so.
    assert {(m.op, m.entered, m.absent, m.seq) for m in folded.mismatches} == {
        ("all_reduce", (1, 2), (0,), None),
        ("broadcast", (0,), (1, 2), None),
    }
    assert NO_SEQ_NOTE in folded.notes and NO_GLOBAL_NOTE in folded.notes


def test_failures_without_an_op_contradict_no_one_and_p2p_counts_apart():
    """llamafactory #6269: ranks 2 and 6 report only "Timeout at NCCL work: 7753" (op not logged): no split with
    ranks 0 and 4's reduce_scatter at #7753. A p2p work's number is the group's p2p count: a SEND #7 is not
    compared with an all_gather #7 (torch 2.4 format strings, as in LOG_2_4)."""
    from pathlib import Path

    from mtpdiag.analysis.log_evidence import fold_log

    text = (Path(__file__).parents[1] / "fixtures/watchdog_logs/llamafactory_6269_pg_uid.log").read_text()
    folded = fold_log(parse_watchdog_log(text), None, None)
    assert folded.mismatches == () and folded.size_problems == ()
    [finding] = folded.findings
    assert finding.id == "unexplained-wait" and "ranks 0, 2, 4, 6 timed out at #7753 in PG 1" in finding.summary
    p2p = """\
[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, \
OpType=SEND, NumelIn=6, NumelOut=6, Timeout(ms)=5000) ran for 5001 milliseconds before timing out.
[rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 5 Rank 0] Timeout at NCCL work: 7, last enqueued NCCL work: 7, last \
completed NCCL work: 6.
[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, \
OpType=_ALLGATHER_BASE, NumelIn=6, NumelOut=12, Timeout(ms)=5000) ran for 5002 milliseconds before timing out.
[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 5 Rank 1] Timeout at NCCL work: 7, last enqueued NCCL work: 7, last \
completed NCCL work: 6.
"""
    assert fold_log(parse_watchdog_log(p2p), None, None).mismatches == ()


def test_torchrun_and_pdsh_prefixes_before_real_lines():
    """No public watchdog log with torchrun's --tee prefix (``[default1]:``) or pdsh's (``node-7: ``) was found:
    here they are put before BasicSR #737's real lines, which must read the same."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "fixtures/watchdog_logs/basicsr_737_pg_guid_desc.log").read_text()
    plain = parse_watchdog_log(text)
    for prefix in ("[default1]:", "node-7: ", "node-7: [default1]:", "2025-06-26T06:24:44.903Z "):
        prefixed = parse_watchdog_log("".join(prefix + line for line in text.splitlines(keepends=True)))
        assert prefixed.timeouts == plain.timeouts and prefixed.statuses == plain.statuses


def test_a_rank_the_lines_disagree_on_is_reported_both_ways():
    """NCCL #1610: [rank15] prints "[Rank 1]" on its timeout while its group's line says "Rank 0"."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "fixtures/watchdog_logs/nccl_1610_rank_disagree.log").read_text()
    log = parse_watchdog_log(text)
    rank15 = next(t for t in log.timeouts if t.rank == 15)
    assert (rank15.work_rank, rank15.group.rank, rank15.group.name) == (1, 0, "112")
    [note] = log.notes
    assert "rank 15 at #57: [Rank 1] on the timeout, Rank 0 in 112" in note and "neither is trusted" in note
