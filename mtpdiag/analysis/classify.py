"""What one rank is doing: the collective it waits in, where it was called from, and its state.

A stack (innermost frame first) is read from the inside out. The innermost run of library frames
(torch, and generic decorator plumbing such as functools/contextlib/typing_extensions) is the
"torch block". If that block holds a ``torch/distributed`` frame, the rank waits in a collective:
its op is the outermost public c10d function in the block (``all_gather_object`` rather than the
``all_gather`` it calls), and its call site is the first frame outside the block. Otherwise the rank
is running and its site is its innermost frame outside library and stdlib internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from mtpdiag.analysis.known_sites import lookup
from mtpdiag.model import STATE_DISK, STATE_STOPPED, STATE_ZOMBIE, Frame, RankCapture, Site, ThreadStack

# Public torch.distributed functions a rank can block in (torch's own names; the report's op names).
KNOWN_OPS = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
    "all_gather_object", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "send", "recv", "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv",
    "all_to_all", "all_to_all_single", "reduce", "gather", "gather_object", "scatter",
    "scatter_object_list", "init_process_group", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "split_group", "destroy_process_group", "init_device_mesh",
})
# Ops with one peer rather than a group.
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list"})
SEND_OPS = frozenset({"send", "isend", "send_object_list"})
RECV_OPS = frozenset({"recv", "irecv", "recv_object_list"})
BARRIER_OPS = frozenset({"barrier", "monitored_barrier"})
WAIT_OP = "wait"

# Files whose frames are plumbing between a collective and the code that called it.
_WRAPPER_FILES = ("/functools.py", "/contextlib.py", "/typing_extensions.py", "/typing.py")
# Stdlib modules whose frames are never the interesting part of a running rank's stack.
_STDLIB_INTERNALS = frozenset({
    "threading", "queue", "selectors", "socket", "subprocess", "multiprocessing", "concurrent",
    "asyncio", "contextlib", "functools", "runpy", "ssl", "http", "urllib", "logging", "tempfile",
})


@dataclass(frozen=True)
class Classified:
    """One rank's main-thread reading. ``op`` None means it is in no collective."""

    op: str | None
    site: Site | None
    peer: int | None = None  # dst/src of a send/recv, from the torch frame's arguments


@dataclass(frozen=True)
class RankState:
    """The report's state word for a rank, and why, when that is not obvious."""

    state: str  # collective | waiting | running | stopped | gone | unreadable
    error: str | None = None


def _path(file: str) -> str:
    return "/" + file.replace("\\", "/").lstrip("/")


def is_torch_distributed(frame: Frame) -> bool:
    return "/torch/distributed/" in _path(frame.file)


def _is_wrapper(frame: Frame) -> bool:
    """torch itself, or decorator plumbing: never the call site a person wants to see."""
    path = _path(frame.file)
    return "/torch/" in path or path.endswith(_WRAPPER_FILES)


def _is_stdlib_internal(frame: Frame) -> bool:
    path = _path(frame.file)
    if "/site-packages/" in path or "/dist-packages/" in path:
        return False
    parts = path.strip("/").split("/")
    for i, part in enumerate(parts):  # ".../lib/python3.11/threading.py" -> "threading"
        if part.startswith("python3") and i + 1 < len(parts):
            parts = parts[i + 1:]
            break
    head = parts[0].removesuffix(".py") if parts else ""
    return head in _STDLIB_INTERNALS


def short_name(function: str) -> str:
    """``MTPLossLoggingHelper.reduce_loss_in_tracker`` -> ``reduce_loss_in_tracker``."""
    return function.rsplit(".", 1)[-1]


def site_of(frame: Frame) -> Site:
    return Site(file=frame.file, line=frame.line, function=frame.function)


def _op_of(block: Sequence[Frame]) -> tuple[str, Frame]:
    """The op named by a torch block (innermost first) and the frame that names it."""
    distributed = [f for f in block if is_torch_distributed(f)]
    public = [f for f in distributed if "." not in f.function and f.function in KNOWN_OPS]
    if public:
        return public[-1].function, public[-1]
    for f in distributed:
        name = short_name(f.function)
        if name in ("wait", "wait_tensor", "_wait") or name.startswith("wait_"):
            return WAIT_OP, f
    return short_name(distributed[0].function), distributed[0]


def _peer_of(op: str, frame: Frame) -> int | None:
    if op in SEND_OPS:
        return frame.arg("dst")
    if op in RECV_OPS:
        return frame.arg("src")
    return None


@lru_cache(maxsize=1024)
def classify_stack(frames: tuple[Frame, ...], active: bool | None = None) -> Classified:
    """Read a main-thread stack (innermost first) into op, call site and p2p peer.

    Cached: the ranks of a hung job mostly share a handful of stacks.
    """
    if not frames:
        return Classified(op=None, site=None)
    block_end = 0
    while block_end < len(frames) and _is_wrapper(frames[block_end]):
        block_end += 1
    block = frames[:block_end]
    caller = frames[block_end] if block_end < len(frames) else None
    if any(is_torch_distributed(f) for f in block):
        op, op_frame = _op_of(block)
        site = site_of(caller) if caller is not None else site_of(block[-1])
        return Classified(op=op, site=site, peer=_peer_of(op, op_frame))
    innermost_user = next((f for f in frames if not _is_wrapper(f) and not _is_stdlib_internal(f)), frames[0])
    if not block and active is False:
        # An idle thread whose innermost frame is code known to wait on Work handles itself
        # (megatron's p2p `_communicate` calling req.wait()) is blocked in a bare Work.wait.
        known = lookup(site_of(frames[0]))
        if known is not None and known.waits:
            return Classified(op=WAIT_OP, site=site_of(frames[0]))
    return Classified(op=None, site=site_of(innermost_user))


def classify_thread(thread: ThreadStack) -> Classified:
    """``classify_stack`` of a thread's Python frames: native frames are evidence, never the call site."""
    frames = thread.frames
    if any(f.native for f in frames):
        frames = tuple(f for f in frames if not f.native)
    return classify_stack(frames, thread.active)


def classify_capture(capture: RankCapture) -> Classified:
    thread = capture.main_thread
    if thread is None:
        return Classified(op=None, site=None)
    return classify_thread(thread)


def side_collective(capture: RankCapture) -> tuple[ThreadStack, Classified] | None:
    """A thread other than the main one that waits in a collective (DeepSpeed ZeRO-3 gathers parameters on
    an autograd thread while the main thread sits in ``backward``): the rank's collective is that one."""
    main = capture.main_thread
    for thread in capture.threads:
        if thread is main:
            continue
        found = classify_thread(thread)
        if found.op is not None and found.op != WAIT_OP:
            return thread, found
    return None


def rank_state(capture: RankCapture, classified: Classified, waiting: bool = False) -> RankState:
    """Map the /proc state and the reading onto the report's state words (``waiting``: the wait state
    says the rank is blocked outside any collective)."""
    letter = (capture.state or "").strip()
    if letter == "gone" or letter == STATE_ZOMBIE:
        return RankState("gone", capture.error or ("zombie process" if letter == STATE_ZOMBIE else None))
    if letter.upper() == STATE_STOPPED:
        return RankState("stopped", capture.error or f"state {letter}")
    if letter == STATE_DISK:
        return RankState("stopped", capture.error or "state D, uninterruptible sleep")
    if letter == "unreadable" or capture.main_thread is None:
        return RankState("unreadable", capture.error or "no stack could be read")
    if classified.op is not None:
        return RankState("collective", capture.error)
    return RankState("waiting" if waiting else "running", capture.error)
