"""A torch.distributed backend that behaves on the CPU side as ProcessGroupNCCL does, running on gloo.

``register()`` adds the backend ``ncclcpu``; ``init_process_group("ncclcpu")`` then makes it the default,
so every group megatron-core creates without ``backend="gloo"`` is one of these. Each call from
torch.distributed (megatron's own calls included) is handled as ProcessGroupNCCL handles it:

* The op is recorded in the Flight Recorder (``recorder.py``) on the calling thread, with NCCL's
  profiling name, sequence numbers and the caller's Python stack, then queued on the rank's device
  stream (``device.py``) and the call returns. A synchronous collective returns no work at all (as
  NCCL does since torch 2.8), an asynchronous one a work whose ``wait()`` does not block the CPU
  (on NCCL it only orders the current stream after the collective).
* What blocks the CPU on NCCL blocks here: ``barrier()`` (NCCL's all_reduce of one element, then a
  stream sync; here a wait on a future, whatever ``--sync`` says), the collectives inside ``*_object``
  functions (NCCL syncs on their ``.item()``), and, with ``EAGER_INIT = False``, the communicator
  creation on a group's first op (ncclCommInitRank; here the gloo group is built then, which waits for
  every member the same way, and shows frames of this module above torch.distributed's).
* The stream runs each collective on the group's real gloo communicator. First the members all-gather
  what they are about to run (op, sizes, dtype): on a mismatch the stream waits forever, and while a
  member has not launched it, the stream waits in that all-gather. NCCL kernels of different
  collectives do not complete each other; gloo alone would pair them by tag and return garbage.
* The watchdog (``watchdog.py``) times the works out, logs, dumps and aborts as NCCL does.

Batched p2p (``batch_isend_irecv``) is recorded as NCCL's coalescing does: each op gets an entry of
its own without events (it stays ``scheduled`` and is never retired) and a ``nccl:coalesced`` entry
closes the batch and carries its state. torch only coalesces for groups that are exactly
``ProcessGroup``; this one is a subclass, so the batch is recognised from the calling
``batch_isend_irecv`` frame and its ``p2p_op_list``.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions, _create_work_from_future
from torch.futures import Future

from device import Stream, close_stream, current_stream
from mtpdiag.fix.verify.gloo_device import gloo_group
from recorder import RECORDER, Entry, ProcessGroupStatus

BACKEND = "ncclcpu"
HERE = str(Path(__file__).resolve().parent)
GLOO_TIMEOUT = timedelta(minutes=30)  # the gloo transport never times out first: the emulated watchdog does
# Create each group's communicator when the group is created (NCCL's eager init, when init_process_group
# gets a device_id) rather than on its first op (NCCL's default, lazy: ncclCommInitRank then blocks the CPU
# until every member gets there).
EAGER_INIT = True
# Python frames of torch.distributed functions that read their collectives' results on the host right away
# (on NCCL through ``.item()``/``.cpu()`` on device tensors): their collectives block the CPU here.
HOST_READERS = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                "all_gather_object_coalesced", "send_object_list", "recv_object_list"}

_LOCAL_IDS = itertools.count()
GROUPS: list[ProcessGroupNCCLOnCPU] = []  # every emulated group of this process, in creation order


@dataclass
class WorkNCCL:
    """What the watchdog knows of a queued op: WorkNCCL's seq_, opType_, numelIn_/numelOut_ and timeout."""

    group: ProcessGroupNCCLOnCPU
    seq: int
    op_type: str
    numel_in: int
    numel_out: int
    timeout_ms: int
    entry: Entry | None
    started: float = field(default_factory=time.monotonic)  # workStartTime_: when the op was queued
    done: bool = False
    timed_out: bool = False

    def describe(self) -> str:
        """WorkNCCL's operator<< (ProcessGroupNCCL.cpp)."""
        return (f"WorkNCCL(SeqNum={self.seq}, OpType={self.op_type}, NumelIn={self.numel_in}, "
                f"NumelOut={self.numel_out}, Timeout(ms)={self.timeout_ms})")


def _frames() -> list[dict]:
    """The issuing thread's Python stack, innermost first, without this module's frames: what
    CapturedTraceback::gather(python=true) sees when ProcessGroupNCCL records from C++."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(HERE):
        frame = frame.f_back
    out = []
    while frame is not None:
        out.append({"name": frame.f_code.co_name, "filename": frame.f_code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return out


def _caller_named(names: set[str], depth: int = 6):
    """The nearest torch.distributed frame among the callers whose function is in ``names``."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_code.co_name in names and frame.f_code.co_filename == c10d.__file__:
            return frame
        frame = frame.f_back
    return None


def _done_work(result: list[torch.Tensor]):
    """A work whose wait() returns at once (NCCL's wait only orders the current stream)."""
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class ProcessGroupNCCLOnCPU(dist.ProcessGroup):
    """One emulated NCCL group: records, queues and (lazily) owns a gloo communicator of the same members."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str, global_ranks: list[int]):
        super().__init__(rank, size)
        self.local_id = next(_LOCAL_IDS)  # ProcessGroupNCCL::local_id_ (process_group_id++ in the constructor)
        self.store = store
        self.name = group_name            # pg_uid_: c10d's group name, the same on every member
        self.global_ranks = global_ranks
        self.timeout_ms = int(timeout.total_seconds() * 1000)
        self.status = ProcessGroupStatus()
        self.works: list[WorkNCCL] = []   # workMetaList_: queued, not yet retired
        self.works_lock = threading.Lock()
        self.seq_collective = 0
        self.seq_p2p = 0
        self.op_id = 0
        self._comm = None
        self._batch: dict | None = None
        GROUPS.append(self)
        if EAGER_INIT:
            self.communicator()

    # ------------------------------------------------------------------ identity

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    @property
    def desc(self) -> str:
        return self.group_desc or "undefined"

    def log_prefix(self) -> str:
        """ProcessGroupNCCL::logPrefix()."""
        return f"[PG ID {self.local_id} PG GUID {self.name}({self.desc}) Rank {self.rank()}] "

    def pg_config(self) -> dict[str, str]:
        """getPgConfig(): name, desc and ranks_str(global ranks), as record_pg_ranks() stored them."""
        return {"name": self.name, "desc": self.desc, "ranks": "[" + ", ".join(map(str, self.global_ranks)) + "]"}

    def communicator(self):
        """getNCCLComm(): the communicator is created on the group's first op and blocks until every
        member creates it (ncclCommInitRank); gloo's constructor connects its members the same way."""
        if self._comm is None:
            self._comm = gloo_group(self.store, self.rank(), self.size(), GLOO_TIMEOUT)  # on the rank's one device
        return self._comm

    # ------------------------------------------------------------------ recording and queueing

    def _record(self, profiling_name: str, inputs, outputs, *, is_p2p: bool, has_events: bool = True) -> Entry | None:
        return RECORDER.record(pg_id=self.local_id, status=self.status, inputs=inputs, outputs=outputs,
                               frames=_frames(), process_group=(self.name, self.desc),
                               collective_seq_id=self.seq_collective, p2p_seq_id=self.seq_p2p, op_id=self.op_id,
                               profiling_name=profiling_name, timeout_ms=self.timeout_ms, is_p2p=is_p2p,
                               has_events=has_events)

    def _queue(self, work: WorkNCCL, run: Callable[[object], None], stream: Stream, result=None):
        """workEnqueue(): the work joins the watchdog's list and the stream. ``result`` (a Future) is
        completed when the stream has run it, for the ops that block the CPU."""
        comm = self.communicator()
        with self.works_lock:
            self.works.append(work)
        self.status.last_enqueued = work.seq

        def done() -> None:
            RECORDER.complete(work.entry)
            with self.works_lock:
                work.done = True
                if work in self.works:
                    self.works.remove(work)
            if not work.timed_out:
                self.status.last_completed = work.seq
            if result is not None:
                result.set_result([])

        stream.launch(lambda: run(comm), done)

    def _collective(self, name: str, op_type: str, inputs, outputs, run, blocking: bool = False):
        self.seq_collective += 1
        self.op_id += 1
        entry = self._record(f"nccl:{name}", inputs, outputs, is_p2p=False)
        work = WorkNCCL(self, self.seq_collective, op_type, sum(t.numel() for t in inputs),
                        sum(t.numel() for t in outputs), self.timeout_ms, entry)
        signature = torch.tensor([zlib.crc32(name.encode()), work.numel_in, work.numel_out,
                                  zlib.crc32(",".join(str(t.dtype) for t in inputs).encode())], dtype=torch.int64)

        def launch(comm) -> None:
            self._rendezvous(comm, signature)
            run(comm)

        blocking = blocking or _caller_named(HOST_READERS) is not None
        fut: Future | None = Future() if blocking else None
        self._queue(work, launch, current_stream(), fut)
        return fut

    def _rendezvous(self, comm, signature: torch.Tensor) -> None:
        """Before a collective runs, its members all-gather what they are about to run (op, sizes, dtype)
        on the group's communicator. If one launched a different collective, the stream stalls for
        good: NCCL kernels of mismatched collectives do not complete each other."""
        seen = [torch.empty_like(signature) for _ in range(self.size())]
        comm.allgather([seen], [signature]).wait()
        if any(not torch.equal(other, signature) for other in seen):
            threading.Event().wait()

    def _result(self, fut: Future | None, tensors, async_op: bool):
        if fut is not None:  # blocks the CPU: distributed_c10d waits on it
            return _create_work_from_future(fut)
        return _done_work(tensors) if async_op else None

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        fut = self._collective("all_reduce", "ALLREDUCE", tensors, tensors,
                               lambda comm: comm.allreduce(tensors, opts).wait())
        return self._result(fut, tensors, opts.asyncOp)

    def barrier(self, opts=None):
        """ProcessGroupNCCL::barrier: an all_reduce of one float ("nccl:all_reduce_barrier", OpType
        ALLREDUCE); the caller's wait() then synchronizes the stream, so it blocks the CPU."""
        opts = opts or dist.BarrierOptions()
        one = torch.zeros(1)
        fut = self._collective("all_reduce_barrier", "ALLREDUCE", [one], [one],
                               lambda comm: comm.allreduce([one]).wait(), blocking=not opts.asyncOp)
        return self._result(fut, [one], opts.asyncOp)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        fut = self._collective("broadcast", "BROADCAST", tensors, tensors,
                               lambda comm: comm.broadcast(tensors, opts).wait())
        return self._result(fut, tensors, opts.asyncOp)

    def allgather(self, output_lists, inputs, opts=None):
        """NCCL records the outputs as one flattened [world, *shape] tensor (newLikeFlat)."""
        opts = opts or AllgatherOptions()
        flat = [torch.stack(outs) if outs else torch.empty(0) for outs in output_lists]
        fut = self._collective("all_gather", "ALLGATHER", inputs, flat,
                               lambda comm: comm.allgather(output_lists, inputs, opts).wait())
        return self._result(fut, inputs, opts.asyncOp)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        """all_gather_into_tensor: ProcessGroupNCCL::_allgather_base, "nccl:_all_gather_base"."""
        opts = opts or AllgatherOptions()
        fut = self._collective("_all_gather_base", "_ALLGATHER_BASE", [input], [output],
                               lambda comm: comm._allgather_base(output, input, opts).wait())
        return self._result(fut, [output], opts.asyncOp)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        """reduce_scatter_tensor: ProcessGroupNCCL::_reduce_scatter_base, "nccl:_reduce_scatter_base"."""
        opts = opts or ReduceScatterOptions()
        fut = self._collective("_reduce_scatter_base", "_REDUCE_SCATTER_BASE", [input], [output],
                               lambda comm: comm._reduce_scatter_base(output, input, opts).wait())
        return self._result(fut, [output], opts.asyncOp)

    # ------------------------------------------------------------------ point to point

    def send(self, tensors, dst: int, tag: int = 0):
        return self._p2p("send", f"nccl:send {self.rank()}->{dst}", "SEND", tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._p2p("recv", f"nccl:recv {self.rank()}<-{src}", "RECV", tensors, src, tag)

    def _p2p(self, kind: str, profiling_name: str, op_type: str, tensors, peer: int, tag: int):
        """pointToPoint(): a lone op is a work of its own; inside batch_isend_irecv it joins the batch."""
        batch_frame = _caller_named({"batch_isend_irecv"})
        if batch_frame is None:
            self.seq_p2p += 1
            self.op_id += 1
            entry = self._record(profiling_name, tensors, tensors, is_p2p=True)
            work = WorkNCCL(self, self.seq_p2p, op_type, tensors[0].numel(), tensors[0].numel(),
                            self.timeout_ms, entry)
            self._queue(work, lambda comm: getattr(comm, kind)(tensors, peer, tag).wait(), current_stream())
            return _done_work(tensors)
        if self._batch is None or self._batch["frame"] is not batch_frame:
            # startCoalescing(): one p2p sequence number for the whole batch
            self.seq_p2p += 1
            self._batch = {"frame": batch_frame, "left": len(batch_frame.f_locals["p2p_op_list"]), "ops": []}
        self.op_id += 1
        self._record(profiling_name, tensors, tensors, is_p2p=True, has_events=False)
        self._batch["ops"].append((kind, tensors, peer, tag))
        self._batch["left"] -= 1
        if self._batch["left"] == 0:
            self._end_batch()
        return _done_work(tensors)

    def _end_batch(self) -> None:
        """endCoalescing(): a "nccl:coalesced" entry (no tensors, the last op_id) and one work for the batch."""
        ops, self._batch = self._batch["ops"], None
        entry = self._record("nccl:coalesced", [], [], is_p2p=True)
        work = WorkNCCL(self, self.seq_p2p, "COALESCED", 0, 0, self.timeout_ms, entry)

        def run(comm) -> None:
            for pending in [getattr(comm, kind)(tensors, peer, tag) for kind, tensors, peer, tag in ops]:
                pending.wait()

        self._queue(work, run, current_stream())


def _create(backend_opts, _pg_options) -> ProcessGroupNCCLOnCPU:
    """Backend creator (extended API): the group's name and global ranks come with the options."""
    ranks = list(backend_opts.global_ranks_in_group) or list(range(backend_opts.group_size))
    group = ProcessGroupNCCLOnCPU(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                                  backend_opts.timeout, backend_opts.group_id, ranks)
    if group.local_id == 0:
        import watchdog  # the default group starts the process's watchdog/monitor, as PG 0 does in NCCL

        watchdog.start(group)
    return group


def register() -> None:
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


def destroy() -> None:
    """destroy_process_group(), after the emulated watchdog and stream threads have ended (no-op on gloo)."""
    import watchdog

    watchdog.stop()
    close_stream()
    dist.destroy_process_group()
