"""The Flight Recorder as ProcessGroupNCCL fills it, for the emulated NCCL process groups.

torch's gloo backend records into the same C++ FlightRecorder, but not as NCCL does: it names
reduce_scatter_tensor ``gloo:all_reduce``, leaves send/recv out, never sets a state beyond
``scheduled`` and leaves ``pg_config`` empty. So the emulated backend records here, field for field
what torch 2.13's ``FlightRecorder<at::cuda::CUDAEvent>`` records for ProcessGroupNCCL, and ``dump()``
builds the dict that ``FlightRecorder::dump()`` pickles (torch/csrc/distributed/c10d/FlightRecorder.hpp
and FlightRecorderDetail.hpp, shipped in torch's include/ directory).

Where each value comes from is said next to it. What differs from a real NCCL dump: ``comm_lib_version``
is empty (there is no NCCL library; gloo's dump leaves it empty too) and there is no ``nccl_comm_state``
(NCCL writes it only for NCCLX and ROCm builds).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# FlightRecorder.hpp: DEFINE_CONSTANT(version_val, "2.10"). ProcessGroupNCCL and gloo share this recorder
# in torch 2.13, so NCCL's dumps carry the same version.
VERSION = "2.10"

# FlightRecorder.hpp: state_key values, from the start/end CUDA events in update_state(). Without
# TORCH_NCCL_ENABLE_TIMING there is no start event, so an entry goes from scheduled to completed.
SCHEDULED, COMPLETED = "scheduled", "completed"

# c10::toString(ScalarType), which getCollectiveTrace() writes into input_dtypes / output_dtypes.
DTYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool",
}


def buffer_size() -> int:
    """FlightRecorder(): max_entries_ = getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)."""
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(key)
        if value:
            return int(value)
    return 2000


def dump_path(global_rank: int) -> str:
    """DebugInfoWriter::getWriter(rank): ``${TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE}<rank>``,
    by default ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` (``~/.cache`` without XDG_CACHE_HOME)."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not prefix:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch"
        cache.mkdir(parents=True, exist_ok=True)
        prefix = str(cache / "comm_lib_trace_rank_")
    return f"{prefix}{global_rank}"


def thread_name() -> str:
    """c10::getThreadName(): the OS name of the calling thread (pthread_getname_np), e.g. ``python3``."""
    try:
        return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass
class ProcessGroupStatus:
    """logger.hpp ProcessGroupStatus, which getPgStatus() writes per pg_id. -1 means none yet; without
    timing no start is ever observed, so last_started stays -1 (as torch's NCCL tests expect)."""

    last_enqueued: int = -1
    last_started: int = -1
    last_completed: int = -1

    def to_dict(self) -> dict[str, int]:
        return {"last_enqueued_collective": self.last_enqueued, "last_started_collective": self.last_started,
                "last_completed_collective": self.last_completed}


@dataclass
class Entry:
    """FlightRecorder::Entry, with the fields getCollectiveTrace() writes."""

    record_id: int            # id_: the recorder's running id, over every group of the process
    pg_id: int                # ProcessGroupNCCL::local_id_: this process's n-th NCCL group (0 = default)
    process_group: tuple[str, str]  # (pg_uid_, pg_desc_): the group's name (global) and description
    thread_name: str          # c10::getThreadName() of the thread that issued the op
    thread_id: str            # c10::str(std::this_thread::get_id()): the pthread id, in decimal
    collective_seq_id: int    # seqCollective_: counts collectives (a coalesced group once)
    p2p_seq_id: int           # seqP2P_: counts p2p ops (a batch once)
    op_id: int                # op_id_: counts every op, each one inside a batch too
    profiling_name: str       # the profilingTitle passed to collective()/pointToPoint()
    time_created_ns: int      # c10::getTime(): wall clock when recorded
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    timeout_ms: int           # the work's timeout: the process group's timeout
    is_p2p: bool
    frames: list[dict[str, Any]]  # CapturedTraceback of the issuing thread, innermost first
    has_events: bool = True   # ops inside a coalesced batch are recorded with null events: they never change
    completed_ns: int | None = None
    retired: bool = False     # no longer in the watchdog's work list; retired and not completed = timed out

    def to_dict(self) -> dict[str, Any]:
        """getCollectiveTrace()'s dict, keys in its order (frames first, when stack traces are included)."""
        return {
            "frames": self.frames,
            "record_id": self.record_id,
            "pg_id": self.pg_id,
            "process_group": self.process_group,
            "thread_name": self.thread_name,
            "thread_id": self.thread_id,
            "collective_seq_id": self.collective_seq_id,
            "p2p_seq_id": self.p2p_seq_id,
            "op_id": self.op_id,
            "profiling_name": self.profiling_name,
            "time_created_ns": self.time_created_ns,
            "input_sizes": self.input_sizes,
            "input_dtypes": self.input_dtypes,
            "output_sizes": self.output_sizes,
            "output_dtypes": self.output_dtypes,
            "state": COMPLETED if self.completed_ns is not None else SCHEDULED,
            "time_discovered_started_ns": None,  # set only with TORCH_NCCL_ENABLE_TIMING
            "time_discovered_completed_ns": self.completed_ns,
            "retired": self.retired,
            "timeout_ms": self.timeout_ms,
            "is_p2p": self.is_p2p,
        }


def sizes_and_dtypes(tensors: list[torch.Tensor]) -> tuple[list[list[int]], list[str]]:
    """record(): per tensor, its sizes (input_dims_/sizes_) and c10::toString of its dtype."""
    return [list(t.shape) for t in tensors], [DTYPE_NAMES.get(t.dtype, str(t.dtype)) for t in tensors]


@dataclass
class FlightRecorder:
    """The per-process ring buffer (FlightRecorder<EventType>::get() is a process-wide singleton)."""

    max_entries: int = field(default_factory=buffer_size)
    entries: list[Entry] = field(default_factory=list)
    next_slot: int = 0
    next_id: int = 0
    pg_status: dict[int, ProcessGroupStatus] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def record(self, *, pg_id: int, status: ProcessGroupStatus, inputs: list[torch.Tensor],
               outputs: list[torch.Tensor], frames: list[dict[str, Any]], **fields: Any) -> Entry | None:
        """recordWithResetEnabled(): append an entry (overwriting the oldest once full); None when disabled."""
        if not self.enabled:
            return None
        input_sizes, input_dtypes = sizes_and_dtypes(inputs)
        output_sizes, output_dtypes = sizes_and_dtypes(outputs)
        with self.lock:
            self.pg_status.setdefault(pg_id, status)  # all_pg_status_[pg_id], added on a group's first record
            entry = Entry(record_id=self.next_id, pg_id=pg_id, thread_name=thread_name(),
                          thread_id=str(threading.get_ident()), time_created_ns=time.time_ns(),
                          input_sizes=input_sizes, input_dtypes=input_dtypes, output_sizes=output_sizes,
                          output_dtypes=output_dtypes, frames=frames, **fields)
            if len(self.entries) < self.max_entries:
                self.entries.append(entry)
            else:
                self.entries[self.next_slot] = entry
            self.next_slot = (self.next_slot + 1) % self.max_entries
            self.next_id += 1
            return entry

    def complete(self, entry: Entry | None) -> None:
        """The watchdog saw the work's end event (update_state) and retired it (retire_id)."""
        if entry is not None:
            with self.lock:
                entry.completed_ns = time.time_ns()
                entry.retired = True

    def retire(self, entry: Entry | None) -> None:
        """retire_id() of a work the watchdog timed out: it leaves the work list without completing."""
        if entry is not None:
            with self.lock:
                entry.retired = True

    def dump(self, pg_config: dict[str, dict[str, str]]) -> dict[str, Any]:
        """FlightRecorder::dump(): version, pg_config, comm_lib_version, pg_status, entries (oldest first)."""
        with self.lock:
            ordered = self.entries[self.next_slot:] + self.entries[:self.next_slot] \
                if len(self.entries) == self.max_entries else list(self.entries)
            return {
                "version": VERSION,
                "pg_config": pg_config,
                "comm_lib_version": "",
                "pg_status": {str(pg_id): s.to_dict() for pg_id, s in sorted(self.pg_status.items())},
                "entries": [e.to_dict() for e in ordered],
            }

    def write(self, path: str, pg_config: dict[str, dict[str, str]]) -> None:
        """DebugInfoWriter::write(): the pickle, at ``path`` (written to a temporary name, then renamed)."""
        data = pickle.dumps(self.dump(pg_config))
        tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


RECORDER = FlightRecorder()
