"""The Flight Recorder's data as mtpdiag keeps it: typed, frozen, JSON-able without torch.

``FRDump.to_dict`` is what a bundle carries: per rank the version, the groups (``pg_config``), torch's
progress counters (``pg_status``) and the entries with their sizes, dtypes, states and call stacks.
Nothing else of the dump is kept (no thread names or ids, no ``nccl_comm_state``, no environment).
A rank's distinct stacks are stored once and referred to by index: a rank repeats a few stacks
thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mtpdiag.model.fields import SchemaError
from mtpdiag.model.frames import Site

FR_SCHEMA = "mtpdiag.fr/1"


@dataclass(frozen=True)
class FRGroup:
    """A process group as one rank's ``pg_config`` describes it. ``ranks`` is empty when unrecorded.

    ``ranks`` is sorted; ``order`` is the recorded order (group rank i is ``order[i]``), kept only when
    it differs from ``ranks``.
    """

    name: str
    desc: str
    ranks: tuple[int, ...]
    order: tuple[int, ...] = ()

    def global_rank(self, local: int | None) -> int | None:
        """The global rank of group rank ``local`` (what ``nccl:send 1->0`` names), if known."""
        ranks = self.order or self.ranks
        if local is None or not 0 <= local < len(ranks):
            return None
        return ranks[local]


@dataclass(frozen=True)
class FREntry:
    """One recorded op, as torch's writer fills it (FlightRecorderDetail.hpp ``getCollectiveTrace``).

    ``state`` is torch's (scheduled | started | completed) except for the parts of a batch, which have
    no events of their own and take their closing entry's state (``in_batch``). ``done``: completed, or
    retired by a backend without events (gloo). ``timed_out``: retired by NCCL's watchdog before its end
    event fired (torch: "a retired but not completed event has timed out"). ``src``/``dst`` are the global
    ranks of a send/recv. ``frames`` is the Python stack when it was issued, innermost first; ``site`` is
    the first of them outside torch and decorator plumbing.
    """

    record_id: int
    group: str
    group_desc: str
    op: str
    profiling_name: str
    collective_seq_id: int
    p2p_seq_id: int
    is_p2p: bool
    state: str
    done: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    site: Site | None
    pg_id: int = -1
    op_id: int = 0
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    time_created_ns: int = 0
    timeout_ms: int | None = None
    duration_ms: float | None = None
    retired: bool = False
    timed_out: bool = False
    backend: str = ""
    src: int | None = None
    dst: int | None = None
    in_batch: bool = False
    frames: tuple[Site, ...] = ()

    @property
    def seq(self) -> int:
        """The sequence number this entry is matched by: ``p2p_seq_id`` for send/recv, else collective."""
        return self.p2p_seq_id if self.is_p2p else self.collective_seq_id

    @property
    def input_numel(self) -> int:
        return sum(_numel(s) for s in self.input_sizes)

    @property
    def output_numel(self) -> int:
        return sum(_numel(s) for s in self.output_sizes)


@dataclass(frozen=True)
class FRGroupStatus:
    """torch's per-group counters (``pg_status``); they survive the ring buffer dropping entries.

    ``group`` is the group name when an entry of the same ``pg_id`` names it, else "".
    -1 means none (torch's value before the first op, and for "started" without timing).
    """

    group: str
    last_enqueued: int
    last_completed: int
    last_started: int = -1
    pg_id: int = -1


@dataclass(frozen=True)
class FRRankDump:
    """One rank's dump. ``notes`` say what could not be read fully (an unknown minor version)."""

    rank: int
    path: str
    version: str
    groups: tuple[FRGroup, ...]
    entries: tuple[FREntry, ...]
    status: tuple[FRGroupStatus, ...] = ()
    format: str = "pickle"  # pickle | json | bundle
    notes: tuple[str, ...] = ()

    def group(self, name: str) -> FRGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        stacks: dict[tuple[Site, ...], int] = {}
        for e in self.entries:
            stacks.setdefault(e.frames, len(stacks))
        return {
            "rank": self.rank,
            "path": self.path,
            "version": self.version,
            "format": self.format,
            "notes": list(self.notes),
            "groups": [_group_dict(g) for g in self.groups],
            "status": [{"group": s.group, "pg_id": s.pg_id, "last_enqueued": s.last_enqueued,
                        "last_started": s.last_started, "last_completed": s.last_completed} for s in self.status],
            "stacks": [[[f.file, f.line, f.function] for f in stack] for stack in stacks],
            "entries": [_entry_dict(e, stacks[e.frames]) for e in self.entries],
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "FRRankDump":
        try:
            stacks = [tuple(Site(file=str(f), line=as_int(n), function=str(fn)) for f, n, fn in s)
                      for s in _list(d.get("stacks"))]
            return FRRankDump(
                rank=as_int(d["rank"]),
                path=str(d.get("path", "")),
                version=str(d.get("version", "")),
                format="bundle",
                notes=tuple(str(n) for n in _list(d.get("notes"))),
                groups=tuple(_group_from(g) for g in _list(d.get("groups"))),
                status=tuple(FRGroupStatus(group=str(s["group"]), pg_id=as_int(s.get("pg_id", -1)),
                                           last_enqueued=as_int(s["last_enqueued"]),
                                           last_started=as_int(s.get("last_started", -1)),
                                           last_completed=as_int(s["last_completed"]))
                             for s in _list(d.get("status"))),
                entries=tuple(_entry_from(e, stacks) for e in _list(d["entries"])),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise SchemaError(f"not a Flight Recorder rank dump ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class FRDump:
    """Every rank's dump of one job, sorted by rank. ``missing`` lists ranks whose dump was expected
    (a member of some recorded group) but not found; ``notes`` what the loader wants said."""

    source: str
    ranks: tuple[FRRankDump, ...]
    missing: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def rank(self, rank: int) -> FRRankDump | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    @property
    def version(self) -> str:
        return next((d.version for d in self.ranks if d.version), "")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": FR_SCHEMA, "source": self.source, "missing": list(self.missing),
                "notes": list(self.notes), "ranks": [d.to_dict() for d in self.ranks]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "FRDump":
        if not isinstance(d, Mapping) or d.get("schema") != FR_SCHEMA:
            raise SchemaError(f"not a {FR_SCHEMA} document")
        try:
            ranks = tuple(sorted((FRRankDump.from_dict(r) for r in _list(d["ranks"])), key=lambda r: r.rank))
            return FRDump(source=str(d.get("source", "")), ranks=ranks,
                          missing=tuple(as_int(r) for r in _list(d.get("missing"))),
                          notes=tuple(str(n) for n in _list(d.get("notes"))))
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"not a Flight Recorder dump ({type(exc).__name__}: {exc})") from None


def expected_ranks(ranks: tuple[FRRankDump, ...]) -> tuple[int, ...]:
    """Every rank some dump names as a group member (the job's ranks, as far as the dumps know)."""
    return tuple(sorted({r for d in ranks for g in d.groups for r in g.ranks} | {d.rank for d in ranks}))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _group_dict(g: FRGroup) -> dict[str, Any]:
    out: dict[str, Any] = {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)}
    if g.order:
        out["order"] = list(g.order)
    return out


def _group_from(d: Mapping[str, Any]) -> FRGroup:
    return FRGroup(name=str(d["name"]), desc=str(d.get("desc", "")),
                   ranks=tuple(sorted(as_int(r) for r in _list(d["ranks"]))),
                   order=tuple(as_int(r) for r in _list(d.get("order"))))


_ENTRY_KEYS = ("record_id", "group", "group_desc", "op", "profiling_name", "collective_seq_id", "p2p_seq_id",
               "is_p2p", "state", "done", "pg_id", "op_id", "time_created_ns", "timeout_ms", "duration_ms",
               "retired", "timed_out", "backend", "src", "dst", "in_batch")


def _entry_dict(e: FREntry, stack: int) -> dict[str, Any]:
    out = {k: getattr(e, k) for k in _ENTRY_KEYS}
    out.update({
        "input_sizes": [list(s) for s in e.input_sizes],
        "output_sizes": [list(s) for s in e.output_sizes],
        "input_dtypes": list(e.input_dtypes),
        "output_dtypes": list(e.output_dtypes),
        "site": e.site.to_dict() if e.site else None,
        "stack": stack,
    })
    return out


def _entry_from(d: Mapping[str, Any], stacks: list[tuple[Site, ...]]) -> FREntry:
    site = d.get("site")
    duration = d.get("duration_ms")
    return FREntry(
        record_id=as_int(d["record_id"]), group=str(d["group"]), group_desc=str(d.get("group_desc", "")),
        op=str(d["op"]), profiling_name=str(d.get("profiling_name", "")),
        collective_seq_id=as_int(d["collective_seq_id"]), p2p_seq_id=as_int(d["p2p_seq_id"]),
        is_p2p=as_bool(d["is_p2p"]), state=str(d["state"]), done=as_bool(d["done"]),
        input_sizes=_sizes(d.get("input_sizes")), output_sizes=_sizes(d.get("output_sizes")),
        site=Site.from_dict(site) if site is not None else None,
        pg_id=as_int(d.get("pg_id", -1)), op_id=as_int(d.get("op_id", 0)),
        input_dtypes=tuple(str(x) for x in _list(d.get("input_dtypes"))),
        output_dtypes=tuple(str(x) for x in _list(d.get("output_dtypes"))),
        time_created_ns=as_int(d.get("time_created_ns", 0)),
        timeout_ms=None if d.get("timeout_ms") is None else as_int(d["timeout_ms"]),
        duration_ms=None if duration is None else float(duration),
        retired=as_bool(d.get("retired", False)), timed_out=as_bool(d.get("timed_out", False)),
        backend=str(d.get("backend", "")),
        src=None if d.get("src") is None else as_int(d["src"]),
        dst=None if d.get("dst") is None else as_int(d["dst"]),
        in_batch=as_bool(d.get("in_batch", False)),
        frames=stacks[as_int(d["stack"])] if "stack" in d else (),
    )


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(as_int(x) for x in _list(s)) for s in _list(value))


def _list(value: Any) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return list(value)


def as_int(value: Any) -> int:
    """``value`` if it is an int (not a bool), else TypeError: torch writes every number as an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value
