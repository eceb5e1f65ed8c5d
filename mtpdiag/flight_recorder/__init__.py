"""torch Flight Recorder dumps as first-class evidence: read them, match them across ranks, say what hangs.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=N``, on by default for NCCL since torch 2.8) keeps each rank's
last N ops: the process group (a name that is the same on every member, and a description such as
megatron's ``DATA_PARALLEL_GROUP_WITH_CP``), the group's sequence number, the op, its sizes, dtypes, state
and the Python stack that issued it. On a GPU hang the stacks often show no collective at all (NCCL
collectives are asynchronous), so this record is often the only one of *which* collective hangs.

* ``dump``: load the per-rank files (pickle or JSON) without running code (``load_fr_dumps``);
* ``parse``/``records``/``names``/``sites``/``calls``: the format, read into typed frozen data;
* ``match``: per group, the first sequence number where members disagree (``match_groups``);
* ``order``: whether a rank absent from a call skipped it (root) or is behind (consequence);
* ``watchdog``: NCCL's watchdog timeout lines of a log (``parse_watchdog_log``);
* ``locate``: where torch writes the dumps, and asking a live job for one (``dump_prefixes``,
  ``request_live_dump``);
* ``progress``/``correlate``: the older per-group progress view next to a stack diagnosis.
"""

from mtpdiag.flight_recorder.correlate import correlate, ops_match
from mtpdiag.flight_recorder.dump import load_fr_dumps, read_dump_file
from mtpdiag.flight_recorder.locate import dump_prefixes, request_live_dump
from mtpdiag.flight_recorder.match import (
    Divergence,
    FRAnalysis,
    FRCallSplit,
    GroupMatch,
    P2PMismatch,
    RankAt,
    match_groups,
    mismatches,
)
from mtpdiag.flight_recorder.names import op_name, parse_profiling_name
from mtpdiag.flight_recorder.order import AbsentWhy
from mtpdiag.flight_recorder.progress import GroupProgress, group_progress
from mtpdiag.flight_recorder.records import FRDump, FREntry, FRGroup, FRGroupStatus, FRRankDump
from mtpdiag.flight_recorder.watchdog import WatchdogLog, WatchdogTimeout, parse_watchdog_log

__all__ = [
    "AbsentWhy", "Divergence", "FRAnalysis", "FRCallSplit", "FRDump", "FREntry", "FRGroup", "FRGroupStatus",
    "FRRankDump", "GroupMatch", "GroupProgress", "P2PMismatch", "RankAt",
    "WatchdogLog", "WatchdogTimeout", "correlate", "dump_prefixes", "group_progress", "load_fr_dumps",
    "match_groups", "mismatches", "op_name", "ops_match", "parse_profiling_name", "parse_watchdog_log",
    "read_dump_file", "request_live_dump",
]
