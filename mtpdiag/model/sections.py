"""The report's optional sections: each a typed part of ``mtpdiag.report/1`` with its own ``to_dict``, shown by
every renderer (console, markdown, HTML) and present in the JSON only when the evidence was there.

* ``Progress``: what ``watch`` saw over its samples;
* ``FlightRecorderSection``: the recorder's account next to the stacks (``analyze --fr``, bundles, live dumps);
* ``WatchdogSection``: the NCCL watchdog's timeouts from a job log (``analyze --log``).

The Flight Recorder's per-group detail (progress, matched splits, divergences) is carried as the JSON its
analysis objects write: the fields every renderer reads (``lines``) and that users script against are typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpdiag.model.watchdog import WatchdogTimeout

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Progress:
    """``watch``'s samples: how many, how far apart, how long nothing moved, and whether that is a hang."""

    samples: int
    interval_s: float
    stalled_for_s: float
    hang: bool

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "interval_s": self.interval_s, "stalled_for_s": self.stalled_for_s,
                "hang": self.hang}


@dataclass(frozen=True)
class FlightRecorderSection:
    """The Flight Recorder next to the diagnosis. ``lines`` tell the story in plain words (console, markdown,
    HTML); ``disagreements`` are where the recorder and the stacks differ."""

    source: str
    version: str
    ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    groups: tuple[Json, ...]  # each group's progress by the recorder's account
    mismatches: tuple[Json, ...]  # each split of the diagnosis, held against the recorder
    disagreements: tuple[str, ...]
    notes: tuple[str, ...]
    lines: tuple[str, ...]
    divergences: tuple[Json, ...] | None = None  # per group, the first sequence number where members disagree
    unmatched_p2p: tuple[Json, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source, "version": self.version, "ranks": list(self.ranks),
            "missing_ranks": list(self.missing_ranks), "groups": list(self.groups),
            "mismatches": list(self.mismatches), "disagreements": list(self.disagreements),
            "notes": list(self.notes), "lines": list(self.lines),
        }
        if self.divergences is not None:
            out["divergences"] = list(self.divergences)
        if self.unmatched_p2p is not None:
            out["unmatched_p2p"] = list(self.unmatched_p2p)
        return out


@dataclass(frozen=True)
class WatchdogSection:
    """The watchdog's timeouts, and the same in words (one line each)."""

    timeouts: tuple[WatchdogTimeout, ...]
    lines: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"timeouts": [t.to_dict() for t in self.timeouts], "lines": list(self.lines)}
