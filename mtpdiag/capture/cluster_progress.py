"""``watch --ray``'s Flight Recorder signal, kept on the driver between samples (``ClusterProgress``).

Each node's capture task (``ray_node.capture_node``) polls its own ranks with ``LiveProgress`` and hands back
their new state and how old its newest progress is; this folds the replies together. Nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from mtpdiag.model import RankCapture
from mtpdiag.model.group_marks import every_rank_read_at

__all__ = ["ClusterProgress"]


class ClusterProgress:
    """``watch --ray``'s Flight Recorder signal. ``LiveProgress`` polls a rank's dumps and debug-info pipe, which
    are on the rank's node, so each node's capture task polls its own ranks; the state between samples is kept
    here, on the driver, and handed to every task with its request: the requests and reads of every rank, and
    the groups' marks, which span nodes (the highest of each group's, from any node)."""

    def __init__(self) -> None:
        self.state: dict[str, dict[Any, Any]] = {"asked": {}, "read_mtime": {}, "first_read": {}, "marks": {}}
        self.moved_at: float | None = None  # time.time() on this host
        self.piped: set[int] = set()  # the ranks with a debug-info pipe, as their nodes last said

    def update(self, replies: Iterable[Mapping[str, Any]]) -> None:
        """Take each node's new state for the ranks it polled, its groups' marks, and when the newest collective
        it saw completed (its age on the node's clock, so that the nodes' clocks need not agree with this one)."""
        for reply in replies:
            answer = reply.get("fr_progress")
            if not isinstance(answer, Mapping):
                continue
            at = _moved_at(answer)
            if at is not None:
                self.moved_at = at if self.moved_at is None else max(at, self.moved_at)
            polled = {int(r) for r in answer.get("ranks") or ()}
            new = answer.get("state") or {}
            self.piped = (self.piped - polled) | {int(r) for r in answer.get("piped") or ()}
            for key in ("asked", "read_mtime", "first_read"):
                self.state[key] = {r: v for r, v in self.state[key].items() if r not in polled}
                self.state[key].update({int(r): v for r, v in (new.get(key) or {}).items()})
            marks = self.state["marks"]
            for group, mark in (new.get("marks") or {}).items():
                if group not in marks or float(mark[0]) > float(marks[group][0]):
                    marks[group] = list(mark)

    def established_at(self) -> float | None:
        """When the signal could first see every rank's groups move (``group_marks.every_rank_read_at``). The
        dumps' times are the nodes' clocks; a node whose mtpdiag names no piped ranks is not waited for."""
        return every_rank_read_at(self.piped, {int(r): float(t) for r, t in self.state["first_read"].items()})

    def poll(self, captures: tuple[RankCapture, ...]) -> float | None:  # noqa: ARG002 - ProgressSignal's
        """When the newest collective the nodes saw completed in the capture just taken completed (time.time()
        here; ``pipeline.sampling.ProgressSignal``). The nodes polled their own ranks while they took ``captures``
        (``update``): nothing is read from them here."""
        at, self.moved_at = self.moved_at, None
        return at


def _moved_at(answer: Mapping[str, Any]) -> float | None:
    """A node's progress on this host's clock: now less its age; a node that gives no age (an older mtpdiag)
    dates it now."""
    if not answer.get("moved"):
        return None
    age = answer.get("age_s")
    return time.time() - (max(0.0, float(age)) if isinstance(age, (int, float)) else 0.0)
