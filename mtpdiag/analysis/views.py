"""Each rank's view in the report (``rank_view``): what it waits in, where, its state and wait, its peer and
its coordinates, with each distinct stack read once (``StackReader``), which is what keeps the analysis of
16k ranks near-linear: the per-rank work is a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mtpdiag.analysis.classify import Classified, StateReading, classify_capture, rank_state, side_collective, site_of
from mtpdiag.analysis.known_sites import lookup
from mtpdiag.analysis.mismatch import is_p2p_op
from mtpdiag.analysis.wait import wait_state
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import RankCapture, RankView, Stack, ThreadStack, WaitState, replace
from mtpdiag.vocabulary.waits import WaitKind

CoordsOf = Callable[[int], Mapping[str, int]]


class StackReader:
    """Each distinct stack read once: its place in the report's stack table, and the readings of the ranks
    that hold it (classification, pipeline direction, wait and state).

    Stacks are keyed by value (frames are hashable and cache their hash), so at 16k ranks a handful of
    readings serve every rank, whichever reader built the frames. The readings are keyed by the stack's
    shape, its frames without their arguments: the ranks of a pipeline stage send to as many peers as
    there are ranks, from one stack; only the peer is read again for each (``Classified.for_stack``).
    """

    def __init__(self) -> None:
        self._ids: dict[Stack, int] = {}
        self._shape_of: list[int] = []  # stack id -> shape id
        self._shapes: dict[Stack, int] = {}
        self._by_shape: dict[tuple[int, bool | None], Classified] = {}
        self._classified: dict[tuple[int, bool | None], Classified] = {}
        self._direction: dict[int, str | None] = {}
        self._states: dict[tuple[object, ...], StateReading] = {}
        self._waits: dict[tuple[object, ...], WaitState | None] = {}

    def stack_id(self, frames: Stack) -> int:
        """The index of ``frames`` in the report's stack table (``stacks``), added when new."""
        found = self._ids.get(frames)
        if found is None:
            found = self._ids[frames] = len(self._ids)
            shape = tuple(replace(f, args=None) if f.args is not None else f for f in frames)
            self._shape_of.append(self._shapes.setdefault(shape, len(self._shapes)))
        return found

    def stacks(self) -> tuple[Stack, ...]:
        return tuple(self._ids)

    def state(self, capture: RankCapture, classified: Classified, wait: WaitState | None) -> StateReading:
        """``rank_state``, shared by the ranks whose state, error and stack kind agree."""
        waiting = wait is not None and wait.kind != WaitKind.RUNNING
        key = (capture.state, capture.error, not capture.threads, classified.op is None, waiting)
        found = self._states.get(key)
        if found is None:
            found = self._states[key] = rank_state(capture, classified, waiting)
        return found

    def wait(self, capture: RankCapture, thread: ThreadStack | None, stack: int | None, op: str | None,
             side_thread: str | None, main: bool) -> WaitState | None:
        """``wait_state``, shared by the ranks whose stack shape and /proc facts agree."""
        if thread is None or stack is None:
            return wait_state(capture, thread, op, side_thread)
        key = (self._shape_of[stack], thread.active, thread.calls, op, side_thread, capture.state,
               capture.main_syscall, capture.cuda, main)
        found = self._waits.get(key, _UNSET)
        if found is _UNSET:
            found = self._waits[key] = wait_state(capture, thread, op, side_thread)
        return found  # type: ignore[return-value]

    def classify(self, capture: RankCapture, thread: ThreadStack | None, stack: int | None) -> Classified:
        """``classify_capture`` of a rank whose main thread is ``thread`` (its stack ``stack``)."""
        if thread is None or stack is None:
            return classify_capture(capture)
        key = (stack, thread.active)
        found = self._classified.get(key)
        if found is None:
            shape = (self._shape_of[stack], thread.active)
            base = self._by_shape.get(shape)
            if base is None:
                found = self._by_shape[shape] = classify_capture(capture)
            else:
                found = base.for_stack(thread)
            self._classified[key] = found
        return found

    def direction(self, stack: int, frames: Stack) -> str | None:
        """``next``/``prev``: the neighbour stage that known pipeline code in ``frames`` talks to."""
        shape = self._shape_of[stack]
        if shape not in self._direction:
            self._direction[shape] = next(
                (row.peer for row in map(lookup, map(site_of, frames)) if row is not None and row.peer), None)
        return self._direction[shape]


_UNSET: object = object()


def rank_view(capture: RankCapture, layout: ParallelLayout | None, coords_of: CoordsOf, read: StackReader) -> RankView:
    thread = capture.main_thread
    stack = read.stack_id(thread.frames) if thread is not None and thread.frames else None
    classified = read.classify(capture, thread, stack)
    side_name = None
    main = True
    if classified.op is None and len(capture.threads) > 1:
        side = side_collective(capture)
        if side is not None:  # the rank's collective runs on another thread: that thread is what matters
            thread, classified = side
            side_name = thread.name or f"thread {thread.thread_id}"
            stack = read.stack_id(thread.frames) if thread.frames else None
            main = False
    wait = read.wait(capture, thread, stack, classified.op, side_name, main)
    state = read.state(capture, classified, wait)
    rank = capture.rank
    placed = rank if layout is not None and rank is not None and 0 <= rank < layout.world_size else None
    peer = classified.peer
    if peer is None and placed is not None and layout is not None and stack is not None and thread is not None \
            and classified.op is not None and is_p2p_op(classified.op, classified.site):
        peer = _pipeline_peer(placed, read.direction(stack, thread.frames), layout)
    return RankView(
        rank=rank, pid=capture.pid, host=capture.host, state=state.state,
        coords=dict(coords_of(placed)) if placed is not None else None,
        op=classified.op, site=classified.site, stack=stack, peer=peer, error=state.error, wait=wait,
    )


def _pipeline_peer(rank: int, direction: str | None, layout: ParallelLayout) -> int | None:
    """The neighbour stage that known pipeline code talks to (send_forward -> the next stage).

    The direction comes from the innermost frame that names one: a bare wait inside megatron's
    ``_communicate`` takes it from the ``send_forward``/``recv_backward``/... that called it.
    """
    if direction is None or layout.pp < 2:
        return None
    stages = layout.group_of("pp", rank)
    here = stages.index(rank)
    return stages[(here + (1 if direction == "next" else -1)) % len(stages)]
