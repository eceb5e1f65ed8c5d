"""What was captured: frames, threads, one rank's capture, and a snapshot of every rank (``mtpdiag.bundle/1``).

Frozen dataclasses with versioned JSON (de)serialization and no other I/O. Capture code and the file
readers build ``Snapshot``s; analysis turns one (plus an optional layout) into a ``Report``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpdiag.model.fields import SchemaError, decimal, integer, obj, opt_bool, opt_int, opt_name, opt_rank, printable
from mtpdiag.model.flight_recorder import FRDump
from mtpdiag.model.frames import Frame, shared_frames

BUNDLE_SCHEMA = "mtpdiag.bundle/1"

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
# How a capture went when there is no /proc letter to give.
STATE_GONE = "gone"  # the process exited before or during the capture
STATE_UNREADABLE = "unreadable"  # no stack could be read
STATE_UNKNOWN = "unknown"  # read from a file: py-spy and the others do not record the process state
UNKNOWN_HOST = "unknown"


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
        # Type checks inline rather than through integer/opt_int/printable: this runs once per rank.
        thread_id, name, native_id, active = d.get("thread_id"), d.get("name") or "", d.get("native_id"), \
            d.get("active")
        calls = d.get("calls")
        return ThreadStack(
            thread_id=thread_id if type(thread_id) is int else integer(d, "thread_id"),
            name=name if type(name) is str and name.isprintable() else printable(str(name)),
            native_id=native_id if native_id is None or type(native_id) is int else opt_int(d, "native_id"),
            active=active if type(active) is bool else None,
            frames=shared_frames(frames, {} if seen_frames is None else seen_frames),
            calls=() if calls is None else _call_names(calls),
        )


def _call_names(calls: Any) -> tuple[str, ...]:
    if type(calls) is not list or not all(type(c) is str and c.isidentifier() for c in calls):
        raise SchemaError("thread calls must be a list of names")
    return tuple(calls)


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
        # Type checks inline rather than through opt_int/printable: this runs once per rank.
        pid, host, state, error, source, ticks = (get("pid"), get("host") or "unknown", get("state") or "unreadable",
                                                  get("error"), get("source"), get("main_cpu_ticks"))
        return RankCapture(
            pid=pid if pid is None or type(pid) is int else opt_int(d, "pid"),
            host=host if type(host) is str and host.isprintable() else printable(str(host)),
            rank=opt_rank(d),
            state=state if type(state) is str and state.isprintable() else printable(str(state)),
            threads=tuple([ThreadStack.from_dict(t if type(t) is dict else obj(t), seen) for t in threads]),
            env=tuple(sorted([(k, v if type(v) is str and v.isprintable() else printable(str(v)))
                              for k, v in env.items() if k in _ENV_KEYS])),
            error=printable(error) if isinstance(error, str) else None,
            nonblocking=bool(get("nonblocking", False)),
            main_cpu_ticks=ticks if ticks is None or type(ticks) is int else opt_int(d, "main_cpu_ticks"),
            layout_hints=_shared_hints(hints, seen),
            source=source if isinstance(source, str) else None,
            main_syscall=opt_name(d, "main_syscall"),
            cuda=opt_bool(d, "cuda"),
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
        shared = tuple(sorted((str(k), integer(hints, k)) for k in hints))
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
    flight_recorder: FRDump | None = None  # the Flight Recorder dumps taken with the stacks, if any

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
            captures=tuple(RankCapture.from_dict(obj(c), seen_frames) for c in captures),
            host=printable(str(d.get("host") or "unknown")),
            created=printable(str(d.get("created") or "")),
            tool_version=printable(str(d.get("tool_version") or "")),
            errors=tuple(printable(str(e)) for e in errors) if isinstance(errors, list) else (),
            flight_recorder=_flight_recorder(d.get("flight_recorder")),
        )


def _flight_recorder(d: Any) -> FRDump | None:
    """The bundle's Flight Recorder dumps (``mtpdiag.fr/1``), if it carries any."""
    return None if d is None else FRDump.from_dict(d)
