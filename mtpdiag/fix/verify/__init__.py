"""``mtpdiag verify``: run a verl engine's MTP-loss gate on real megatron-core and judge the outcome.

``worker.py`` is the rank program (torch + megatron-core, gloo); ``runner.py`` launches (``launch``) and
watches its worlds; ``plan`` reads the layout and the engine to verify, ``render`` says what happened. This
module holds what both sides agree on and the pure judgement: which ranks must write the metric, what value
it must have, which outcome each gate must reach on a layout, and whether the run proves the engine safe. It imports neither torch nor megatron.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Report
from mtpdiag.vocabulary.states import FindingId, Outcome

VERIFY_SCHEMA = "mtpdiag.verify/1"
GATES = ("buggy", "fixed")
OUTCOME_COMPLETED = Outcome.COMPLETED
OUTCOME_DEADLOCK = Outcome.DEADLOCK
OUTCOME_ERROR = Outcome.ERROR
METRIC_NAME = "mtp_1 loss"  # the key MTPLossLoggingHelper.track_mtp_metrics writes for MTP layer 0
FINDING_ID = FindingId.MTP_CP_GATED_REDUCE
MAX_WORLD = 16  # CPU processes one verify world may start; each one imports torch and megatron-core
_TOLERANCE = 1e-6


def rank_loss(rank: int) -> float:
    """The MTP loss a worker saves: distinct per rank, so a mean over the wrong group shows."""
    return float(rank + 1)


def src_ranks(layout: ParallelLayout) -> tuple[int, ...]:
    """verl's ``is_mp_src_rank_with_outputs`` ranks (tp 0, last pp stage, cp 0): one per DP replica."""
    out = []
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        if c["tp"] == 0 and c["cp"] == 0 and c["pp"] == layout.pp - 1:
            out.append(rank)
    return tuple(out)


def metric_group(layout: ParallelLayout) -> tuple[int, ...]:
    """The DP x CP group every src rank belongs to: the one whose mean the metric must be."""
    return tuple(layout.group_of("dp_cp", src_ranks(layout)[0]))


def expected_outcome(gate: str, layout: ParallelLayout) -> Outcome:
    """The buggy gate leaves the cp > 0 ranks out of a DP x CP all_reduce, so it hangs iff cp > 1."""
    return OUTCOME_DEADLOCK if gate == "buggy" and layout.cp > 1 else OUTCOME_COMPLETED


@dataclass(frozen=True)
class MetricWrite:
    """One ``metric-<rank>.json`` a worker wrote: the value it logged and the avg group megatron used."""

    rank: int
    value: float
    avg_group: tuple[int, ...]


@dataclass(frozen=True)
class MetricCheck:
    """Whether the logged MTP loss is the DP x CP mean, written once per DP replica at its src rank."""

    expected: float
    observed: float | None
    writes: int
    group: tuple[int, ...]
    writers: tuple[int, ...]
    expected_writers: tuple[int, ...]
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": METRIC_NAME,
            "expected": self.expected,
            "observed": self.observed,
            "writes": self.writes,
            "expected_writes": len(self.expected_writers),
            "group": list(self.group),
            "writers": list(self.writers),
            "expected_writers": list(self.expected_writers),
            "ok": self.ok,
            "problems": list(self.problems),
        }


def check_metric(layout: ParallelLayout, writes: list[MetricWrite]) -> MetricCheck:
    """Compare what the workers wrote with what the layout says they must write."""
    group = metric_group(layout)
    expected = sum(rank_loss(r) for r in group) / len(group)
    want = src_ranks(layout)
    by_rank = {w.rank: w for w in writes}
    writers = tuple(sorted(by_rank))
    problems = []
    if extra := sorted(set(writers) - set(want)):
        problems.append(f"rank(s) {extra} wrote the metric but are not src ranks")
    if missing := sorted(set(want) - set(writers)):
        problems.append(f"src rank(s) {missing} did not write the metric")
    for w in sorted(writes, key=lambda w: w.rank):
        if w.avg_group != group:
            problems.append(f"rank {w.rank} averaged over {list(w.avg_group)}, not the DP x CP group {list(group)}")
        if abs(w.value - expected) > _TOLERANCE:
            problems.append(f"rank {w.rank} wrote {w.value:g}, expected {expected:g}")
    observed = by_rank[writers[0]].value if writers else None
    return MetricCheck(
        expected=expected,
        observed=observed,
        writes=len(writes),
        group=group,
        writers=writers,
        expected_writers=want,
        problems=tuple(problems),
    )


@dataclass(frozen=True)
class RunResult:
    """One world run under one gate. ``engine`` is what the user chose (buggy, fixed, installed, a path)."""

    engine: str
    gate: str
    outcome: Outcome
    seconds: float
    metric: MetricCheck
    report: Report | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def safe(self) -> bool:
        """Completed, and logged the right metric at the right ranks."""
        return self.outcome == OUTCOME_COMPLETED and self.metric.ok

    def finding_ids(self) -> tuple[str, ...]:
        return tuple(f.id for f in self.report.findings) if self.report is not None else ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "gate": self.gate,
            "outcome": self.outcome,
            "seconds": round(self.seconds, 2),
            "safe": self.safe,
            "metric": self.metric.to_dict(),
            "report": self.report.to_dict() if self.report is not None else None,
            "phases": {k: round(v, 2) for k, v in self.phases.items()},
            "error": self.error,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class VerifyResult:
    """Every run of one ``verify`` and its verdict.

    ``safe``: every run of the engine(s) the user asked about completed with the right metric; for
    ``both`` that is the fixed run. ``passed`` decides the exit code: for ``both`` it also demands that
    the buggy run deadlocks exactly when cp > 1.
    """

    layout: ParallelLayout
    mode: str  # both | single
    runs: tuple[RunResult, ...]
    engine_path: str | None = None

    @property
    def safe(self) -> bool:
        judged = [r for r in self.runs if self.mode != "both" or r.gate == "fixed"]
        return bool(judged) and all(r.safe for r in judged)

    @property
    def passed(self) -> bool:
        if self.mode != "both":
            return self.safe
        return all(as_expected(r, self.layout) for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": VERIFY_SCHEMA,
            "layout": self.layout.to_dict(),
            "world_size": self.layout.world_size,
            "mode": self.mode,
            "runs": [r.to_dict() for r in self.runs],
            "safe": self.safe,
            "passed": self.passed,
        }
        if self.engine_path is not None:
            out["engine_path"] = self.engine_path
        return out


def as_expected(run: RunResult, layout: ParallelLayout) -> bool:
    """A buggy run must deadlock where cp > 1; every other run must complete with the right metric."""
    if expected_outcome(run.gate, layout) == OUTCOME_DEADLOCK:
        return run.outcome == OUTCOME_DEADLOCK
    return run.safe
