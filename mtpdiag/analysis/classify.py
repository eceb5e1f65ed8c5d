"""What one rank is doing: the collective it waits in, where it was called from, and its state.

A stack (innermost frame first) is read from the inside out. The innermost run of library frames
(torch, and generic decorator plumbing such as functools/contextlib/typing_extensions) is the
"torch block". If that block holds a ``torch/distributed`` frame, the rank waits in a collective:
its op is the outermost public c10d function in the block (``all_gather_object`` rather than the
``all_gather`` it calls), and its call site is the first frame outside the block, or, where that frame is a
helper in the file of a function the known-site table names (megatron's ``_build_key_size_numel_dictionaries``
for ``broadcast_data``), that function. Otherwise the rank is running and its site is its innermost frame
outside library and stdlib internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import msgspec

from mtpdiag.analysis.known_sites import lookup
from mtpdiag.model import (
    STATE_DISK,
    STATE_GONE,
    STATE_STOPPED,
    STATE_UNREADABLE,
    STATE_ZOMBIE,
    Frame,
    RankCapture,
    Site,
    ThreadStack,
)
from mtpdiag.vocabulary.ops import KNOWN_OPS, RECV_OPS, SEND_OPS, WAIT_OP
from mtpdiag.vocabulary.stacks import call_site_frame, is_torch_distributed, short_name, slash_path, torch_block_end
from mtpdiag.vocabulary.states import RankState


class Classified(msgspec.Struct, frozen=True):
    """One rank's main-thread reading. ``op`` None means it is in no collective."""

    op: str | None
    site: Site | None
    peer: int | None = None  # dst/src of a send/recv, from the torch frame's arguments
    peer_frame: int | None = None  # which of the Python frames names the op, for a send/recv (``peer_of``)


class StateReading(msgspec.Struct, frozen=True):
    """The report's state word for a rank, and why, when that is not obvious."""

    state: RankState
    error: str | None = None


def site_of(frame: Frame) -> Site:
    return Site(file=frame.file, line=frame.line, function=frame.function)


def _call_site(frames: Sequence[Frame]) -> Site | None:
    frame = call_site_frame(frames)
    return site_of(frame) if frame is not None else None


def _collective_site(frames: Sequence[Frame]) -> Site | None:
    """A collective's call site; where that frame is a helper in the file of a known function that called it
    (megatron's ``_build_key_size_numel_dictionaries`` for ``broadcast_data``), the known function: the
    collective is the one the known site issues, on the group the table knows, and a person knows its name."""
    frame = call_site_frame(frames)
    if frame is None:
        return None
    site = site_of(frame)
    if lookup(site) is not None:
        return site
    at = next(i for i, f in enumerate(frames) if f is frame)
    for outer in frames[at + 1 :]:
        if slash_path(outer.file) != slash_path(frame.file):
            break
        row = lookup(site_of(outer))
        if row is not None and row.function is not None:
            return site_of(outer)
    return site


def _op_of(block: Sequence[Frame]) -> tuple[str, int]:
    """The op named by a torch block (innermost first) and the index of the frame that names it."""
    distributed = [(i, f) for i, f in enumerate(block) if is_torch_distributed(f)]
    public = [(i, f) for i, f in distributed if "." not in f.function and f.function in KNOWN_OPS]
    if public:
        return public[-1][1].function, public[-1][0]
    for i, f in distributed:
        name = short_name(f.function)
        if name in ("wait", "wait_tensor", "_wait") or name.startswith("wait_"):
            return WAIT_OP, i
    return short_name(distributed[0][1].function), distributed[0][0]


def peer_of(op: str, frame: Frame) -> int | None:
    """The peer a send (``dst``) or recv (``src``) frame names."""
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
    block_end = torch_block_end(frames)
    block = frames[:block_end]
    if any(is_torch_distributed(f) for f in block):
        op, at = _op_of(block)
        p2p = op in SEND_OPS or op in RECV_OPS
        site = _collective_site(frames)
        return Classified(op=op, site=site, peer=peer_of(op, frames[at]), peer_frame=at if p2p else None)
    if not block and active is False:
        # An idle thread whose innermost frame is code known to wait on Work handles itself
        # (megatron's p2p `_communicate` calling req.wait()) is blocked in a bare Work.wait.
        known = lookup(site_of(frames[0]))
        if known is not None and known.waits:
            return Classified(op=WAIT_OP, site=site_of(frames[0]))
    return Classified(op=None, site=_call_site(frames))


def classify_thread(thread: ThreadStack) -> Classified:
    """``classify_stack`` of a thread's Python frames: native frames are evidence, never the call site."""
    return classify_stack(_python_frames(thread.frames), thread.active)


def _python_frames(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    return tuple(f for f in frames if not f.native) if any(f.native for f in frames) else frames


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


def rank_state(capture: RankCapture, classified: Classified, waiting: bool = False) -> StateReading:
    """Map the /proc state and the reading onto the report's state words (``waiting``: the wait state
    says the rank is blocked outside any collective)."""
    letter = (capture.state or "").strip()
    if letter == STATE_GONE or letter == STATE_ZOMBIE:
        return StateReading(RankState.GONE, capture.error or ("zombie process" if letter == STATE_ZOMBIE else None))
    if letter.upper() == STATE_STOPPED:
        return StateReading(RankState.STOPPED, capture.error or f"state {letter}")
    if letter == STATE_DISK:
        return StateReading(RankState.STOPPED, capture.error or "state D, uninterruptible sleep")
    if letter == STATE_UNREADABLE or capture.main_thread is None:
        return StateReading(RankState.UNREADABLE, capture.error or "no stack could be read")
    if classified.op is not None:
        return StateReading(RankState.COLLECTIVE, capture.error)
    return StateReading(RankState.WAITING if waiting else RankState.RUNNING, capture.error)
