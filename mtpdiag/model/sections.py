"""The report's optional sections: each a typed part of ``mtpdiag.report/2``, shown by
every renderer (console, markdown, HTML) and present in the JSON only when the evidence was there.

* ``Progress``: what ``watch`` saw over its samples;
* ``FlightRecorderSection``: the recorder's account next to the stacks (``analyze --fr``, bundles, live dumps);
* ``WatchdogSection``: the NCCL watchdog's timeouts from a job log (``analyze --log``).

The Flight Recorder's per-group detail (progress, the diagnosis's splits held against it, divergences, unmatched
sends and receives) is its analysis's own records (``model.fr_analysis``).
"""

from __future__ import annotations

from mtpdiag.model.fields import Record
from mtpdiag.model.fr_analysis import Divergence, FRGroupProgress, FRSplitCheck, P2PMismatch
from mtpdiag.model.watchdog import LoggedSignal, LoggedTimeout


class Progress(Record, frozen=True):
    """``watch``'s samples: how many, how far apart, how long nothing moved, and whether that is a hang."""

    samples: int
    interval_s: float
    stalled_for_s: float
    hang: bool


class FlightRecorderSection(Record, frozen=True, kw_only=True):
    """The Flight Recorder next to the diagnosis. ``lines`` tell the story in plain words (console, markdown,
    HTML); ``disagreements`` are where the recorder and the stacks differ."""

    source: str
    version: str
    ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    groups: tuple[FRGroupProgress, ...]  # each group's progress by the recorder's account
    mismatches: tuple[FRSplitCheck, ...]  # each split of the diagnosis, held against the recorder
    disagreements: tuple[str, ...]
    notes: tuple[str, ...]
    lines: tuple[str, ...]
    divergences: tuple[Divergence, ...] | None = None  # per group, the first sequence number where members disagree
    unmatched_p2p: tuple[P2PMismatch, ...] | None = None


class WatchdogSection(Record, frozen=True):
    """The watchdog's timeouts and dump signals, and the same in words (one line each)."""

    timeouts: tuple[LoggedTimeout, ...]
    lines: tuple[str, ...]
    signals: tuple[LoggedSignal, ...] = ()
