"""Each rank's view in the report: what it waits in, where, its state and wait, its peer and its coordinates.

The ranks are read by equivalence class, as LLNL STAT does: ranks whose main-thread stack has the same
*shape* (its frames without their arguments: the ranks of a pipeline stage send to as many peers as there
are ranks, from one stack) and whose /proc facts agree show the same op, site, state and wait, so those are
read once per class (``StackReader.views``). What is left for each rank is a few lookups: its stack's index
in the report's ``stacks`` table, its class, its peer (the send's ``dst`` read once per distinct stack, or
the neighbour stage by layout arithmetic) and its coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

import msgspec

from mtpdiag.analysis.classify import (
    Classified,
    classify_capture,
    peer_of,
    rank_state,
    side_collective,
    site_of,
)
from mtpdiag.analysis.known_sites import lookup
from mtpdiag.analysis.mismatch import is_p2p_op
from mtpdiag.analysis.wait import wait_state
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import RankCapture, RankView, Site, Stack, ThreadStack, WaitState
from mtpdiag.vocabulary.states import RankState
from mtpdiag.vocabulary.waits import WaitKind


class Reading(NamedTuple):
    """What every rank of one class shows (``peer_at``: the index of the frame that names a send/recv's peer,
    the same in every stack of the class; ``direction``: ``next``/``prev``, the stage that known pipeline code
    talks to, when the op is p2p)."""

    op: str | None
    site: Site | None
    state: RankState
    error: str | None
    wait: WaitState | None
    peer_at: int | None
    direction: str | None


class StackReader:
    """The report's stack table, and the reading of each class of ranks, built as the ranks are read.

    Stacks are keyed by value (frames are hashable and cache their hash), so whichever reader built the
    frames, a 16k-rank job's ranks fall into a handful of classes.
    """

    def __init__(self, layout: ParallelLayout | None = None) -> None:
        self.layout = layout
        self._ids: dict[Stack, int] = {}
        self._shape_of: list[int] = []  # stack id -> shape id
        self._shapes: dict[Stack, int] = {}
        self._peers: dict[tuple[int, int], int | None] = {}  # (stack id, peer frame) -> the send's dst/recv's src
        self._readings: dict[tuple[object, ...], Reading | None] = {}  # None: read each rank on its own
        self._directions: dict[int, str | None] = {}
        self.states: set[str] = set()  # the /proc state letters of the captures read (a class's key holds one)

    def stack_id(self, frames: Stack) -> int:
        """The index of ``frames`` in the report's stack table (``stacks``), added when new."""
        new = len(self._ids)
        found = self._ids.setdefault(frames, new)
        if found == new:
            shape = tuple([f if f.args is None else msgspec.structs.replace(f, args=None) for f in frames])
            self._shape_of.append(self._shapes.setdefault(shape, len(self._shapes)))
        return found

    def stacks(self) -> tuple[Stack, ...]:
        return tuple(self._ids)

    def views(self, captures: Sequence[RankCapture]) -> list[RankView]:
        """Each capture's view, in order."""
        layout = self.layout
        coords = (
            layout.coords_each(map(attrgetter("rank"), captures)) if layout is not None else repeat(None, len(captures))
        )
        ids, shape_of, readings = self._ids, self._shape_of, self._readings
        out: list[RankView] = []
        for capture, place in zip(captures, coords, strict=True):
            threads = capture.threads
            thread = threads[0] if len(threads) == 1 else capture.main_thread  # one thread is the main one
            if thread is None or not thread.frames:
                out.append(self._one(capture))
                continue
            sid = ids.get(thread.frames)
            if sid is None:
                sid = self.stack_id(thread.frames)
            key = (
                shape_of[sid],
                thread.active,
                thread.calls,
                capture.state,
                capture.error,
                capture.main_syscall,
                capture.cuda,
                len(threads) > 1,
            )
            reading = readings.get(key)
            if reading is None and key not in readings:
                reading = readings[key] = self._read(capture, thread)
                self.states.add(capture.state)
            if reading is None:
                out.append(self._one(capture))
                continue
            rank = capture.rank
            peer = None
            if reading.peer_at is not None:
                peer = self._peer(sid, thread.frames, reading)
            if peer is None and place is not None and reading.direction is not None:
                peer = _pipeline_peer(rank, reading.direction, layout)  # type: ignore[arg-type]
            out.append(
                RankView(
                    rank=rank,
                    pid=capture.pid,
                    host=capture.host,
                    state=reading.state,
                    coords=place,
                    op=reading.op,
                    site=reading.site,
                    stack=sid,
                    peer=peer,
                    error=reading.error,
                    wait=reading.wait,
                )
            )
        return out

    def _read(self, capture: RankCapture, thread: ThreadStack) -> Reading | None:
        """The reading of ``capture``'s class; None when its ranks must be read one by one (a main thread in no
        collective among several threads: the collective may be another thread's)."""
        classified = classify_capture(capture)
        if classified.op is None and len(capture.threads) > 1:
            return None
        wait = wait_state(capture, thread, classified.op)
        state = rank_state(capture, classified, wait is not None and wait.kind != WaitKind.RUNNING)
        p2p = classified.op is not None and is_p2p_op(classified.op, classified.site)
        return Reading(
            op=classified.op,
            site=classified.site,
            state=state.state,
            error=state.error,
            wait=wait,
            peer_at=_frame_index(thread.frames, classified.peer_frame),
            direction=self._direction(self.stack_id(thread.frames), thread.frames) if p2p else None,
        )

    def _peer(self, sid: int, frames: Stack, reading: Reading) -> int | None:
        """The peer a send/recv names in its arguments, read once per distinct stack."""
        key = (sid, reading.peer_at or 0)
        if key not in self._peers:
            self._peers[key] = peer_of(reading.op or "", frames[reading.peer_at or 0])
        return self._peers[key]

    def _direction(self, stack: int, frames: Stack) -> str | None:
        """``next``/``prev``: the neighbour stage that known pipeline code in ``frames`` talks to."""
        shape = self._shape_of[stack]
        if shape not in self._directions:
            self._directions[shape] = next(
                (row.peer for row in map(lookup, map(site_of, frames)) if row is not None and row.peer), None
            )
        return self._directions[shape]

    def _one(self, capture: RankCapture) -> RankView:
        """The view of a rank read on its own: no stack, or a collective that may be on another thread."""
        self.states.add(capture.state)
        thread = capture.main_thread
        stack = self.stack_id(thread.frames) if thread is not None and thread.frames else None
        classified: Classified = classify_capture(capture)
        side_name = None
        if classified.op is None and len(capture.threads) > 1:
            side = side_collective(capture)
            if side is not None:  # the rank's collective runs on another thread: that thread is what matters
                thread, classified = side
                side_name = thread.name or f"thread {thread.thread_id}"
                stack = self.stack_id(thread.frames) if thread.frames else None
        wait = wait_state(capture, thread, classified.op, side_name)
        state = rank_state(capture, classified, wait is not None and wait.kind != WaitKind.RUNNING)
        rank, layout = capture.rank, self.layout
        placed = rank if layout is not None and rank is not None and 0 <= rank < layout.world_size else None
        peer = classified.peer
        if (
            peer is None
            and placed is not None
            and layout is not None
            and stack is not None
            and thread is not None
            and classified.op is not None
            and is_p2p_op(classified.op, classified.site)
        ):
            peer = _pipeline_peer(placed, self._direction(stack, thread.frames), layout)
        return RankView(
            rank=rank,
            pid=capture.pid,
            host=capture.host,
            state=state.state,
            coords=layout.coords(placed) if layout is not None and placed is not None else None,
            op=classified.op,
            site=classified.site,
            stack=stack,
            peer=peer,
            error=state.error,
            wait=wait,
        )


def _frame_index(frames: Stack, python_frame: int | None) -> int | None:
    """The index in ``frames`` of their ``python_frame``-th Python frame (``--native`` interleaves C frames)."""
    if python_frame is None:
        return None
    return [i for i, f in enumerate(frames) if not f.native][python_frame]


def _pipeline_peer(rank: int, direction: str | None, layout: ParallelLayout) -> int | None:
    """The neighbour stage that known pipeline code talks to (send_forward -> the next stage).

    The direction comes from the innermost frame that names one: a bare wait inside megatron's
    ``_communicate`` takes it from the ``send_forward``/``recv_backward``/... that called it.
    """
    if direction is None or layout.pp < 2:
        return None
    return layout.pp_neighbour(rank, 1 if direction == "next" else -1)
