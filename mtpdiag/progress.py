"""Hang versus slow progress, from repeated samples (pure; ``watch`` does the sampling).

A rank has made progress between two samples when its main thread used CPU (``/proc/PID/task/PID/stat``;
the *process* CPU time keeps rising in a hang because gloo/NCCL and store threads tick) or when its stack
signature (op, site, frames) changed. A hang is called only when no rank has made progress for the whole
stall window, seen by at least two stack samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from mtpdiag.model import Snapshot

Signature = tuple  # (frames...) of the main thread: ((function, file, line), ...)


def stack_signatures(snapshot: Snapshot) -> dict[int, Signature]:
    """pid -> main-thread stack signature, for every capture that has a stack."""
    out: dict[int, Signature] = {}
    for c in snapshot.captures:
        thread = c.main_thread
        if c.pid is not None and thread is not None:
            out[c.pid] = tuple((f.function, f.file, f.line) for f in thread.frames)
    return out


@dataclass(frozen=True)
class StallTracker:
    """What watch has seen so far. ``quiet_since`` is when the last progress was observed."""

    started: float
    quiet_since: float
    samples: int = 0
    stack_samples_while_quiet: int = 0
    ticks: Mapping[int, int | None] = field(default_factory=dict)
    stacks: Mapping[int, Signature] = field(default_factory=dict)

    @staticmethod
    def start(now: float) -> "StallTracker":
        return StallTracker(started=now, quiet_since=now)

    def ticks_moved(self, ticks: Mapping[int, int | None]) -> bool:
        """True when any rank's main thread used CPU (or the set of ranks changed) since last sample."""
        return not self.ticks or dict(ticks) != dict(self.ticks)

    def observe(self, now: float, ticks: Mapping[int, int | None],
                stacks: Mapping[int, Signature] | None) -> "StallTracker":
        """Fold in one sample. ``stacks`` is None when the stacks were not captured this time."""
        moved = self.ticks_moved(ticks)
        if stacks is not None and self.stacks and dict(stacks) != dict(self.stacks):
            moved = True
        if moved:
            return replace(self, quiet_since=now, samples=self.samples + 1, stack_samples_while_quiet=1
                           if stacks is not None else 0, ticks=dict(ticks),
                           stacks=dict(stacks) if stacks is not None else {})
        return replace(self, samples=self.samples + 1,
                       stack_samples_while_quiet=self.stack_samples_while_quiet + (stacks is not None),
                       ticks=dict(ticks), stacks=dict(stacks) if stacks is not None else self.stacks)

    def stalled_for(self, now: float) -> float:
        return max(0.0, now - self.quiet_since)

    def is_hang(self, now: float, stall_s: float) -> bool:
        return self.stack_samples_while_quiet >= 2 and self.stalled_for(now) >= stall_s

    def progress(self, now: float, interval_s: float, stall_s: float) -> dict:
        """The report's ``progress`` object (docs/design.md)."""
        return {"samples": self.samples, "interval_s": interval_s,
                "stalled_for_s": round(self.stalled_for(now), 2), "hang": self.is_hang(now, stall_s)}
