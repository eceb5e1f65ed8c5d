"""One Flight Recorder pickle per rank, read without ever running code from it.

torch writes ``<prefix><rank>`` (the prefix is ``TORCH_FR_DUMP_TEMP_FILE``). A dump is plain dicts,
lists, tuples, strings and numbers: ``version``, ``pg_config`` (group name -> desc and ranks),
``pg_status`` and ``entries`` (one per recorded op). The unpickler here refuses every class,
callable and persistent id, so a hostile file fails to load instead of running.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any

from mtpdiag.errors import InputError
from mtpdiag.model import Site

MAX_DUMP_BYTES = 256 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"^(.*?)(\d+)$")
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
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
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


