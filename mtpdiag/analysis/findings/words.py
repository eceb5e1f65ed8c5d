"""The phrases every finding is written with: ranks with their coordinates, groups and where their kind came
from, how strong a gate is, and the hints on what to collect next."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from mtpdiag.analysis.gate import describe_gate
from mtpdiag.analysis.known_sites import is_mtp_site
from mtpdiag.analysis.program_order import RootOrder
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Mismatch, RankView, Site
from mtpdiag.vocabulary.groups import GROUP_NAMES, GroupKind
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.states import GateStrength, GroupFrom, OrderSource, Role

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

SHOW = 6  # ranks named in a summary before "…"
# Megatron's metric trackers other than MTP that hang the same way: what to call them, and the fix.
TRACKER_WORDS = {
    "dsa-indexer": (
        "DeepSeek indexer loss reduce (DSAIndexerLossLoggingHelper, not the MTP loss)",
        "every pipeline stage must take part in the indexer's PP all_reduce: take Megatron-LM #4518 "
        "(dev), or seed the indexer tracker with zeros on every stage before reduce_loss_in_tracker",
    ),
    "moe-aux-loss": (
        "MoE aux-loss tracker reduce",
        "every pipeline stage must hold the same tracker entries: call track_moe_metrics with "
        "force_initialize=True (and count the MTP layers: Megatron-LM #3400/#3401), or create the "
        "entries on stages without MoE layers (NeMo-RL #3419)",
    ),
}

# A metric tracker's collective seen without a layout: the hang it is known for, and the size that shows it.
SIGNATURE_HANGS = {
    "mtp": ("MTP-loss", "the verl #5895 deadlock when CP > 1", "--cp"),
    "dsa-indexer": (
        "DeepSeek-indexer loss",
        "the Megatron-LM #4745 hang when a pipeline stage holds no indexer layers",
        "--pp",
    ),
    "moe-aux-loss": ("MoE aux-loss", "the Megatron-LM #1444 hang when a pipeline stage holds no MoE layers", "--pp"),
}
SIZE_FLAGS = {"tp": "--tp", "cp": "--cp", "pp": "--pp", "ep": "--ep", "etp": "--etp", "mp": "--tp/--pp"}

FR_LAUNCH_ENV = (
    "TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_ "
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_pipe_rank_"
)
FR_HOW = (
    "the Flight Recorder dumps ${TORCH_FR_DUMP_TEMP_FILE}<rank> (default ~/.cache/torch/comm_lib_trace_rank_"
    "<rank>, /tmp/nccl_trace_rank_<rank> before torch 2.6), written on every rank when the NCCL watchdog "
    "times out (TORCH_NCCL_TIMEOUT, 10 min by default), or now with `mtpdiag inspect --fr-dump` when the "
    "job set TORCH_NCCL_DEBUG_INFO_PIPE_FILE; then `mtpdiag analyze --fr <prefix>` (with the stacks, or "
    f"alone). If the job did not record them, relaunch with {FR_LAUNCH_ENV}"
)
# Why a capture fails, read from the tool's reason (py-spy's or pystack's error text, or mtpdiag's own), and
# what makes the next one work. The first that matches a reason is said; several reasons, several fixes.
CAPTURE_FIXES = (
    (
        re.compile(r"not found|no such file or directory|not installed", re.IGNORECASE),
        "install py-spy where the ranks run (`pip install py-spy` in the job's image or environment)",
    ),
    (
        re.compile(r"permission denied|operation not permitted|EPERM|EACCES|os error (?:1|13)\b", re.IGNORECASE),
        "let py-spy attach: run it as the job's user or as root, with CAP_SYS_PTRACE in a container "
        "(`--cap-add SYS_PTRACE`), or with kernel.yama.ptrace_scope=0",
    ),
    (
        re.compile(r"python version|py_version|unsupported python|interpreter address", re.IGNORECASE),
        "use a py-spy that reads this Python version (`pip install -U py-spy`)",
    ),
    (
        re.compile(r"timed out|timeout|empty file|printed nothing|terminated|killed", re.IGNORECASE),
        "a dump that hangs is a process py-spy cannot stop, often in uninterruptible sleep (state D): read "
        "/proc/<pid>/status, wchan and stack as root, or dump it with `py-spy dump --nonblocking`",
    ),
)
DUMP_EVERY_RANK = (
    "dump every rank, not one: `mtpdiag collect --out DIR` on each node (or `py-spy dump --pid <pid>` of each "
    "rank, as the job's user or root, into files named rankN) and `mtpdiag analyze DIR`"
)


def capture_remedy(reasons: Iterable[str]) -> str:
    """What to do when no stack could be read: fix what made the captures fail (from their reasons), then
    collect the stacks of every rank; the Flight Recorder needs no stack at all."""
    fixes: list[str] = []
    texts = list(reasons)
    for pattern, fix in CAPTURE_FIXES:
        if any(pattern.search(text) for text in texts) and fix not in fixes:
            fixes.append(fix)
    dump = f"then {DUMP_EVERY_RANK}" if fixes else DUMP_EVERY_RANK
    return "; ".join([*fixes, dump, f"without stacks, get {FR_HOW}"])


FLIGHT_RECORDER_HINT = (
    "look below Python: the network, NCCL or a device (NCCL_DEBUG=INFO, dmesg); compare each rank's last "
    f"collective in {FR_HOW}"
)


class Words:
    """Rank and site phrases, with coordinates when a layout is known."""

    def __init__(self, layout: ParallelLayout | None) -> None:
        self.layout = layout

    def rank(self, rank: int) -> str:
        if self.layout is not None and 0 <= rank < self.layout.world_size:
            return f"rank {rank} ({self.layout.describe(rank)})"
        return f"rank {rank}"

    def ranks(self, ranks: Sequence[int], coords: bool = False) -> str:
        """``rank 3 (tp0 cp1 pp1)``, ``ranks 0, 2``, ``4096 ranks (0, 2, 4, …)``."""
        ranks = sorted(ranks)
        if len(ranks) == 1:
            return self.rank(ranks[0]) if coords else f"rank {ranks[0]}"
        if len(ranks) <= 3 and coords and self.layout is not None:
            return "ranks " + ", ".join(self.rank(r).removeprefix("rank ") for r in ranks)
        if len(ranks) <= SHOW:
            return "ranks " + rank_list(ranks)
        return f"{len(ranks)} ranks ({rank_list(ranks, SHOW)})"

    @staticmethod
    def members(ranks: Sequence[int]) -> str:
        return "[" + rank_list(sorted(ranks), 2 * SHOW, show=SHOW, more=", … ({n} ranks)") + "]"

    @staticmethod
    def where(site: Site | None) -> str:
        if site is None:
            return "an unknown site"
        return f"{site.function.rsplit('.', 1)[-1]} ({os.path.basename(site.file)}:{site.line})"

    @staticmethod
    def group(kind: str) -> str:
        return GROUP_NAMES.get(kind, kind)

    @staticmethod
    def verb(ranks: Sequence[int], one: str, many: str) -> str:
        return one if len(ranks) == 1 else many


def groups_phrase(kind: str, instances: Sequence[Mismatch], words: Words) -> str:
    """``the DP×CP group [2, 3]``, ``the TP groups [0, 1] and [2, 3]``, ``4096 CP groups ([0, 1], …)``,
    followed by where the group kind came from when it was not the known-site table."""
    name = words.group(kind)
    lists = [words.members(m.members) for m in instances]
    if len(lists) == 1:
        text = f"the {name} group {lists[0]}"
    elif len(lists) <= 3:
        text = f"the {name} groups {', '.join(lists[:-1])} and {lists[-1]}"
    else:
        text = f"{len(lists)} {name} groups ({', '.join(lists[:2])}, …)"
    return text + group_source_phrase(instances[0])


def group_source_phrase(m: Mismatch) -> str:
    """`` (group guessed from who waits: TP or TP×DP)``: where a split's group kind came from, when that is
    not plain (the known-site table and the Flight Recorder's pg_config name it; membership only fits it)."""
    if m.group_from == GroupFrom.GUESS:
        names = " or ".join(GROUP_NAMES.get(k, k) for k in m.group_candidates) or GROUP_NAMES.get(m.group, m.group)
        return f" (group guessed from which ranks wait: {names} fit)"
    if m.group_from == GroupFrom.UNIQUE_FIT:
        return " (the only group kind whose members fit who waits)"
    if m.group_from == GroupFrom.WORLD_OP:
        return f" ({m.op} is taken as a world-group call: the stack does not keep its group argument)"
    return ""


SOURCE_WORDS = {"stacks": "the stacks", "flight-recorder": "the Flight Recorder", "watchdog-log": "the watchdog log"}
GROUP_SOURCES = {
    "known-site": "the known-site table names the group of this call",
    "flight-recorder": "the Flight Recorder records the group (its pg_config and description)",
    "watchdog-log": "the watchdog log names the group",
    "unique-fit": "the only group kind whose members fit who waits",
    "world-op": "taken as a world-group call (the stack does not keep the group argument)",
}


def provenance(m: Mismatch) -> str:
    """Where a split's group kind and gate came from, in one parenthesis for the split's sentence."""
    if m.group_from == GroupFrom.GUESS:
        names = " or ".join(GROUP_NAMES.get(k, k) for k in m.group_candidates) or GROUP_NAMES.get(m.group, m.group)
        group = f"group guessed from who waits ({names} fit)"
    else:
        group = GROUP_SOURCES.get(m.group_from, m.group_from)
    if m.gate is None or m.role == Role.CONSEQUENCE:
        gate = ""
    elif m.gate_strength == GateStrength.STRONG:
        gate = "; gate read from the coordinates of who entered and who did not"
        if is_mtp_site(m.site) and m.group == GroupKind.DP_CP and m.gate == {"cp": 0}:
            gate += ": the known verl #5895 signature"
        else:
            gate += ", which split cleanly along it (several ranks on each side)"
    else:
        gate = "; gate" + gate_source_phrase(m).removeprefix(" (").removesuffix(")").replace("weak:", " weak:", 1)
    sources = " and ".join(SOURCE_WORDS.get(part, part) for part in m.source.split("+"))
    return f" [{group}{gate}; from {sources}]"


def gate_source_phrase(m: Mismatch) -> str:
    """What the gate rests on, when it is weak: a rank test fits, and so does data-dependent divergence."""
    if m.gate is None or m.gate_strength != GateStrength.WEAK:
        return ""
    others = "".join(f" or {describe_gate(g)}" for g in m.gate_alternatives)
    if others:
        return (
            f" (weak: {describe_gate(m.gate)}{others} separate the ranks equally well; a branch on rank-local "
            "data fits too)"
        )
    return (
        " (weak: too few ranks on one side to tell a rank test from data-dependent divergence, e.g. a loop "
        "that ran once more on some ranks)"
    )


def doing_phrase(ranks: Sequence[int], doing_of: Mapping[int, str]) -> str:
    values = list(dict.fromkeys(doing_of.get(r, "not captured") for r in sorted(ranks)))
    return "; ".join(values[:3]) + ("; …" if len(values) > 3 else "")


def union(values: Iterable[Sequence[int]]) -> tuple[int, ...]:
    return tuple(sorted({r for v in values for r in v}))


def grouped(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    out: dict[K, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def pids(ranks: Sequence[int], views: Mapping[int, RankView]) -> str:
    pids = [str(views[r].pid) for r in ranks[:SHOW] if r in views and views[r].pid is not None]
    return " ".join(pids) if pids else "PID"


def order_phrase(order: RootOrder, op: str, entered: Sequence[int], words: Words) -> str:
    """What the ranks that went past a root did instead, and how program order shows it (``RootOrder``)."""
    skipped = order.skipped_by
    who = words.ranks(skipped, coords=True)
    wait = words.verb(skipped, "waits", "wait")
    instead = f"{order.instead_op} in {words.where(order.instead_site)}" if order.instead_op else "elsewhere"
    at = order.at
    where = (
        f"{at.function.rsplit('.', 1)[-1]} ({os.path.basename(at.file)}:{at.second}, after :{at.first})" if at else ""
    )
    if order.source == OrderSource.FLIGHT_RECORDER:
        return (
            f"{who} skipped this {op}: the Flight Recorder shows {words.verb(skipped, 'it', 'them')} going on to "
            f"later collectives without it; {words.verb(skipped, 'it waits', 'they wait')} at {instead}"
        )
    if order.source == OrderSource.STACKS:
        fn = at.function.rsplit(".", 1)[-1] if at else "their shared frame"
        return (
            f"{who} went past this {op} without entering it and {wait} at {instead}, a later line of {where} "
            f"(line order only: if {fn} loops, {words.ranks(entered)} may instead be an iteration ahead; the "
            "Flight Recorder's sequence numbers decide)"
        )
    if order.source == OrderSource.STACKS_AND_KNOWN_SITE:
        return f"{who} returned before this {op} and {wait} at {instead}, a later line of {where}"
    if order.contradicted:
        return (
            f"{who} never joined and {wait} at {instead}: the known early return lets them skip it, an iteration "
            "ahead, since line order puts them before it (the Flight Recorder's sequence numbers decide)"
        )
    return f"{who} never joined and {wait} at {instead}: the known early return lets them skip it"
