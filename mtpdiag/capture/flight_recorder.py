"""The Flight Recorder dumps of live targets: find them where torch writes them, or ask the job for fresh ones.

torch writes ``<prefix><rank>`` (``capture.fr_locate.dump_prefixes``: ``TORCH_FR_DUMP_TEMP_FILE``, else
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else the defaults under the target's home and ``/tmp``). Paths are read
through ``/proc/PID/root``, so a rank in a container is read in its own file system. A dump older than its
process is left alone: it belongs to an earlier run.

When the job set ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``, ``request=True`` writes to every rank's
``<prefix><rank>.pipe`` and waits for the dumps that request produces, without stopping the job.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec

from mtpdiag.capture import procfs
from mtpdiag.capture.fr_locate import DUMP_ENV, dump_prefixes, pipe_prefix, request_live_dump
from mtpdiag.errors import InputError
from mtpdiag.model import RankCapture, Snapshot, replace
from mtpdiag.model.flight_recorder import FRDump
from mtpdiag.model.group_marks import GroupCompleted, Marks, advance, every_rank_read_at

TORN_DUMP_WAIT_S = 2.0  # a dump that cannot be read, changed this recently, may be mid-write: read it again


class FoundDumps(msgspec.Struct, frozen=True):
    """What was found: the dumps (None when there are none), and one line per thing worth saying."""

    dumps: FRDump | None
    notes: tuple[str, ...] = ()


def find_dumps(captures: tuple[RankCapture, ...], *, request: bool = False, wait_s: float = 10.0) -> FoundDumps:
    """The Flight Recorder dumps of the captured ranks (each rank's newest file not older than its process)."""
    notes: list[str] = []
    targets = _targets(captures)
    asked_at = time.time()
    if request:
        sent = 0
        for c in targets:
            prefix = pipe_prefix(c.env)
            if prefix is None:
                continue
            answer = request_live_dump(_in_root(c.pid, prefix), c.rank)
            sent += answer.sent
            if not answer.sent:
                notes.append(f"rank {c.rank}: no live Flight Recorder dump ({answer.reason})")
        if not sent:
            notes.append(
                "no rank could be asked for a live Flight Recorder dump: the job did not set "
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
            )
            request = False
    files = _wait_for_files(targets, asked_at if request else None, wait_s if request else 0.0)
    if request and len(files) < len(targets):
        late = sorted(c.rank for c in targets if c.rank not in files)
        notes.append(f"no fresh Flight Recorder dump from rank(s) {', '.join(map(str, late[:16]))} within {wait_s:g} s")
    if not files:
        return FoundDumps(None, tuple(notes))
    from mtpdiag.inputs.flight_recorder import load_fr_dumps  # only when there are dumps to read

    # torch writes a dump in place, in pieces: one read mid-write is cut short (EOFError). Read again while a file
    # is still changing; one that stopped changing is as it will stay (a corrupt dump is said at once).
    paths = [files[r] for r in sorted(files)]
    deadline = time.monotonic() + max(TORN_DUMP_WAIT_S, wait_s if request else 0.0)
    while True:
        try:
            dumps = load_fr_dumps(paths)
            break
        except InputError as exc:
            if time.monotonic() >= deadline or not _changed_within(paths, TORN_DUMP_WAIT_S):
                return FoundDumps(None, (*notes, f"Flight Recorder dumps found but not read: {exc}"))
            time.sleep(0.2)
    where = _common_prefix(list(files.values()))
    return FoundDumps(replace(dumps, source=where), tuple(notes))


def with_dumps(snapshot: Snapshot, *, request: bool = False, wait_s: float = 10.0) -> tuple[Snapshot, tuple[str, ...]]:
    """The snapshot with the dumps its ranks wrote (or, with ``request``, write now), and what could not be had
    when that is worth saying (a request that brought no dump); the other notes go into the dumps' notes."""
    found = find_dumps(snapshot.captures, request=request, wait_s=wait_s)
    if found.dumps is None:
        return snapshot, found.notes if request else ()
    return replace(snapshot, flight_recorder=replace(found.dumps, notes=(*found.dumps.notes, *found.notes))), ()


def stale_ranks(captures: tuple[RankCapture, ...], since: float) -> list[int]:
    """The ranks with a debug-info pipe whose dump is missing or older than ``since`` (time.time()): at a hang's
    call, a dump from before the last progress shows the job as it was, not as it hangs; ask again."""
    return [c.rank for c in _targets(captures) if pipe_prefix(c.env) is not None and _dump_of(c, since) is None]


def _changed_within(paths: list[str], seconds: float) -> bool:
    """Whether any of ``paths`` was written in the last ``seconds`` (it may be mid-write)."""
    now = time.time()
    for path in paths:
        try:
            if now - os.stat(path).st_mtime < seconds:
                return True
        except OSError:
            continue
    return False


class _Target(NamedTuple):
    """A captured rank that can have a dump: its pid and rank are known."""

    pid: int
    rank: int
    env: dict[str, str]


def _targets(captures: tuple[RankCapture, ...]) -> list[_Target]:
    return [_Target(c.pid, c.rank, c.env.as_dict()) for c in captures if c.pid is not None and c.rank is not None]


def _wait_for_files(targets: list[_Target], newer_than: float | None, wait_s: float) -> dict[int, str]:
    """rank -> its dump file (seen through /proc/PID/root), once every rank has one or ``wait_s`` is up."""
    deadline = time.monotonic() + wait_s
    while True:
        files: dict[int, str] = {}
        for c in targets:
            found = _dump_of(c, newer_than)
            if found is not None:
                files[c.rank] = found[0]
        if len(files) == len(targets) or time.monotonic() >= deadline:
            return files
        time.sleep(0.2)


def _dump_of(capture: _Target, newer_than: float | None) -> tuple[str, float] | None:
    """The rank's dump file (seen through /proc/PID/root) and its mtime, when it is of this run."""
    started = procfs.start_time(capture.pid)
    named = any((capture.env.get(key) or "").strip() for key in DUMP_ENV)  # then the home is not needed
    for prefix in dump_prefixes(capture.env, None if named else _home(capture.pid)):
        path = _in_root(capture.pid, f"{prefix}{capture.rank}")
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if started is not None and mtime < started:
            continue  # from an earlier run of the job
        if newer_than is not None and mtime < newer_than:
            continue
        return path, mtime
    return None


def _in_root(pid: int, path: str) -> str:
    """``path`` as process ``pid`` sees it (its mount namespace and root)."""
    return f"/proc/{pid}/root{path}" if os.path.isabs(path) else path


def _home(pid: int) -> str | None:
    """The home directory of the process's user (torch's default dump directory is under it)."""
    uid = procfs.real_uid(pid)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def _common_prefix(paths: list[str]) -> str:
    """The shared prefix of the dump files, as the ranks see them (without ``/proc/PID/root``)."""
    inside = [re.sub(r"^/proc/[0-9]+/root(?=/)", "", p) for p in paths]
    return os.path.commonprefix(inside)


class LiveProgress:
    """``watch``'s Flight Recorder signal: when a collective was last seen completed, from dumps the job writes
    on request through its debug-info pipe (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``). A healthy job whose host waits
    at one sync line for seconds at a time still completes collectives meanwhile.

    Progress is counted per process group across ranks (``model.group_marks``), so one rank's dump a sample
    is enough while the job moves: the ranks are asked in turn, one per sample (the one read longest ago), and
    a rank's first dump after a hang is no progress when its groups' other members already showed where they
    stopped. When a sample's dumps show no group past its mark, every rank is asked again, so that a quiet spell
    is confirmed by all of them with fresh dumps. torch answers a request from its monitor thread, which looks
    at the pipe about once a second, so an answer often comes after the next sample: every dump newer than the
    last one read for a rank is read, whenever it was written, and a rank with a request open is asked again
    only once ``REASK_S`` went by.
    """

    REASK_S = 5.0  # a request not answered by then is taken as lost, and made again
    MTIME_SLACK_S = 0.05  # file times come from the kernel's coarse clock, a tick behind time.time()

    def __init__(self, state: Mapping[str, Mapping[Any, Any]] | None = None) -> None:
        state = state or {}
        self._asked = {int(r): float(t) for r, t in (state.get("asked") or {}).items()}  # open requests: when
        self._read_mtime = {int(r): float(t) for r, t in (state.get("read_mtime") or {}).items()}  # last read
        self._marks: Marks = {str(k): [float(v[0]), float(v[1])] for k, v in (state.get("marks") or {}).items()}
        self._first_read = {int(r): float(t) for r, t in (state.get("first_read") or {}).items()}  # first dump read
        self.piped: set[int] = set()  # the ranks with a debug-info pipe at the last poll

    def state(self, ranks: set[int] | None = None) -> dict[str, dict[Any, Any]]:
        """What the next poll needs, as plain data (the requests and reads of ``ranks`` only, if given; the
        groups' marks whole): ``--ray`` keeps it on the driver between samples and hands each node's capture
        task the state of its ranks."""

        def keep(table: dict[int, float]) -> dict[Any, Any]:
            return {r: v for r, v in table.items() if ranks is None or r in ranks}

        marks = {k: list(v) for k, v in self._marks.items()}
        return {
            "asked": keep(self._asked),
            "read_mtime": keep(self._read_mtime),
            "first_read": keep(self._first_read),
            "marks": marks,
        }

    def established_at(self) -> float | None:
        """When this signal could first see every rank's groups move (``group_marks.every_rank_read_at``)."""
        return every_rank_read_at(self.piped, self._first_read)

    def poll(self, captures: tuple[RankCapture, ...]) -> float | None:
        """When the newest collective past its group's mark completed (time.time()), None when the dumps read
        show none. Reads the new dumps, then asks: the next rank in turn, or every rank after a quiet read.
        Never waits."""
        now = time.time()
        ranks = [(c, prefix) for c in _targets(captures) if (prefix := pipe_prefix(c.env)) is not None]
        self.piped = {c.rank for c, _ in ranks}
        read = [groups for c, _ in ranks if (groups := self._read_new_dump(c)) is not None]
        self._marks, newest = advance(self._marks, (g for groups in read for g in groups))
        due = [(c, prefix) for c, prefix in ranks if now - self._asked.get(c.rank, -self.REASK_S) >= self.REASK_S]
        if not read or newest is not None:  # moving (or waiting for answers): one rank, the one read longest ago
            due = sorted(due, key=lambda cp: (self._read_mtime.get(cp[0].rank, 0.0), cp[0].rank))[:1]
        for c, prefix in due:
            if request_live_dump(_in_root(c.pid, prefix), c.rank).sent:
                self._asked[c.rank] = now
            else:
                self._asked.pop(c.rank, None)
        return newest

    def _read_new_dump(self, c: _Target) -> tuple[GroupCompleted, ...] | None:
        """The groups of the rank's dump if it is newer than the last one read (the first one must answer a
        request of ours: an older dump is no baseline for "since the last sample"); None when there is none."""
        asked, last = self._asked.get(c.rank), self._read_mtime.get(c.rank)
        if asked is None and last is None:
            return None
        found = _dump_of(c, None)
        if found is None:
            return None
        path, mtime = found
        if (last is not None and mtime <= last) or (
            last is None and asked is not None and mtime < asked - self.MTIME_SLACK_S
        ):
            return None
        groups = _groups_completed(path, c.rank, mtime)
        if groups is None:  # not a dump we can read (yet): try again at the next poll
            return None
        self._read_mtime[c.rank] = mtime
        self._first_read.setdefault(c.rank, mtime)
        if asked is not None and mtime >= asked - self.MTIME_SLACK_S:
            del self._asked[c.rank]  # answered
        return groups


def _groups_completed(path: str, rank: int, mtime: float) -> tuple[GroupCompleted, ...] | None:
    """Each group's last completed collective in a rank's dump, dated (``pg_status``, ``model.group_marks``)."""
    from mtpdiag.inputs.flight_recorder.dump import read_groups_completed

    try:
        return read_groups_completed(path, rank, mtime)
    except InputError:
        return None
