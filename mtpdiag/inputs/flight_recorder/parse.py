"""One rank's dump, as torch wrote it (pickle or JSON), read into ``FRRankDump`` (pure).

torch writes the same content two ways (FlightRecorderDetail.hpp): ``dump`` pickles IValues (``pg_status``
counters as integers, ``process_group`` as a tuple, missing times as None, ``frames`` per entry) and
``dump_json`` writes JSON (counters as strings, missing times as 0, no ``frames``, no ``entries`` key
when there are none). Both carry ``version``, "major.minor": minor when fields were added, major when
existing ones changed. torch 2.13 writes "2.10"; the releases since 2.4 wrote 2.x versions up to it.
"""

from __future__ import annotations

import json
from typing import Any

from mtpdiag.errors import InputError
from mtpdiag.inputs.flight_recorder.sites import Qualify, call_site, plain, stack_of
from mtpdiag.model import Site, replace
from mtpdiag.model.flight_recorder import FREntry, FRGroup, FRGroupStatus, FRRankDump, as_bool, as_int
from mtpdiag.model.fr_batches import batches
from mtpdiag.model.group_marks import GroupCompleted, group_key
from mtpdiag.vocabulary.profiling_names import parse_profiling_name

KNOWN_MAJOR = 2
NEWEST_KNOWN_MINOR = 10  # torch 2.13 writes "2.10"
# Backends whose work has no events: their entries are never "completed", only retired.
_EVENTLESS = frozenset({"gloo"})


def check_version(version: str, path: str) -> str | None:
    """None for a version this reader knows; a note for one it reads as best it can; InputError for a
    newer major version, whose existing fields may mean something else."""
    major, _, minor = version.partition(".")
    if not (major.isascii() and major.isdigit() and minor.isascii() and minor.isdigit()):
        return f"{path}: unrecognised Flight Recorder version {version!r}, read as {KNOWN_MAJOR}.x"
    if int(major) > KNOWN_MAJOR:
        raise InputError(
            f"{path}: Flight Recorder format {version} is newer than this mtpdiag reads "
            f"({KNOWN_MAJOR}.x); upgrade mtpdiag"
        )
    if int(major) < KNOWN_MAJOR:
        return f"{path}: Flight Recorder format {version} predates torch 2.4; read what could be read"
    if int(minor) > NEWEST_KNOWN_MINOR:
        return (
            f"{path}: Flight Recorder format {version} is newer than {KNOWN_MAJOR}.{NEWEST_KNOWN_MINOR}; "
            "fields added since were ignored"
        )
    return None


# raw frames (filename, name, line triples) -> (stack, call site); shared across ranks
StackCache = dict[tuple[Any, ...], tuple[tuple[Site, ...], Site | None]]


def rank_dump(
    data: Any, rank: int, path: str, fmt: str = "pickle", qualify: Qualify = plain, stacks: StackCache | None = None
) -> FRRankDump:
    """A dump's dict (``pickle.loads`` or ``json.loads`` of what torch wrote) as an ``FRRankDump``.

    Raises ``ValueError``/``TypeError``/``KeyError`` for content that is not a dump (the loader turns
    them into one-line input errors) and ``InputError`` for a newer major version. ``stacks`` caches the
    reading of each distinct stack: a job's ranks repeat a few stacks thousands of times.
    """
    stacks = {} if stacks is None else stacks
    if not isinstance(data, dict):
        raise ValueError("expected a dict")
    if "entries" not in data and "pg_config" not in data:
        raise ValueError("expected 'entries' or 'pg_config'")
    version = str(data.get("version", ""))
    notes = [n for n in (check_version(version, path),) if n]
    groups = tuple(_group(name, cfg) for name, cfg in _dict(data.get("pg_config")).items() if name)
    by_name = {g.name: g for g in groups}
    raw = data.get("entries") or []
    if not isinstance(raw, (list, tuple)):
        raise TypeError("'entries' is not a list")
    entries = [_entry(e, by_name, qualify, stacks) for e in raw]
    entries = _close_batches(entries)
    group_of_pg = {e.pg_id: e.group for e in entries if e.pg_id >= 0}
    status = tuple(
        _status(pg_id, s, group_of_pg)
        for pg_id, s in sorted(_dict(data.get("pg_status")).items(), key=lambda kv: str(kv[0]))
    )
    return FRRankDump(
        rank=rank,
        path=path,
        version=version,
        groups=groups,
        entries=tuple(entries),
        status=status,
        format=fmt,
        notes=tuple(notes),
    )


def _group(name: Any, cfg: Any) -> FRGroup:
    if not isinstance(cfg, dict):
        raise TypeError(f"pg_config[{name!r}] is not a dict")
    ranks = cfg.get("ranks", [])
    if isinstance(ranks, str):  # torch writes the list as its string form, "[2, 3]" (ranks_str)
        ranks = json.loads(ranks) if ranks.strip() else []
    if not isinstance(ranks, (list, tuple)):
        raise TypeError(f"pg_config[{name!r}] ranks is not a list")
    order = tuple(as_int(r) for r in ranks)
    ranks_sorted = tuple(sorted(order))
    return FRGroup(
        name=str(name), desc=str(cfg.get("desc", "")), ranks=ranks_sorted, order=order if order != ranks_sorted else ()
    )


def _stack(frames: Any, qualify: Qualify, stacks: StackCache) -> tuple[tuple[Site, ...], Site | None]:
    if not frames:
        return (), None
    if not isinstance(frames, (list, tuple)):
        raise TypeError("frames is not a list")
    raw_key = tuple((f.get("filename"), f.get("name"), f.get("line")) if isinstance(f, dict) else f for f in frames)
    key: tuple[Any, ...] | None = raw_key
    try:
        hit = stacks.get(raw_key)
    except TypeError:  # an unhashable value where a frame field should be: let stack_of say what is wrong
        hit, key = None, None
    if hit is None:
        stack = stack_of(frames, qualify)
        hit = (stack, call_site(stack))
        if key is not None:
            stacks[key] = hit
    return hit


def _entry(e: Any, groups: dict[str, FRGroup], qualify: Qualify, stacks: StackCache) -> FREntry:
    if not isinstance(e, dict):
        raise TypeError("an entry is not a dict")
    pg = e["process_group"]
    if not isinstance(pg, (list, tuple)) or len(pg) < 2:
        raise TypeError("process_group is not a (name, desc) pair")
    group, desc = str(pg[0]), str(pg[1])
    name = e.get("profiling_name", "")
    if not isinstance(name, str):
        raise TypeError("profiling_name is not a string")
    parsed = parse_profiling_name(name)
    is_p2p = e.get("is_p2p")
    is_p2p = parsed.is_p2p if is_p2p is None else as_bool(is_p2p)
    state = str(e.get("state", "scheduled"))
    retired = as_bool(e.get("retired", False))
    eventless = parsed.backend in _EVENTLESS
    timed_out = retired and state != "completed" and not eventless
    stack, site = _stack(e.get("frames"), qualify, stacks)
    info = groups.get(group)
    src, dst = _global(parsed.src, info, desc), _global(parsed.dst, info, desc)
    duration = e.get("duration_ms")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))):
        raise TypeError("duration_ms is not a number")
    timeout = e.get("timeout_ms")
    return FREntry(
        record_id=as_int(e.get("record_id", 0)),
        group=group,
        group_desc=desc,
        op=parsed.op,
        profiling_name=name,
        collective_seq_id=as_int(e.get("collective_seq_id", e.get("seq_id", 0))),
        p2p_seq_id=as_int(e.get("p2p_seq_id", 0)),
        is_p2p=is_p2p,
        state=state,
        done=state == "completed" or (retired and eventless),
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        site=site,
        pg_id=as_int(e.get("pg_id", -1)),
        op_id=as_int(e.get("op_id", 0)),
        input_dtypes=_strings(e.get("input_dtypes")),
        output_dtypes=_strings(e.get("output_dtypes")),
        time_created_ns=as_int(e.get("time_created_ns", 0)),
        timeout_ms=None if timeout is None else as_int(timeout),
        duration_ms=None if duration is None else float(duration),
        retired=retired,
        timed_out=timed_out,
        backend=parsed.backend,
        src=src,
        dst=dst,
        frames=stack,
    )


def _global(local: int | None, group: FRGroup | None, desc: str) -> int | None:
    """A send/recv end (group-local rank) as a global rank: through the group's ``pg_config`` ranks."""
    if local is None:
        return None
    if group is not None and group.ranks:
        return group.global_rank(local)
    return local if desc == "default_pg" else None


def _close_batches(entries: list[FREntry]) -> list[FREntry]:
    """Give the parts of each batch their closing entry's state: they have no events of their own
    (ProcessGroupNCCL records them with null events; only the coalesced work is watched)."""
    by_group: dict[str, list[FREntry]] = {}
    for e in sorted(entries, key=lambda e: e.record_id):
        by_group.setdefault(e.group, []).append(e)
    closed: dict[int, FREntry] = {}
    for group_entries in by_group.values():
        for batch in batches(group_entries):
            if len(batch) < 2:
                continue
            closer = batch[-1]
            for part in batch[:-1]:
                closed[id(part)] = replace(
                    part,
                    state=closer.state,
                    done=closer.done,
                    retired=closer.retired,
                    timed_out=closer.timed_out,
                    in_batch=True,
                )
    return [closed.get(id(e), e) for e in entries]


def _status(pg_id: Any, s: Any, group_of_pg: dict[int, str]) -> FRGroupStatus:
    if not isinstance(s, dict):
        raise TypeError(f"pg_status[{pg_id!r}] is not a dict")
    pid = _counter(pg_id)
    return FRGroupStatus(
        group=group_of_pg.get(pid, ""),
        pg_id=pid,
        last_enqueued=_counter(s.get("last_enqueued_collective", -1)),
        last_started=_counter(s.get("last_started_collective", -1)),
        last_completed=_counter(s.get("last_completed_collective", -1)),
    )


def groups_completed(data: Any, rank: int, dump_time: float) -> tuple[GroupCompleted, ...]:
    """Each group's last completed op in a dump's dict (``pg_status``), keyed by the group's name and ranks
    (``model.group_marks``) and dated by when it completed: its entry's ``time_discovered_completed_ns``, or
    ``dump_time`` (the file's mtime) where the dump has no such entry (gloo records none; an entry can be
    overwritten). Only ``pg_status``, ``pg_config`` and the entries' ids and times are read."""
    if not isinstance(data, dict):
        raise ValueError("expected a dict")
    config = _dict(data.get("pg_config"))
    last: dict[int, dict[Any, Any]] = {}  # pg id -> its newest entry (the name), and its newest completed one
    done: dict[int, dict[Any, Any]] = {}
    for e in data.get("entries") or ():
        pid = _pg_id_of(e)
        if pid is not None:
            last[pid] = e
            if e.get("state") == "completed":
                done[pid] = e
    out = []
    for pg_id, s in _dict(data.get("pg_status")).items():
        if not isinstance(s, dict):
            raise TypeError(f"pg_status[{pg_id!r}] is not a dict")
        pid, seq = _counter(pg_id), _counter(s.get("last_completed_collective", -1))
        entry = done.get(pid)
        if entry is not None and _seq_of(entry) != seq:
            entry = None  # not the op the counter names
        named = last.get(pid)
        pg = named.get("process_group") if named is not None else None
        name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else ""
        cfg = config.get(name)
        ranks = _group(name, cfg).ranks if isinstance(cfg, dict) else ()
        p2p = entry is not None and entry.get("is_p2p") is True
        out.append(GroupCompleted(group_key(name, ranks, rank, pid, p2p), seq, _completed_at(entry, dump_time)))
    return tuple(out)


def _pg_id_of(entry: Any) -> int | None:
    """An entry's pg id (an integer in the pickle, a string in the JSON form), None when it has none."""
    try:
        return _counter(entry.get("pg_id")) if isinstance(entry, dict) else None
    except (TypeError, ValueError):
        return None


def _seq_of(entry: dict[Any, Any]) -> int:
    """The number ``pg_status`` gives an entry's op: its p2p sequence number for a send/recv, else its
    collective sequence number."""
    return _counter(entry.get("p2p_seq_id" if entry.get("is_p2p") is True else "collective_seq_id", -2))


def _completed_at(entry: dict[Any, Any] | None, dump_time: float) -> float:
    """When the entry's op completed (s), never after the dump was written; the dump's time without one."""
    raw = entry.get("time_discovered_completed_ns") if entry is not None else None
    ns = _counter(raw) if isinstance(raw, (int, str)) and not isinstance(raw, bool) else 0
    return min(ns / 1e9, dump_time) if ns > 0 else dump_time


def _counter(value: Any) -> int:
    """An integer, or the decimal string the JSON form writes for one ("-1", "12")."""
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text.startswith("-") else text
        if 0 < len(digits) <= 19 and digits.isascii() and digits.isdigit():
            return int(text)
        raise ValueError(f"not a counter: {value[:20]!r}")
    return as_int(value)


def _dict(value: Any) -> dict[Any, Any]:  # a raw dump's mapping: keys and values as torch wrote them
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"expected a dict, got {type(value).__name__}")
    return value


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise TypeError("sizes are not a list")
    out = []
    for s in value:
        if not isinstance(s, (list, tuple)):
            raise TypeError("a size is not a list")
        out.append(tuple(as_int(x) for x in s))
    return tuple(out)


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise TypeError("dtypes are not a list")
    return tuple(str(x) for x in value)
