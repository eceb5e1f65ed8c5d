"""torch Flight Recorder dumps: read them safely, and hold them against the stack diagnosis.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=N``) keeps each rank's last N collectives: the process
group (a name that is the same on every member, and a description such as megatron's
``DATA_PARALLEL_GROUP_WITH_CP``), the per-group collective sequence number, the op and its state.
A dump is one pickle per rank, named ``<prefix><rank>`` (torch's ``TORCH_FR_DUMP_TEMP_FILE`` prefix).

Stacks say where each rank waits now; the recorder says how far each rank got in each group, and
which ranks a group really has. ``correlate`` puts the two side by side and lists where they differ.

The dumps are plain dicts, lists, strings and numbers, so they are unpickled by an unpickler that
refuses every class and callable: a dump can never run code here.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from mtpdiag.errors import InputError
from mtpdiag.model import Report, Site

MAX_DUMP_BYTES = 256 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"^(.*?)(\d+)$")
_P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# torch profiling names -> the public function names the stack analysis uses.
_OP_ALIASES = {
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_base": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "all_reduce_barrier": "barrier",
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all",
}
# megatron-core group descriptions -> layout.py group kinds (the ones whose membership we can check).
MEGATRON_GROUP_KINDS = {
    "default_pg": "world",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_GLOO": "dp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp_cp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "MODEL_PARALLEL_GROUP": "mp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
    "EXPERT_DATA_PARALLEL_GROUP_GLOO": "edp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
}


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class FRGroup:
    """A process group as one rank's ``pg_config`` describes it. ``ranks`` is empty when unrecorded."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class FREntry:
    """One recorded op. ``done`` is true once torch marked it completed or retired its work."""

    record_id: int
    group: str
    group_desc: str
    op: str
    profiling_name: str
    collective_seq_id: int
    p2p_seq_id: int
    is_p2p: bool
    state: str  # scheduled | started | completed
    done: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    site: Site | None  # the first frame outside torch, as the stack analysis names call sites


@dataclass(frozen=True)
class FRGroupStatus:
    """torch's own per-group counters (``pg_status``); they survive the ring buffer dropping entries."""

    group: str
    last_enqueued: int
    last_completed: int


@dataclass(frozen=True)
class FRRankDump:
    rank: int
    path: str
    version: str
    groups: tuple[FRGroup, ...]
    entries: tuple[FREntry, ...]
    status: tuple[FRGroupStatus, ...] = ()


@dataclass(frozen=True)
class FRDump:
    """Every rank's dump under one prefix, sorted by rank."""

    source: str
    ranks: tuple[FRRankDump, ...]

    def rank(self, rank: int) -> FRRankDump | None:
        return next((r for r in self.ranks if r.rank == rank), None)


# ---------------------------------------------------------------- loading


class _PlainUnpickler(pickle.Unpickler):
    """Builds only containers and primitives: any class, function or persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses persistent ids")


def load_fr_dumps(prefix_or_dir: str) -> FRDump:
    """Read ``<prefix><rank>`` files, or the one family of them in a directory."""
    files = _dump_files(prefix_or_dir)
    ranks = tuple(sorted((_load_one(path, rank) for rank, path in files.items()), key=lambda d: d.rank))
    return FRDump(source=prefix_or_dir, ranks=ranks)


def _dump_files(prefix_or_dir: str) -> dict[int, str]:
    if os.path.isdir(prefix_or_dir):
        folder, prefix = prefix_or_dir, None
    else:
        folder, prefix = os.path.dirname(prefix_or_dir) or ".", os.path.basename(prefix_or_dir)
        if not os.path.isdir(folder):
            raise InputError(f"no Flight Recorder dumps at {prefix_or_dir}: {folder} is not a directory")
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise InputError(f"cannot list {folder}: {exc.strerror or exc}") from None
    families: dict[str, dict[int, str]] = {}
    for name in names:
        match = _RANK_SUFFIX.match(name)
        path = os.path.join(folder, name)
        if not match or not os.path.isfile(path) or (prefix is not None and match.group(1) != prefix):
            continue
        family = families.setdefault(match.group(1), {})
        rank = int(match.group(2))
        if rank in family:
            raise InputError(f"two Flight Recorder dumps for rank {rank}: {family[rank]} and {path}")
        family[rank] = path
    if not families:
        what = f"{prefix}<rank>" if prefix is not None else "<prefix><rank>"
        raise InputError(f"no Flight Recorder dumps named {what} in {folder}")
    if len(families) > 1:
        found = ", ".join(sorted(families))
        raise InputError(f"{folder} holds several dump prefixes ({found}); pass {folder}/<prefix>")
    return next(iter(families.values()))


def _load_one(path: str, rank: int) -> FRRankDump:
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            raise InputError(f"{path}: {size} bytes is too large for a Flight Recorder dump")
        with open(path, "rb") as f:
            data = _PlainUnpickler(io.BytesIO(f.read())).load()
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # any malformed pickle: truncated, refused class, bad opcode, too deep
        raise InputError(f"{path}: not a readable Flight Recorder dump ({_one_line(exc)})") from None
    try:
        return _rank_dump(data, rank, path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{path}: not a Flight Recorder dump ({_one_line(exc)})") from None


def _rank_dump(data: Any, rank: int, path: str) -> FRRankDump:
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError("expected a dict with an 'entries' list")
    entries = tuple(_entry(e) for e in data["entries"])
    groups = tuple(_group(name, cfg) for name, cfg in (data.get("pg_config") or {}).items() if name)
    group_of_pg = {str(e.get("pg_id")): str(e["process_group"][0]) for e in data["entries"] if "pg_id" in e}
    status = tuple(
        FRGroupStatus(group=group_of_pg[str(pg_id)], last_enqueued=_int(s.get("last_enqueued_collective")),
                      last_completed=_int(s.get("last_completed_collective")))
        for pg_id, s in sorted((data.get("pg_status") or {}).items())
        if str(pg_id) in group_of_pg and isinstance(s, dict)
    )
    return FRRankDump(rank=rank, path=path, version=str(data.get("version", "")), groups=groups,
                      entries=entries, status=status)


def _group(name: Any, cfg: Any) -> FRGroup:
    if not isinstance(cfg, dict):
        raise TypeError(f"pg_config[{name!r}] is not a dict")
    ranks = cfg.get("ranks", [])
    if isinstance(ranks, str):  # torch writes the list as its string form, "[2, 3]"
        ranks = json.loads(ranks) if ranks.strip() else []
    return FRGroup(name=str(name), desc=str(cfg.get("desc", "")), ranks=tuple(sorted(int(r) for r in ranks)))


def _entry(e: Any) -> FREntry:
    if not isinstance(e, dict):
        raise TypeError("an entry is not a dict")
    group, desc = e["process_group"][0], e["process_group"][1]
    state = str(e.get("state", ""))
    return FREntry(
        record_id=_int(e.get("record_id")),
        group=str(group),
        group_desc=str(desc),
        op=op_name(str(e.get("profiling_name", ""))),
        profiling_name=str(e.get("profiling_name", "")),
        collective_seq_id=_int(e.get("collective_seq_id")),
        p2p_seq_id=_int(e.get("p2p_seq_id")),
        is_p2p=bool(e.get("is_p2p", False)),
        state=state,
        done=state == "completed" or bool(e.get("retired", False)),
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        site=_call_site(e.get("frames") or []),
    )


def op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``; ``nccl:send 0->1`` -> ``send``; ``nccl:_allgather_base`` ->
    ``all_gather_into_tensor``."""
    name = profiling_name.split(":", 1)[-1].split(" ", 1)[0]
    return _OP_ALIASES.get(name, name)


def _call_site(frames: list) -> Site | None:
    """The first frame (innermost first) outside torch and decorator plumbing."""
    for f in frames:
        if not isinstance(f, dict):
            continue
        file = str(f.get("filename", ""))
        if "/torch/" in file or file.endswith(("/functools.py", "/contextlib.py")):
            continue
        return Site(file=_display_path(file), line=_int(f.get("line")), function=str(f.get("name", "")))
    return None


def _display_path(file: str) -> str:
    for root in ("/site-packages/", "/dist-packages/"):
        cut = file.rfind(root)
        if cut >= 0:
            return file[cut + len(root):]
    return file


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(x) for x in s) for s in value or () if isinstance(s, (list, tuple)))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# ---------------------------------------------------------------- per-group progress


@dataclass(frozen=True)
class GroupProgress:
    """How far each member got in one group's collective sequence, by the recorder's account.

    ``last_entered``/``last_completed`` map a member rank to a collective sequence id (0: none seen).
    ``behind`` are members whose last entered id is lower than another member's. ``members_from`` says
    whether membership is torch's exact ``pg_config`` or only the ranks seen using the group.
    """

    name: str
    desc: str
    members: tuple[int, ...]
    members_from: str  # pg_config | entries
    last_entered: Mapping[int, int]
    last_completed: Mapping[int, int]
    pending: Mapping[int, tuple[FREntry, ...]]
    behind: tuple[int, ...]
    no_dump: tuple[int, ...]

    @property
    def kind(self) -> str | None:
        """The layout group kind megatron's description names (``dp_cp``), if any."""
        return MEGATRON_GROUP_KINDS.get(self.desc)


def group_progress(fr: FRDump) -> tuple[GroupProgress, ...]:
    """Every group that some rank recorded an op in, with each member's progress in it."""
    used = sorted({(e.group, e.group_desc) for d in fr.ranks for e in d.entries}, key=lambda g: _name_key(g[0]))
    members = _memberships(fr)
    out = []
    for name, desc in used:
        ranks = members.get(name)
        source = "pg_config"
        if not ranks:
            ranks = tuple(sorted(d.rank for d in fr.ranks if any(e.group == name for e in d.entries)))
            source = "entries"
        entered, completed, pending = {}, {}, {}
        for rank in ranks:
            dump = fr.rank(rank)
            if dump is None:
                continue
            mine = [e for e in dump.entries if e.group == name]
            status = [s for s in dump.status if s.group == name]
            collectives = [e for e in mine if not e.is_p2p]
            entered[rank] = max([e.collective_seq_id for e in collectives]
                                + [s.last_enqueued for s in status] + [0])
            completed[rank] = max([e.collective_seq_id for e in collectives if e.done]
                                  + [s.last_completed for s in status] + [0])
            waiting = tuple(e for e in mine if not e.done)
            if waiting:
                pending[rank] = waiting
        top = max(entered.values(), default=0)
        out.append(GroupProgress(
            name=name, desc=desc, members=ranks, members_from=source, last_entered=entered,
            last_completed=completed, pending=pending,
            behind=tuple(r for r in ranks if r in entered and entered[r] < top),
            no_dump=tuple(r for r in ranks if r not in entered),
        ))
    return tuple(out)


def _memberships(fr: FRDump) -> dict[str, tuple[int, ...]]:
    return {name: g.ranks for name, g in _recorded_groups(fr).items()}


def _recorded_groups(fr: FRDump) -> dict[str, FRGroup]:
    """Group name -> the first dump's record of it that has members (conflicts: see ``_conflicts``)."""
    out: dict[str, FRGroup] = {}
    for dump in fr.ranks:
        for g in dump.groups:
            if g.ranks:
                out.setdefault(g.name, g)
    return out


def _conflicts(fr: FRDump) -> list[str]:
    """Ranks whose dumps disagree on a group's members: the groups were not built alike."""
    seen: dict[str, tuple[int, tuple[int, ...]]] = {}
    lines = []
    for dump in fr.ranks:
        for g in dump.groups:
            if not g.ranks:
                continue
            first = seen.setdefault(g.name, (dump.rank, g.ranks))
            if first[1] != g.ranks:
                lines.append(f"FR group {g.name} ({g.desc}) has members {list(first[1])} in rank {first[0]}'s "
                             f"dump but {list(g.ranks)} in rank {dump.rank}'s")
    return lines


# ---------------------------------------------------------------- correlation with the stacks

# Stack op -> the recorder ops it issues.
_STACK_TO_FR_OPS = {
    "all_gather_object": {"all_gather"},
    "gather_object": {"gather", "all_gather"},
    "broadcast_object_list": {"broadcast"},
    "scatter_object_list": {"scatter", "broadcast"},
    "send_object_list": {"send"},
    "recv_object_list": {"recv"},
    "isend": {"send"},
    "irecv": {"recv"},
    "all_reduce_coalesced": {"allreduce_coalesced", "all_reduce"},
    "monitored_barrier": {"barrier", "send", "recv"},
}
MAX_LINES = 20


def ops_match(stack_op: str, fr_op: str) -> bool:
    return fr_op == stack_op or fr_op in _STACK_TO_FR_OPS.get(stack_op, ())


def correlate(report: Report, fr: FRDump) -> dict[str, Any]:
    """The recorder's view next to the diagnosis: a JSON-able dict for ``Report.extra["flight_recorder"]``.

    ``lines`` holds the same story in plain words for the console.
    """
    progress = group_progress(fr)
    disagreements = _conflicts(fr) + _layout_conflicts(report, _recorded_groups(fr).values())
    matched = []
    for m in report.mismatches:
        view, lines = _match_mismatch(m, progress)
        matched.append(view)
        disagreements += lines
    rank_lines, notes = _rank_checks(report, fr)
    disagreements += rank_lines
    dumped = [d.rank for d in fr.ranks]
    missing = [r for r in range(report.world_size or 0) if r not in dumped]
    if missing:
        notes.append(f"no Flight Recorder dump for rank(s) {_ranks_text(missing)}")
    return {
        "source": fr.source,
        "version": next((d.version for d in fr.ranks if d.version), ""),
        "ranks": dumped,
        "missing_ranks": missing,
        "groups": [_group_dict(g) for g in progress],
        "mismatches": matched,
        "disagreements": disagreements,
        "notes": notes,
        "lines": _lines(fr, progress, matched, disagreements, notes),
    }


def _match_mismatch(m, progress: Iterable[GroupProgress]) -> tuple[dict[str, Any], list[str]]:
    """Find the recorder's group for a mismatch of the diagnosis, and compare who entered it."""
    view: dict[str, Any] = {"op": m.op, "group": m.group, "members": list(m.members),
                            "entered": list(m.entered), "absent": list(m.absent), "fr_group": None}
    candidates = [g for g in progress
                  if any(ops_match(m.op, e.op) for r in m.entered for e in g.pending.get(r, ()))]
    if not candidates:
        return view, [f"stacks say rank(s) {_ranks_text(m.entered)} wait in {m.op} ({m.group} "
                      f"{list(m.members)}); FR has no pending {m.op} for them"]
    g = sorted(candidates, key=lambda c: (c.kind != m.group, set(c.members) != set(m.members),
                                          _name_key(c.name)))[0]
    seq = max(e.collective_seq_id for r in m.entered for e in g.pending.get(r, ()) if ops_match(m.op, e.op))
    fr_entered = [r for r in g.members if r in g.last_entered and g.last_entered[r] >= seq]
    fr_absent = [r for r in g.members if r in g.last_entered and g.last_entered[r] < seq]
    agrees = (set(g.members) == set(m.members) and fr_entered == list(m.entered)
              and fr_absent == list(m.absent))
    view.update({"fr_group": g.name, "fr_desc": g.desc, "fr_members": list(g.members),
                 "fr_members_from": g.members_from, "seq": seq, "fr_entered": fr_entered,
                 "fr_absent": fr_absent, "agrees": agrees})
    lines = []
    if set(g.members) != set(m.members):
        lines.append(f"FR group {g.name} ({g.desc}) has members {list(g.members)}; the layout's {m.group} "
                     f"group is {list(m.members)}")
    if fr_entered != list(m.entered) or fr_absent != list(m.absent):
        lines.append(f"FR says {m.op} #{seq} in group {g.name} ({g.desc}) was entered by {fr_entered} and "
                     f"not by {fr_absent}; stacks say entered {list(m.entered)}, absent {list(m.absent)}")
    return view, lines


def _layout_conflicts(report: Report, groups: Iterable[FRGroup]) -> list[str]:
    """Megatron groups whose recorded members differ from the layout's: one line per group kind."""
    layout = _layout(report)
    if layout is None:
        return []
    groups = sorted(groups, key=lambda g: _name_key(g.name))
    top = max((max(g.ranks) for g in groups), default=-1)
    if top >= layout.world_size:
        return [f"FR groups hold rank {top}, outside the layout's world of {layout.world_size}"]
    wrong: dict[str, list[FRGroup]] = {}
    for g in groups:
        kind = MEGATRON_GROUP_KINDS.get(g.desc)
        if kind is not None and tuple(layout.group_of(kind, g.ranks[0])) != g.ranks:
            wrong.setdefault(kind, []).append(g)
    lines = []
    for kind, bad in wrong.items():
        descs = ", ".join(sorted({g.desc for g in bad}))
        recorded = " ".join(str(list(r)) for r in sorted({g.ranks for g in bad}))
        ranks = {r for g in bad for r in g.ranks}
        expected = " ".join(str(list(r)) for r in sorted({tuple(layout.group_of(kind, r)) for r in ranks}))
        lines.append(f"FR records the {kind} groups ({descs}) as {recorded}; the layout "
                     f"({_layout_text(layout)}) makes them {expected}")
    return lines


def _layout_text(layout) -> str:
    return " ".join(f"{k}={getattr(layout, k)}" for k in ("tp", "cp", "ep", "dp", "pp"))


def _layout(report: Report):
    if not report.layout:
        return None
    from mtpdiag.layout import LayoutError, ParallelLayout

    keys = ("tp", "cp", "ep", "dp", "pp", "vpp", "etp", "order")
    try:
        return ParallelLayout(**{k: report.layout[k] for k in keys if report.layout.get(k) is not None})
    except (LayoutError, TypeError):
        return None


def _rank_checks(report: Report, fr: FRDump) -> tuple[list[str], list[str]]:
    """Each rank's stack op against its latest pending recorded op."""
    lines: list[str] = []
    notes: list[str] = []
    any_p2p = any(e.is_p2p or e.op in _P2P_OPS for d in fr.ranks for e in d.entries)
    for view in report.ranks:
        dump = fr.rank(view.rank) if view.rank is not None else None
        if dump is None or view.state in ("gone", "unreadable"):
            continue
        pending = [e for e in dump.entries if not e.done]
        latest = max(pending, key=lambda e: e.record_id) if pending else None
        op = view.op
        if op is None:
            if latest is not None:
                lines.append(f"FR says rank {view.rank} waits in {_entry_text(latest)}; stacks say it is in no "
                             f"collective{_at(view.site)}")
        elif op == "wait":
            if latest is None:
                lines.append(f"stacks say rank {view.rank} waits on a Work handle; FR has nothing pending for it")
        elif op in _P2P_OPS or op in ("send_object_list", "recv_object_list"):
            if not any_p2p:
                note = "FR holds no send/recv at all (torch 2.13's gloo does not record point-to-point ops)"
                if note not in notes:
                    notes.append(note)
            elif not any(ops_match(op, e.op) for e in pending):
                lines.append(f"stacks say rank {view.rank} waits in {op}; FR has no pending {op} for it")
        elif latest is None:
            done = [e for e in dump.entries if e.done]
            last = max(done, key=lambda e: e.record_id) if done else None
            what = f"last completed {_entry_text(last)}" if last else "recorded no op"
            lines.append(f"FR says rank {view.rank} {what} and has nothing pending; stacks say it waits in {op}")
        elif not ops_match(op, latest.op):
            lines.append(f"FR says rank {view.rank} waits in {_entry_text(latest)}; stacks say it waits in {op}")
    return lines, notes


# ---------------------------------------------------------------- words and JSON


def _lines(fr: FRDump, progress, matched, disagreements, notes) -> list[str]:
    dumped = [d.rank for d in fr.ranks]
    out = [f"Flight Recorder: {len(dumped)} dump(s), rank(s) {_ranks_text(dumped)}, from {fr.source}"]
    for g in progress:
        if not g.behind and not g.pending:
            continue
        waiting = "; ".join(f"rank {r} waits in {_entry_text(max(es, key=lambda e: e.record_id), group=False)}"
                            for r, es in sorted(g.pending.items()))
        text = f"group {g.name} ({g.desc}, ranks {_ranks_text(g.members)}): {waiting or 'nothing pending'}"
        if g.behind:
            behind = ", ".join(f"{r} (#{g.last_entered[r]})" for r in g.behind)
            text += f"; behind: rank(s) {behind}"
        out.append(text)
    for m in matched:
        if m.get("agrees"):
            out.append(f"FR agrees with the stacks on {m['op']} #{m['seq']} in group {m['fr_group']} "
                       f"({m['fr_desc']}, ranks {_ranks_text(m['fr_members'])}): entered by "
                       f"{_ranks_text(m['fr_entered'])}, never started by {_ranks_text(m['fr_absent'])}")
    shown = disagreements[:MAX_LINES]
    out += [f"disagreement: {d}" for d in shown]
    if len(disagreements) > len(shown):
        out.append(f"... and {len(disagreements) - len(shown)} more disagreement(s) in the JSON")
    out += [f"note: {n}" for n in notes]
    return out


def _group_dict(g: GroupProgress) -> dict[str, Any]:
    return {
        "name": g.name,
        "desc": g.desc,
        "kind": g.kind,
        "members": list(g.members),
        "members_from": g.members_from,
        "last_entered": {str(r): n for r, n in sorted(g.last_entered.items())},
        "last_completed": {str(r): n for r, n in sorted(g.last_completed.items())},
        "pending": {str(r): [_entry_dict(e) for e in es] for r, es in sorted(g.pending.items())},
        "behind": list(g.behind),
        "no_dump": list(g.no_dump),
    }


def _entry_dict(e: FREntry) -> dict[str, Any]:
    return {
        "op": e.op,
        "collective_seq_id": e.collective_seq_id,
        "p2p_seq_id": e.p2p_seq_id,
        "state": e.state,
        "input_sizes": [list(s) for s in e.input_sizes],
        "output_sizes": [list(s) for s in e.output_sizes],
        "site": e.site.to_dict() if e.site else None,
    }


def _entry_text(e: FREntry, group: bool = True) -> str:
    seq = f"p2p #{e.p2p_seq_id}" if e.is_p2p else f"#{e.collective_seq_id}"
    where = f" in group {e.group} ({e.group_desc})" if group else ""
    site = f" from {e.site.function}" if e.site else ""
    return f"{e.op} {seq}{where}{site}"


def _at(site: Site | None) -> str:
    return f" (at {site.function})" if site else ""


def _ranks_text(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"; [] -> "none"."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "none"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def _name_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)
