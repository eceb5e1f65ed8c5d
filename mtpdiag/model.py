"""The data that flows through mtpdiag: captures in, reports out.

Frozen dataclasses with versioned JSON (de)serialization and no other I/O. Capture code builds
``Snapshot``s; analysis turns a ``Snapshot`` (plus an optional layout) into a ``Report``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

BUNDLE_SCHEMA = "mtpdiag.bundle/1"
REPORT_SCHEMA = "mtpdiag.report/1"

# Environment keys of a target process that may be read. Nothing else from the environment is kept.
ENV_WHITELIST = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WG_PREFIX",
    "RAY_LOCAL_WORLD_SIZE",
    # Where torch writes the Flight Recorder dumps, and its pipe for a live dump (flight_recorder.locate).
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)

# Process states (from /proc/PID/stat, or how the capture went).
STATE_RUNNING = "R"
STATE_SLEEPING = "S"
STATE_DISK = "D"
STATE_STOPPED = "T"
STATE_ZOMBIE = "Z"


class SchemaError(ValueError):
    """A document that is not a valid mtpdiag bundle or report."""


def printable(text: str) -> str:
    """``text`` with control, bidi-override and other unprintable characters replaced (whitespace by a space).

    Function names, paths, thread names and errors come from other processes and from files someone handed
    over. Printed raw, an escape sequence could retitle or clear the reader's terminal, and a bidi override
    could reorder what the reader sees.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else " " if ch.isspace() else "\ufffd" for ch in text)


def decimal(text: str | None, max_digits: int = 9) -> int | None:
    """The value of an env number such as ``RANK=3``: at most ``max_digits`` ASCII digits, else None.

    ``str.isdigit`` accepts "²" and 5000-digit strings, which ``int()`` then refuses.
    """
    text = (text or "").strip()
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


# Every rank of a job carries the same WORLD_SIZE text: parse each distinct text once.
_env_number = functools.lru_cache(maxsize=256)(decimal)


def world_sizes(captures: Iterable[RankCapture]) -> list[int]:
    """The distinct WORLD_SIZEs some captures carry, smallest first (more than one is a conflict)."""
    return sorted({c.world_size for c in captures} - {None, 0})


def who_and_why(item: Any) -> str:
    """``rank 3: <error>`` (``pid 812: ...`` without a rank) for a capture or a view that was not read."""
    who = f"rank {item.rank}" if item.rank is not None else f"pid {item.pid}"
    return f"{who}: {item.error or item.state}"


class _computed_once:  # noqa: N801 - used as a decorator, like functools.cached_property
    """``functools.cached_property`` without its per-instance lock (Python 3.11 takes one on every first
    read, which cost more than the value itself over 16k captures). The value lands in the instance's
    ``__dict__``, so later reads never reach this descriptor."""

    def __init__(self, compute: Any) -> None:
        self.compute = compute
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


@dataclass(frozen=True)
class Frame:
    """One frame. ``file`` is a display path (site-packages-relative where possible).

    ``native`` marks a C/C++ frame (py-spy ``--native``, pystack ``--native``): evidence of what a rank
    waits on (``cudaStreamSynchronize``, ``futex``), never its call site.
    """

    function: str
    file: str
    line: int
    # Whitelisted integer arguments of torch.distributed frames (dst, src, group_dst, group_src, tag).
    args: tuple[tuple[str, int], ...] = ()
    native: bool = False

    def arg(self, name: str) -> int | None:
        for key, value in self.args:
            if key == name:
                return value
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "function": self.function}
        if self.args:
            out["args"] = dict(self.args)
        if self.native:
            out["native"] = True
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Frame":
        args = d.get("args") or {}
        if not isinstance(args, Mapping):
            raise SchemaError("frame args must be an object")
        native = d.get("native", False)
        if type(native) is not bool:
            raise SchemaError("field 'native' must be a boolean")
        return Frame(
            function=_str(d, "function"),
            file=_str(d, "file"),
            line=_int(d, "line"),
            args=tuple(sorted((str(k), _int(args, k)) for k in args)),
            native=native,
        )

    @staticmethod
    def from_dict_shared(d: Mapping[str, Any], seen: dict) -> "Frame":
        """``from_dict``, returning the Frame already read for an identical dict (same values, same
        types): the ranks of a big job share a few stacks, so this saves time and memory."""
        if not isinstance(d, dict):
            return Frame.from_dict(_obj(d))
        args = d.get("args")
        line = d.get("line")
        try:
            native = d.get("native")
            key = (d.get("function"), d.get("file"), line, type(line),
                   tuple(args.items()) if type(args) is dict else args, native, type(native))
            return seen[key]
        except TypeError:  # unhashable values: let from_dict say what is wrong
            return Frame.from_dict(d)
        except KeyError:
            frame = seen[key] = Frame.from_dict(d)
            return frame


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack, innermost frame first."""

    thread_id: int
    name: str
    frames: tuple[Frame, ...]
    native_id: int | None = None
    active: bool | None = None
    # What the innermost Python frame's source line calls, from a short list (``item``, ``synchronize``,
    # ``acquire``, ...): read from the target's own file at capture time. The line itself is never kept.
    calls: tuple[str, ...] = ()
    # A hash of every frame's local variables as py-spy showed them, for ``watch``: a loop that came back to
    # the same line has new locals. Live captures only; never written anywhere.
    locals_key: int | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": self.thread_id,
            "name": self.name,
            "native_id": self.native_id,
            "active": self.active,
            "frames": [f.to_dict() for f in self.frames],
        }
        if self.calls:
            out["calls"] = list(self.calls)
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any], seen_frames: dict | None = None) -> "ThreadStack":
        """``seen_frames`` is shared by the reader of many captures: equal stacks become one tuple."""
        frames = d.get("frames")
        if type(frames) is not list:
            raise SchemaError("thread frames must be a list")
        # Type checks inline rather than through _int/_opt_int/printable: this runs once per rank.
        thread_id, name, native_id, active = d.get("thread_id"), d.get("name") or "", d.get("native_id"), \
            d.get("active")
        calls = d.get("calls")
        return ThreadStack(
            thread_id=thread_id if type(thread_id) is int else _int(d, "thread_id"),
            name=name if type(name) is str and name.isprintable() else printable(str(name)),
            native_id=native_id if native_id is None or type(native_id) is int else _opt_int(d, "native_id"),
            active=active if type(active) is bool else None,
            frames=_shared_frames(frames, {} if seen_frames is None else seen_frames),
            calls=() if calls is None else _call_names(calls),
        )


def _call_names(calls: Any) -> tuple[str, ...]:
    if type(calls) is not list or not all(type(c) is str and c.isidentifier() for c in calls):
        raise SchemaError("thread calls must be a list of names")
    return tuple(calls)


def _shared_frames(frames: list, seen: dict) -> tuple[Frame, ...]:
    """The Frames of a frames list, as the very tuple read before for an equal list.

    The ranks of a big job share a handful of stacks. Keying the whole list (its values and the type
    of each line, so ``true`` is never taken for ``1``) costs about a microsecond, and every rank
    after the first with that stack skips the validation of its frames; the analysis then meets the
    same tuple object again and again. Anything unusual takes the frame-by-frame path.
    """
    try:
        key = tuple([(f["function"], f["file"], f["line"], type(f["line"]),
                      _args_key(f["args"]) if len(f) > 3 and "args" in f else None,
                      _native_key(f["native"]) if len(f) > 3 and "native" in f else None) for f in frames])
        shared = seen.get(key)
    except (KeyError, TypeError, AttributeError):
        return tuple(Frame.from_dict_shared(f, seen) for f in frames)
    if shared is None:
        shared = seen[key] = tuple(Frame.from_dict_shared(f, seen) for f in frames)
    return shared


def _native_key(native: Any) -> bool:
    if type(native) is not bool:
        raise TypeError("frame native flag is not a boolean")
    return native


def _args_key(args: Any) -> tuple:
    if type(args) is not dict:
        raise TypeError("frame args are not an object")
    return tuple((k, v, type(v)) for k, v in args.items())


@dataclass(frozen=True)
class RankCapture:
    """What was captured of one worker process.

    ``env`` holds whitelisted keys only. ``state`` is the /proc state letter (R, S, D, T, Z, ...)
    or ``"gone"``/``"unreadable"`` when the process could not be read. ``error`` says why a capture
    is missing or partial. ``main_cpu_ticks`` is the main thread's utime+stime (for ``watch``).
    ``layout_hints`` are parallel sizes read from the command lines of the process and its
    ancestors (never the command lines themselves).
    """

    pid: int | None
    host: str
    rank: int | None
    state: str
    threads: tuple[ThreadStack, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    nonblocking: bool = False
    main_cpu_ticks: int | None = None
    layout_hints: tuple[tuple[str, int], ...] = ()
    source: str | None = None  # file the capture was read from, for analyze
    # What /proc said of the main thread just before the dump: the system call it sits in (``futex``,
    # ``clock_nanosleep``, ``read``; ``running`` when on the CPU) and whether the process maps CUDA/NCCL.
    main_syscall: str | None = None
    cuda: bool | None = None

    @_computed_once
    def world_size(self) -> int | None:
        """WORLD_SIZE, else SLURM_NTASKS, from the environment (None if neither is a number)."""
        slurm = None
        for key, value in self.env:
            if key == "WORLD_SIZE":
                size = _env_number(value)
                if size is not None:
                    return size
            elif key == "SLURM_NTASKS":
                slurm = value
        return _env_number(slurm)

    @property
    def main_thread(self) -> ThreadStack | None:
        """The thread whose native id equals the pid, else the one named MainThread, else the first."""
        for t in self.threads:
            if self.pid is not None and t.native_id == self.pid:
                return t
        for t in self.threads:
            if t.name == "MainThread":
                return t
        return self.threads[0] if self.threads else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "host": self.host,
            "rank": self.rank,
            "state": self.state,
            "env": dict(self.env),
            "error": self.error,
            "nonblocking": self.nonblocking,
            "main_cpu_ticks": self.main_cpu_ticks,
            "layout_hints": dict(self.layout_hints),
            "source": self.source,
            "main_syscall": self.main_syscall,
            "cuda": self.cuda,
            "threads": [t.to_dict() for t in self.threads],
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any], seen_frames: dict | None = None) -> "RankCapture":
        """``seen_frames``: see ``ThreadStack.from_dict``; it also shares the ranks' equal layout hints."""
        get = d.get
        env, hints, threads = get("env") or {}, get("layout_hints") or {}, get("threads") or []
        if not isinstance(env, Mapping) or not isinstance(hints, Mapping) or type(threads) is not list:
            raise SchemaError("capture env, layout_hints and threads have the wrong type")
        seen = {} if seen_frames is None else seen_frames
        # Type checks inline rather than through _opt_int/printable: this runs once per rank.
        pid, host, state, error, source, ticks = (get("pid"), get("host") or "unknown", get("state") or "unreadable",
                                                  get("error"), get("source"), get("main_cpu_ticks"))
        return RankCapture(
            pid=pid if pid is None or type(pid) is int else _opt_int(d, "pid"),
            host=host if type(host) is str and host.isprintable() else printable(str(host)),
            rank=_opt_rank(d),
            state=state if type(state) is str and state.isprintable() else printable(str(state)),
            threads=tuple([ThreadStack.from_dict(t if type(t) is dict else _obj(t), seen) for t in threads]),
            env=tuple(sorted([(k, v if type(v) is str and v.isprintable() else printable(str(v)))
                              for k, v in env.items() if k in _ENV_KEYS])),
            error=printable(error) if isinstance(error, str) else None,
            nonblocking=bool(get("nonblocking", False)),
            main_cpu_ticks=ticks if ticks is None or type(ticks) is int else _opt_int(d, "main_cpu_ticks"),
            layout_hints=_shared_hints(hints, seen),
            source=source if isinstance(source, str) else None,
            main_syscall=_opt_name(d, "main_syscall"),
            cuda=_opt_bool(d, "cuda"),
        )


_ENV_KEYS = frozenset(ENV_WHITELIST)


def _shared_hints(hints: Mapping[str, Any], seen: dict) -> tuple[tuple[str, int], ...]:
    """Layout hints as a sorted tuple; every rank of a job carries the same few, so they are read once."""
    try:  # the leading tag keeps these keys apart from the frame and stack keys in the same dict
        key = ("layout_hints",) + tuple([(k, v, type(v)) for k, v in hints.items()])
        shared = seen.get(key)
    except TypeError:  # an unhashable value: let _int say what is wrong
        key, shared = None, None
    if shared is None:
        shared = tuple(sorted((str(k), _int(hints, k)) for k in hints))
        if key is not None:
            seen[key] = shared
    return shared


@dataclass(frozen=True)
class Snapshot:
    """Every rank captured at one moment (or read from files), plus what could not be captured."""

    captures: tuple[RankCapture, ...]
    host: str = "unknown"
    created: str = ""
    tool_version: str = ""
    errors: tuple[str, ...] = ()  # targets that yielded no capture at all, one line each
    # The Flight Recorder dumps taken with the stacks (a ``flight_recorder.FRDump``), if any.
    flight_recorder: Any = None

    @property
    def world_sizes(self) -> list[int]:
        """The distinct WORLD_SIZEs the captures carry, smallest first (more than one is a conflict)."""
        return world_sizes(self.captures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": BUNDLE_SCHEMA,
            "host": self.host,
            "created": self.created,
            "tool_version": self.tool_version,
            "errors": list(self.errors),
            "captures": [c.to_dict() for c in self.captures],
            "flight_recorder": self.flight_recorder.to_dict() if self.flight_recorder is not None else None,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any], seen_frames: dict | None = None) -> "Snapshot":
        """``seen_frames``: pass one dict to every bundle of a set, so that they share their stacks."""
        if not isinstance(d, Mapping) or d.get("schema") != BUNDLE_SCHEMA:
            raise SchemaError(f"not an {BUNDLE_SCHEMA} document")
        captures = d.get("captures")
        if not isinstance(captures, list):
            raise SchemaError("bundle captures must be a list")
        errors = d.get("errors") or []
        if seen_frames is None:
            seen_frames = {}
        return Snapshot(
            captures=tuple(RankCapture.from_dict(_obj(c), seen_frames) for c in captures),
            host=printable(str(d.get("host") or "unknown")),
            created=printable(str(d.get("created") or "")),
            tool_version=printable(str(d.get("tool_version") or "")),
            errors=tuple(printable(str(e)) for e in errors) if isinstance(errors, list) else (),
            flight_recorder=_flight_recorder(d.get("flight_recorder")),
        )


def _flight_recorder(d: Any) -> Any:
    """The bundle's Flight Recorder dumps (``mtpdiag.fr/1``), read lazily: most bundles carry none."""
    if d is None:
        return None
    from mtpdiag.flight_recorder.records import FRDump

    return FRDump.from_dict(d)


# ---------------------------------------------------------------- report


@dataclass(frozen=True)
class Site:
    """Where a rank waits: the first frame outside torch.distributed and its wrappers."""

    file: str
    line: int
    function: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Site":
        return Site(file=_str(d, "file"), line=_int(d, "line"), function=_str(d, "function"))


@dataclass(frozen=True)
class WaitState:
    """Where a rank is stuck, and how sure the evidence makes us.

    ``kind``: collective | host_sync | comm_init | data_loader | lock | io | sleep | running | unknown.
    ``confidence``: certain | likely | possible. ``evidence`` says what the call rests on, in a few words
    each. ``thread`` names the thread that shows it when that is not the main thread.
    """

    kind: str
    confidence: str
    evidence: tuple[str, ...] = ()
    thread: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "confidence": self.confidence, "evidence": list(self.evidence),
                "thread": self.thread}


@dataclass(frozen=True)
class RankView:
    """One rank as the report shows it. ``state`` is collective|waiting|running|stopped|gone|unreadable
    (``waiting``: blocked outside any collective, e.g. at a host sync or a lock; ``wait`` says on what)."""

    rank: int | None
    pid: int | None
    host: str
    state: str
    coords: Mapping[str, int] | None
    op: str | None
    site: Site | None
    stack: tuple[Frame, ...]
    peer: int | None = None  # the other end of a send/recv, when known
    error: str | None = None
    wait: WaitState | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "state": self.state,
            "coords": dict(self.coords) if self.coords is not None else None,
            "op": self.op,
            "site": self.site.to_dict() if self.site else None,
            "stack": [f.to_dict() for f in self.stack],
        }
        if self.peer is not None:
            out["peer"] = self.peer
        if self.error:
            out["error"] = self.error
        out["wait"] = self.wait.to_dict() if self.wait is not None else None
        return out


@dataclass(frozen=True)
class SiteGroup:
    """Ranks that wait in the same op at the same site (op None: in no collective at that user frame; then
    ``wait`` is what they wait on there, e.g. ``host_sync``, or ``running``)."""

    op: str | None
    site: Site | None
    ranks: tuple[int, ...]
    wait: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "site": self.site.to_dict() if self.site else None,
            "ranks": list(self.ranks),
            "wait": self.wait,
        }


@dataclass(frozen=True)
class Mismatch:
    """A process-group instance that only some of its members entered at a site."""

    op: str
    site: Site | None
    group: str
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    gate: Mapping[str, int] | None
    absent_doing: Mapping[int, str] = field(default_factory=dict)  # rank -> "all_gather in ring_attention"
    role: str = "root"  # root | consequence
    # How the group kind was found: known-site | flight-recorder | unique-fit | guess; every kind that fit.
    group_from: str = "unique-fit"
    group_candidates: tuple[str, ...] = ()
    # strong: several ranks on each side split cleanly along the gate; weak: one rank alone, or other
    # coordinate conditions separate the sides as well (``gate_alternatives``): data-dependent divergence
    # (a loop that ran once more on some ranks) fits just as well.
    gate_strength: str | None = None
    gate_alternatives: tuple[Mapping[str, int], ...] = ()
    source: str = "stacks"  # stacks | flight-recorder | stacks+flight-recorder
    seq: int | None = None  # the Flight Recorder's collective sequence number in the group, when known

    def with_role(self, role: str) -> "Mismatch":
        """``replace(self, role=role)`` without its per-call field introspection (8k instances at 16k ranks);
        tests compare the two, so a new field cannot be dropped here unnoticed."""
        return Mismatch(op=self.op, site=self.site, group=self.group, members=self.members, entered=self.entered,
                        absent=self.absent, gate=self.gate, absent_doing=self.absent_doing, role=role,
                        group_from=self.group_from, group_candidates=self.group_candidates,
                        gate_strength=self.gate_strength, gate_alternatives=self.gate_alternatives,
                        source=self.source, seq=self.seq)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "site": self.site.to_dict() if self.site else None,
            "group": self.group,
            "members": list(self.members),
            "entered": list(self.entered),
            "absent": list(self.absent),
            "gate": dict(self.gate) if self.gate is not None else None,
            "absent_doing": {str(k): v for k, v in sorted(self.absent_doing.items())},
            "role": self.role,
            "group_from": self.group_from,
            "group_candidates": list(self.group_candidates),
            "gate_strength": self.gate_strength,
            "gate_alternatives": [dict(g) for g in self.gate_alternatives],
            "source": self.source,
            "seq": self.seq,
        }


@dataclass(frozen=True)
class Finding:
    """A diagnosed problem, with a stable ``id`` users script against (see docs/design.md)."""

    id: str
    ranks: tuple[int, ...]
    summary: str
    remedy: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "ranks": list(self.ranks), "summary": self.summary}
        out["remedy"] = self.remedy
        if self.details:
            out["details"] = dict(self.details)
        return out


@dataclass(frozen=True)
class Report:
    """The diagnosis. ``verdict``: ok | problem | incomplete."""

    verdict: str
    world_size: int | None
    layout: Mapping[str, Any] | None
    ranks: tuple[RankView, ...]
    sites: tuple[SiteGroup, ...]
    mismatches: tuple[Mismatch, ...] = ()
    findings: tuple[Finding, ...] = ()
    layout_source: str | None = None
    notes: tuple[str, ...] = ()  # what is missing or uncertain, in plain words
    progress: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. flight recorder correlation

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": REPORT_SCHEMA,
            "verdict": self.verdict,
            "world_size": self.world_size,
            "layout": dict(self.layout) if self.layout is not None else None,
            "layout_source": self.layout_source,
            "ranks": [r.to_dict() for r in self.ranks],
            "sites": [s.to_dict() for s in self.sites],
            "mismatches": [m.to_dict() for m in self.mismatches],
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }
        if self.progress is not None:
            out["progress"] = dict(self.progress)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


# ---------------------------------------------------------------- helpers


def _obj(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SchemaError("expected an object")
    return value


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise SchemaError(f"field {key!r} must be a string")
    return printable(value)


def _int(d: Mapping[str, Any], key: str) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"field {key!r} must be an integer")
    return value


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"field {key!r} must be an integer or null")
    return value


def _opt_bool(d: Mapping[str, Any], key: str) -> bool | None:
    value = d.get(key)
    if value is None or type(value) is bool:
        return value
    raise SchemaError(f"field {key!r} must be true, false or null")


def _opt_name(d: Mapping[str, Any], key: str) -> str | None:
    """A short identifier-like word (a system call's name), or None."""
    value = d.get(key)
    if value is None:
        return None
    if type(value) is not str or len(value) > 40 or not value.replace("-", "_").isidentifier():
        raise SchemaError(f"field {key!r} must be a short name or null")
    return value


def _opt_rank(d: Mapping[str, Any]) -> int | None:
    rank = _opt_int(d, "rank")
    if rank is not None and rank < 0:
        raise SchemaError(f"field 'rank' must not be negative, got {rank}")
    return rank
