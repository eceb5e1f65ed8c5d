"""What was captured: threads, one rank's capture, and a snapshot of every rank (``mtpdiag.bundle/1``).

Frozen msgspec Structs whose fields are the bundle's JSON; ``inputs.bundle`` decodes and encodes them with
compiled msgspec decoders. Capture code and the file readers build ``Snapshot``s; analysis turns one (plus an
optional layout) into a ``Report``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from mtpdiag.model.fields import Record, decimal
from mtpdiag.model.flight_recorder import FRDump
from mtpdiag.model.frames import Frame
from mtpdiag.vocabulary.states import ProcessState

BUNDLE_SCHEMA = "mtpdiag.bundle/1"

# Process states (from /proc/PID/stat, or how the capture went: ``vocabulary.states.ProcessState``).
STATE_RUNNING = ProcessState.RUNNING
STATE_SLEEPING = ProcessState.SLEEPING
STATE_DISK = ProcessState.DISK
STATE_STOPPED = ProcessState.STOPPED
STATE_ZOMBIE = ProcessState.ZOMBIE
STATE_GONE = ProcessState.GONE
STATE_UNREADABLE = ProcessState.UNREADABLE
STATE_UNKNOWN = ProcessState.UNKNOWN
UNKNOWN_HOST = "unknown"

Name = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]  # a call's name (``item``, ``acquire``)
Syscall = Annotated[str, Meta(max_length=40, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]  # ``futex``, ``running``
Rank = Annotated[int, Meta(ge=0)]


class Env(Record, frozen=True):
    """The environment keys of a target process that may be read: nothing else is ever kept, and a key
    that is not a field here is dropped when a bundle is read."""

    RANK: str | None = None
    LOCAL_RANK: str | None = None
    WORLD_SIZE: str | None = None
    GROUP_RANK: str | None = None
    LOCAL_WORLD_SIZE: str | None = None
    SLURM_PROCID: str | None = None
    SLURM_LOCALID: str | None = None
    SLURM_NTASKS: str | None = None
    MASTER_ADDR: str | None = None
    MASTER_PORT: str | None = None
    WG_PREFIX: str | None = None
    RAY_LOCAL_WORLD_SIZE: str | None = None
    # Where torch writes the Flight Recorder dumps, and its pipe for a live dump (flight_recorder.locate).
    TORCH_FR_DUMP_TEMP_FILE: str | None = None
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE: str | None = None
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE: str | None = None

    def get(self, key: str) -> str | None:
        return getattr(self, key, None) if key in ENV_WHITELIST else None

    def as_dict(self) -> dict[str, str]:
        """The keys that are set."""
        return {k: v for k in self.__struct_fields__ if (v := getattr(self, k)) is not None}

    @staticmethod
    def of(values: dict[str, str]) -> Env:
        """The whitelisted keys of ``values``; any other key is dropped."""
        return Env(**{k: v for k, v in values.items() if k in ENV_WHITELIST})


# Environment keys of a target process that may be read. Nothing else from the environment is kept.
ENV_WHITELIST: tuple[str, ...] = Env.__struct_fields__
NO_ENV = Env()


# Every rank of a job carries the same WORLD_SIZE text: parse each distinct text once.
_env_number = functools.lru_cache(maxsize=256)(decimal)


def _world_size(world_size: str | None, ntasks: str | None) -> int | None:
    size = _env_number(world_size)
    return size if size is not None else _env_number(ntasks)


def world_sizes(captures: Iterable[RankCapture]) -> list[int]:
    """The distinct WORLD_SIZEs some captures carry, smallest first (more than one is a conflict).

    The ranks of a job carry the same texts: each distinct pair is parsed once."""
    texts = {(c.env.WORLD_SIZE, c.env.SLURM_NTASKS) for c in captures}
    return sorted({size for pair in texts if (size := _world_size(*pair))})


def who_and_why(item: Any) -> str:
    """``rank 3: <error>`` (``pid 812: ...`` without a rank) for a capture or a view that was not read."""
    who = f"rank {item.rank}" if item.rank is not None else f"pid {item.pid}"
    return f"{who}: {item.error or item.state}"


class ThreadStack(Record, frozen=True, kw_only=True):
    """One thread's stack, innermost frame first."""

    thread_id: int
    name: str = ""
    frames: tuple[Frame, ...]
    native_id: int | None = None
    active: bool | None = None
    # What the innermost Python frame's source line calls, from a short list (``item``, ``synchronize``,
    # ``acquire``, ...): read from the target's own file at capture time. The line itself is never kept.
    calls: tuple[Name, ...] = ()
    # A hash of every frame's local variables as py-spy showed them, for ``watch``: a loop that came back to
    # the same line has new locals. Live captures only; ``inputs.bundle`` never writes it.
    locals_key: int | None = None


class RankCapture(Record, frozen=True, kw_only=True):
    """What was captured of one worker process.

    ``env`` holds whitelisted keys only. ``state`` is the /proc state letter (R, S, D, T, Z, ...)
    or ``"gone"``/``"unreadable"`` when the process could not be read. ``error`` says why a capture
    is missing or partial. ``main_cpu_ticks`` is the main thread's utime+stime (for ``watch``).
    ``layout_hints`` are parallel sizes read from the command lines of the process and its
    ancestors (never the command lines themselves).
    """

    pid: int | None = None
    host: str = UNKNOWN_HOST
    rank: Rank | None = None
    state: str = STATE_UNREADABLE
    env: Env = NO_ENV
    error: str | None = None
    nonblocking: bool = False
    main_cpu_ticks: int | None = None
    layout_hints: dict[str, int] = {}
    source: str | None = None  # file the capture was read from, for analyze
    # What /proc said of the main thread just before the dump: the system call it sits in (``futex``,
    # ``clock_nanosleep``, ``read``; ``running`` when on the CPU) and whether the process maps CUDA/NCCL.
    main_syscall: Syscall | None = None
    cuda: bool | None = None
    threads: tuple[ThreadStack, ...] = ()

    @property
    def world_size(self) -> int | None:
        """WORLD_SIZE, else SLURM_NTASKS, from the environment (None if neither is a number)."""
        return _world_size(self.env.WORLD_SIZE, self.env.SLURM_NTASKS)

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


class RankConflict(Record, frozen=True, kw_only=True):
    """One rank that several captures show differently (files of two moments or two jobs, or two processes
    that claim it). Every capture is kept in ``Snapshot.captures``; the group analysis reads the one from
    ``sources[0]``: the first file named (a directory's files by name) that holds a stack of it."""

    rank: Rank
    sources: tuple[str, ...]  # where each capture came from, the one the analysis reads first
    why: str  # what differs: "different stacks", "different pids: 812, 901", "different hosts: a, b"


class Snapshot(Record, frozen=True, kw_only=True, tag_field="schema", tag=BUNDLE_SCHEMA, gc=True, dict=True):
    """Every rank captured at one moment (or read from files), plus what could not be captured.

    The bundle's JSON is this type with ``"schema": "mtpdiag.bundle/1"`` first (``inputs.bundle``); its
    ``flight_recorder`` is the recorder's own ``mtpdiag.fr/1`` document (``FRDump.packed``). It has a
    ``__dict__`` (which msgspec needs ``gc=True`` for) only to cache ``world_sizes``.
    """

    captures: tuple[RankCapture, ...]
    host: str = UNKNOWN_HOST
    created: str = ""
    tool_version: str = ""
    errors: tuple[str, ...] = ()  # targets that yielded no capture at all, one line each
    flight_recorder: FRDump | None = None  # the Flight Recorder dumps taken with the stacks, if any
    conflicts: tuple[RankConflict, ...] = ()  # ranks that several files captured differently (inputs.merge)

    @functools.cached_property
    def world_sizes(self) -> list[int]:
        """The distinct WORLD_SIZEs the captures carry, smallest first (more than one is a conflict).

        Cached: reading the files, resolving the layout and the diagnosis each ask (6 ms at 16k ranks)."""
        return world_sizes(self.captures)

    @property
    def world_size(self) -> int | None:
        """The largest WORLD_SIZE the captures carry, None when none does (the diagnosis notes a disagreement)."""
        sizes = self.world_sizes
        return sizes[-1] if sizes else None

    def stored(self) -> Snapshot:
        """The snapshot as a bundle stores it: without ``watch``'s locals hashes, with the Flight Recorder's
        stacks stored once per rank (``FRDump.packed``)."""
        captures = tuple(
            msgspec.structs.replace(
                c,
                threads=tuple(
                    msgspec.structs.replace(t, locals_key=None) if t.locals_key is not None else t for t in c.threads
                ),
            )
            if any(t.locals_key is not None for t in c.threads)
            else c
            for c in self.captures
        )
        fr = self.flight_recorder.packed() if self.flight_recorder is not None else None
        return msgspec.structs.replace(self, captures=captures, flight_recorder=fr)
