"""``mtpdiag verify``: run a verl engine's MTP-loss gate on real megatron-core and judge the outcome.

``worker.py`` is the rank program (torch + megatron-core, gloo); ``runner.py`` launches (``launch``) and
watches its worlds; ``plan`` reads the layout and the engine to verify, ``render`` says what happened. This
module holds what both sides agree on and the pure judgement: which ranks must write the metric, what value
it must have, which outcome each gate must reach on a layout, and whether the run proves the engine safe; and
the ``mtpdiag.verify/1`` document, its records. It imports neither torch nor megatron.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Layout, Record, Report
from mtpdiag.vocabulary.states import EngineGate, FindingId, Outcome

VERIFY_SCHEMA = "mtpdiag.verify/1"
GATES = tuple(EngineGate)
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


def expected_outcome(gate: str, layout: ParallelLayout | Layout) -> Outcome:
    """The buggy gate leaves the cp > 0 ranks out of a DP x CP all_reduce, so it hangs iff cp > 1."""
    return OUTCOME_DEADLOCK if gate == EngineGate.BUGGY and layout.cp > 1 else OUTCOME_COMPLETED


@dataclass(frozen=True)
class MetricWrite:
    """One ``metric-<rank>.json`` a worker wrote: the value it logged and the avg group megatron used."""

    rank: int
    value: float
    avg_group: tuple[int, ...]


class MetricCheck(Record, frozen=True, kw_only=True, omit_defaults=False):
    """Whether the logged MTP loss (``name``) is the DP x CP mean, written once per DP replica at its src rank
    (``expected_writes`` of them, by ``expected_writers``); ``ok`` when nothing is wrong (``problems``)."""

    name: str = METRIC_NAME
    expected: float
    observed: float | None
    writes: int
    expected_writes: int
    group: tuple[int, ...]
    writers: tuple[int, ...]
    expected_writers: tuple[int, ...]
    ok: bool
    problems: tuple[str, ...] = ()


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
        expected_writes=len(want),
        group=group,
        writers=writers,
        expected_writers=want,
        ok=not problems,
        problems=tuple(problems),
    )


class RunResult(Record, frozen=True, kw_only=True, omit_defaults=False):
    """One world run under one gate. ``engine`` is what the user chose (buggy, fixed, installed, a path).

    ``seconds`` and ``phases`` are kept to the hundredth of a second, as ``verify/1`` writes them; ``safe``
    (completed, and logged the right metric at the right ranks) is read from the outcome and the metric."""

    engine: str
    gate: EngineGate
    outcome: Outcome
    seconds: float
    safe: bool = False
    metric: MetricCheck
    report: Report | None = None
    phases: dict[str, float] = {}
    error: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "seconds", round(self.seconds, 2))
        msgspec.structs.force_setattr(self, "phases", {k: round(v, 2) for k, v in self.phases.items()})
        msgspec.structs.force_setattr(self, "safe", self.outcome == OUTCOME_COMPLETED and self.metric.ok)

    def finding_ids(self) -> tuple[str, ...]:
        return tuple(f.id for f in self.report.findings) if self.report is not None else ()


class VerifyResult(Record, frozen=True, kw_only=True, tag_field="schema", tag=VERIFY_SCHEMA):
    """Every run of one ``verify`` and its verdict (``mtpdiag.verify/1``); build it with ``of``.

    ``safe``: every run of the engine(s) the user asked about completed with the right metric; for
    ``both`` that is the fixed run. ``passed`` decides the exit code: for ``both`` it also demands that
    the buggy run deadlocks exactly when cp > 1. ``layout_source`` says where the layout came from.
    """

    layout: Layout
    world_size: int
    mode: str  # both | single
    runs: tuple[RunResult, ...]
    safe: bool
    passed: bool
    engine_path: str | None = None
    layout_source: str | None = None

    @staticmethod
    def of(
        layout: ParallelLayout,
        mode: str,
        runs: tuple[RunResult, ...],
        engine_path: str | None = None,
        layout_source: str | None = None,
    ) -> VerifyResult:
        judged = [r for r in runs if mode != "both" or r.gate == EngineGate.FIXED]
        safe = bool(judged) and all(r.safe for r in judged)
        passed = safe if mode != "both" else all(as_expected(r, layout) for r in runs)
        return VerifyResult(
            layout=layout.record(),
            world_size=layout.world_size,
            mode=mode,
            runs=runs,
            safe=safe,
            passed=passed,
            engine_path=engine_path,
            layout_source=layout_source,
        )


def as_expected(run: RunResult, layout: ParallelLayout | Layout) -> bool:
    """A buggy run must deadlock where cp > 1; every other run must complete with the right metric."""
    if expected_outcome(run.gate, layout) == OUTCOME_DEADLOCK:
        return run.outcome == OUTCOME_DEADLOCK
    return run.safe
