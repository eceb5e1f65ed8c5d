"""Where a rank is stuck when it is in no collective: a host sync, a lock, I/O, a data loader, a sleep.

On NCCL a collective only enqueues a kernel; the rank then blocks at the next host sync (``.item()``,
``.cpu()``, ``torch.cuda.synchronize()``), a C call that leaves no Python frame of its own, and CUDA usually
spins there. So "in no collective" is not "running". This module reads every piece of evidence a capture has,
strongest first, and says what the rank waits on and how sure that is:

* Python frames of torch and the stdlib (``torch.cuda.synchronize``, ``threading.Condition.wait``, the
  DataLoader's ``_get_data``, ``socket.recv``) — certain;
* native frames from ``--native`` dumps (``cudaStreamSynchronize``, ``ncclCommInitRank``, ``PyThread_acquire_lock``,
  ``clock_nanosleep``) — certain, but never the call site;
* the process state (D: uninterruptible sleep in the kernel) and the system call the main thread sits in
  (``/proc/PID/syscall``: futex, clock_nanosleep, epoll_wait, read, write; "running" when on the CPU);
* what the innermost Python line calls, read from the target's source at capture time (``item``,
  ``synchronize``, ``acquire``, ``sleep``, ``write``);
* py-spy's idle/active flag, and whether the process maps CUDA/NCCL libraries.

Pure: no I/O. ``kind`` is a ``WaitKind``; ``confidence`` is certain, likely or possible.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mtpdiag.model import STATE_DISK, Frame, RankCapture, ThreadStack, WaitState
from mtpdiag.vocabulary.ops import COMM_INIT_OPS
from mtpdiag.vocabulary.stacks import is_plumbing, short_name, slash_path
from mtpdiag.vocabulary.waits import CALL_KINDS, Confidence, WaitKind

# Python functions (by file suffix and function name) that are the wait itself.
_PY_WAITS: tuple[tuple[str, frozenset[str], WaitKind], ...] = (
    ("torch/cuda/__init__.py", frozenset({"synchronize"}), WaitKind.HOST_SYNC),
    (
        "torch/cuda/streams.py",
        frozenset({"synchronize", "Stream.synchronize", "Event.synchronize", "query"}),
        WaitKind.HOST_SYNC,
    ),
    (
        "torch/distributed/distributed_c10d.py",
        frozenset({"_store_based_barrier", "_new_process_group_helper", "_create_process_group_wrapper"}),
        WaitKind.COMM_INIT,
    ),
    ("torch/distributed/rendezvous.py", frozenset(), WaitKind.COMM_INIT),
    (
        "threading.py",
        frozenset(
            {
                "wait",
                "acquire",
                "join",
                "_wait_for_tstate_lock",
                "Condition.wait",
                "Event.wait",
                "Semaphore.acquire",
                "Thread.join",
                "Barrier.wait",
            }
        ),
        WaitKind.LOCK,
    ),
    ("queue.py", frozenset({"get", "put", "Queue.get", "Queue.put"}), WaitKind.LOCK),
    ("concurrent/futures/_base.py", frozenset({"result", "wait", "Future.result"}), WaitKind.LOCK),
    ("multiprocessing/synchronize.py", frozenset(), WaitKind.LOCK),
    ("multiprocessing/queues.py", frozenset({"get", "Queue.get", "put", "Queue.put"}), WaitKind.LOCK),
    ("multiprocessing/connection.py", frozenset(), WaitKind.IO),
    ("socket.py", frozenset(), WaitKind.IO),
    ("ssl.py", frozenset(), WaitKind.IO),
    ("selectors.py", frozenset(), WaitKind.IO),
    (
        "subprocess.py",
        frozenset(
            {
                "wait",
                "_wait",
                "communicate",
                "Popen.wait",
                "Popen._wait",
                "Popen.communicate",
                "_try_wait",
                "Popen._try_wait",
            }
        ),
        WaitKind.IO,
    ),
    ("http/client.py", frozenset(), WaitKind.IO),
    ("asyncio/base_events.py", frozenset({"_run_once", "BaseEventLoop._run_once"}), WaitKind.IO),
)
# A DataLoader frame anywhere above a wait means the rank waits for a batch.
_DATALOADER = "torch/utils/data/dataloader.py"
_DATALOADER_WAITS = frozenset(
    {
        "_get_data",
        "_try_get_data",
        "_next_data",
        "__next__",
        "_MultiProcessingDataLoaderIter._get_data",
        "_MultiProcessingDataLoaderIter._try_get_data",
        "_MultiProcessingDataLoaderIter._next_data",
        "_BaseDataLoaderIter.__next__",
    }
)

# Native symbols (C/C++), innermost first wins. Patterns are searched in the function name and the module.
_NATIVE_WAITS: tuple[tuple[re.Pattern[str], WaitKind], ...] = tuple(
    (re.compile(p), kind)
    for p, kind in (
        (
            r"cu(da)?(Stream|Event|Device|Ctx)Synchronize|cuMemcpyDtoH|cudaMemcpy(?!Async)|_local_scalar_dense|"
            r"cudaStreamQuery|cuStreamQuery|c10::cuda::.*(synchronize|memcpy)",
            WaitKind.HOST_SYNC,
        ),
        (r"ncclCommInit|ncclCommSplit|getNCCLComm|initNCCLComm|ncclGetUniqueId", WaitKind.COMM_INIT),
        (
            r"c10d::.*(Work|Gloo|NCCL).*::(wait|synchronize)|gloo::.*(allreduce|allgather|broadcast|barrier|"
            r"reduce_scatter|alltoall)",
            WaitKind.COLLECTIVE,
        ),
        (r"nanosleep|usleep|\bpysleep|time_sleep", WaitKind.SLEEP),
        (
            r"epoll_wait|\bpoll\b|\bselect\b|recv|accept|connect|sock_|__libc_read|\bread\b|\bwrite\b|__libc_write|"
            r"fsync|fdatasync|pwrite|pread",
            WaitKind.IO,
        ),
        (
            r"PyThread_acquire_lock|pthread_cond_(timed)?wait|pthread_mutex_lock|sem_(timed)?wait|__lll_lock_wait|"
            r"futex|std::condition_variable",
            WaitKind.LOCK,
        ),
    )
)

# What a syscall the main thread sits in says (from /proc/PID/syscall), and how sure it makes us.
_SYSCALL_KINDS = {
    **dict.fromkeys(("futex",), WaitKind.LOCK),
    # restart_syscall: a sleep (or wait) resumed after a signal, such as an earlier py-spy attach
    **dict.fromkeys(("restart_syscall", "clock_nanosleep", "nanosleep"), WaitKind.SLEEP),
    **dict.fromkeys(
        (
            "epoll_wait",
            "epoll_pwait",
            "epoll_pwait2",
            "poll",
            "ppoll",
            "select",
            "pselect6",
            "read",
            "pread64",
            "readv",
            "recvfrom",
            "recvmsg",
            "write",
            "pwrite64",
            "writev",
            "sendto",
            "sendmsg",
            "fsync",
            "fdatasync",
            "openat",
            "accept",
            "accept4",
            "connect",
            "wait4",
            "waitid",
            "ioctl",
        ),
        WaitKind.IO,
    ),
}
# Lines that call these and block are NCCL's (or a DDP bucket's) CPU-side waits for a collective.
_WORK_WAITS = frozenset({"wait"})


def python_frames(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The Python frames of a stack (``--native`` dumps interleave C frames)."""
    if not any(f.native for f in frames):
        return tuple(frames)
    return tuple(f for f in frames if not f.native)


def _python_wait(frames: Sequence[Frame]) -> tuple[WaitKind, str] | None:
    """(kind, evidence) from the innermost Python frames that are a wait of torch or the stdlib."""
    for i, frame in enumerate(frames):
        path = slash_path(frame.file)
        if path.endswith("/" + _DATALOADER) and (
            frame.function in _DATALOADER_WAITS or short_name(frame.function) in _DATALOADER_WAITS
        ):
            return WaitKind.DATA_LOADER, f"DataLoader {short_name(frame.function)} frame"
        for suffix, functions, kind in _PY_WAITS:
            if path.endswith("/" + suffix) and (
                not functions or frame.function in functions or short_name(frame.function) in functions
            ):
                if kind in (WaitKind.LOCK, WaitKind.IO) and any(
                    slash_path(f.file).endswith("/" + _DATALOADER) for f in frames[i:]
                ):
                    return WaitKind.DATA_LOADER, f"{short_name(frame.function)} under a DataLoader frame"
                return kind, f"{short_name(frame.function)} in {suffix.rsplit('/', 1)[-1]}"
        if not is_plumbing(path):
            return None  # the innermost user frame: whatever waits below it is a C call
    return None


def _native_wait(frames: Sequence[Frame]) -> tuple[WaitKind, str] | None:
    for frame in frames:
        if not frame.native:
            continue
        text = f"{frame.function} {frame.file}"
        for pattern, kind in _NATIVE_WAITS:
            if pattern.search(text):
                return kind, f"native frame {frame.function}"
    return None


def _call_wait(calls: Sequence[str]) -> tuple[WaitKind, str] | None:
    kinds = [(k, c) for c in calls if (k := CALL_KINDS.get(c))]
    for wanted in (WaitKind.HOST_SYNC, WaitKind.LOCK, WaitKind.SLEEP, WaitKind.IO):
        for kind, call in kinds:
            if kind == wanted:
                return kind, f"the line calls .{call}()" if kind == WaitKind.HOST_SYNC else f"the line calls {call}()"
    return None


def wait_state(
    capture: RankCapture, thread: ThreadStack | None, op: str | None, side_thread: str | None = None
) -> WaitState | None:
    """What ``capture``'s rank waits on. ``op`` is its collective (from ``thread``, or from the side thread
    named ``side_thread``), None when it is in none. None when nothing could be read.

    The evidence is read strongest first: the frames (Python, then native), D state, what the blocked line
    calls, the system call the main thread sits in, then py-spy's idle/active flag."""
    if op is not None:
        return _collective_wait(thread, op, side_thread)
    if thread is None:
        return None
    python = python_frames(thread.frames)
    syscall = capture.main_syscall if _is_main(capture, thread) else None
    return (
        _frames_wait(thread, python)
        or _disk_wait(capture)
        or _called_wait(capture, thread, syscall)
        or _syscall_wait(thread, syscall)
        or _flag_wait(capture, thread, python, syscall)
    )


def _collective_wait(thread: ThreadStack | None, op: str, side_thread: str | None) -> WaitState:
    kind = WaitKind.COMM_INIT if op in COMM_INIT_OPS else WaitKind.COLLECTIVE
    seen = [f"torch.distributed {op} frame" + (f" on thread {side_thread!r}" if side_thread else "")]
    if thread is not None:
        seen += _quiet_or_busy(thread)
    return WaitState(kind, Confidence.CERTAIN, tuple(seen), side_thread)


def _frames_wait(thread: ThreadStack, python: Sequence[Frame]) -> WaitState | None:
    """A wait the stack's own frames name: a native wait frame (which wins over a Python one of another kind
    only at a host sync), else a torch or stdlib Python frame."""
    found = _python_wait(python)
    native = _native_wait(thread.frames)
    if native is not None and (found is None or native[0] == WaitKind.HOST_SYNC or found[0] == native[0]):
        kind, why = native
        evidence = [why]
        calls = _call_wait(thread.calls)
        if calls is not None and calls[0] == kind:
            evidence.append(calls[1])
        return WaitState(kind, Confidence.CERTAIN, tuple(evidence + _quiet_or_busy(thread)))
    if found is not None:
        kind, why = found
        return WaitState(kind, Confidence.CERTAIN, (why, *_quiet_or_busy(thread)))
    return None


def _disk_wait(capture: RankCapture) -> WaitState | None:
    if (capture.state or "").strip() != STATE_DISK:
        return None
    return WaitState(
        WaitKind.IO,
        Confidence.CERTAIN,
        ("state D: uninterruptible sleep in the kernel (a file system or a device)",),
    )


def _called_wait(capture: RankCapture, thread: ThreadStack, syscall: str | None) -> WaitState | None:
    """What the blocked line calls (read from the target's file at capture time), with the system call as
    support; a system call of another kind makes it only possible."""
    calls = _call_wait(thread.calls)
    if calls is None:
        return None
    kind, why = calls
    evidence = [why]
    if kind == WaitKind.HOST_SYNC and capture.cuda:
        evidence.append("the process maps CUDA")
    if syscall is not None:
        evidence.append(_syscall_words(syscall))
    confidence = Confidence.LIKELY
    if kind != WaitKind.HOST_SYNC and syscall is not None and _SYSCALL_KINDS.get(syscall) not in (kind, None):
        confidence = Confidence.POSSIBLE
    return WaitState(kind, confidence, tuple(evidence + _flag(thread)))


def _syscall_wait(thread: ThreadStack, syscall: str | None) -> WaitState | None:
    if syscall is None or syscall == "running":
        return None
    kind = _SYSCALL_KINDS.get(syscall, WaitKind.UNKNOWN)
    return WaitState(
        kind,
        Confidence.LIKELY if kind != WaitKind.UNKNOWN else Confidence.POSSIBLE,
        (_syscall_words(syscall), *_flag(thread)),
    )


def _flag_wait(capture: RankCapture, thread: ThreadStack, python: Sequence[Frame], syscall: str | None) -> WaitState:
    """The weakest evidence: whether py-spy saw the thread on the CPU, and whether the process maps CUDA."""
    if capture.cuda and thread.active is not False and not _in_library(python):
        return WaitState(
            WaitKind.HOST_SYNC,
            Confidence.POSSIBLE,
            (
                "on the CPU at a line of its own in a process that maps CUDA: CUDA spins while it waits for the device",
                *_flag(thread),
            ),
        )
    if thread.active is False:
        return WaitState(
            WaitKind.UNKNOWN,
            Confidence.LIKELY,
            ("idle in a C call (py-spy): blocked, on what the Python stack does not say",),
        )
    if thread.active is True:
        sure = Confidence.LIKELY if syscall == "running" else Confidence.POSSIBLE
        return WaitState(
            WaitKind.RUNNING,
            sure,
            tuple(["on the CPU (py-spy active)"] + ([_syscall_words(syscall)] if syscall else [])),
        )
    return WaitState(WaitKind.UNKNOWN, Confidence.POSSIBLE, ("no idle/active flag and no system call in the capture",))


def _is_main(capture: RankCapture, thread: ThreadStack) -> bool:
    return capture.main_thread is thread


def _in_library(frames: Sequence[Frame]) -> bool:
    """The innermost Python frame is torch's own Python code (a module's forward launching kernels)."""
    return bool(frames) and "/torch/" in slash_path(frames[0].file)


def _flag(thread: ThreadStack) -> list[str]:
    if thread.active is True:
        return ["on the CPU (py-spy active)"]
    if thread.active is False:
        return ["idle (py-spy)"]
    return []


def _quiet_or_busy(thread: ThreadStack) -> list[str]:
    return _flag(thread)


def _syscall_words(syscall: str) -> str:
    if syscall == "running":
        return "not in a system call (on the CPU)"
    return f"in the {syscall} system call"


def is_stuck(wait: WaitState | None) -> bool:
    """Whether the evidence shows a rank that waits rather than one that runs user code."""
    return wait is not None and not (wait.kind == WaitKind.RUNNING and wait.confidence != Confidence.POSSIBLE)
