"""What ``verify`` prints: one line for the layout and the engine, one per run (the deadlock's diagnosis or the
metric it logged), the time each phase took, and the verdict."""

from __future__ import annotations

import sys

from mtpdiag.fix.verify import (
    FINDING_ID,
    METRIC_NAME,
    OUTCOME_COMPLETED,
    OUTCOME_DEADLOCK,
    RunResult,
    VerifyResult,
    expected_outcome,
)
from mtpdiag.fix.verify.plan import EngineChoice
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Layout, Report
from mtpdiag.vocabulary.states import EngineGate


def intro_line(layout: ParallelLayout, source: str, choice: EngineChoice) -> str:
    gates = " and ".join(g for _, g in choice.runs)
    worlds = len(choice.runs)
    what = choice.described or f"{gates} gate{'s' if worlds > 1 else ''}"
    return (
        f"verify {_layout_label(layout)} (world {layout.world_size}, layout from {source}): {what}; "
        f"{worlds} world{'s' if worlds > 1 else ''} of {layout.world_size} CPU rank"
        f"{'s' if layout.world_size > 1 else ''} on gloo"
    )


def run_line(run: RunResult) -> str:
    """One line per run: what happened, and the diagnosis or the metric."""
    name = (
        run.engine
        if run.engine == run.gate
        else f"{'installed' if run.engine == 'installed' else 'engine'} ({run.gate} gate)"
    )
    if run.outcome == OUTCOME_DEADLOCK:
        return f"{name}: deadlock after {run.seconds:.1f} s — {_diagnosis_phrase(run)}"
    if run.outcome == OUTCOME_COMPLETED:
        return f"{name}: completed in {run.seconds:.1f} s, {metric_phrase(run)}"
    return f"{name}: error after {run.seconds:.1f} s — {run.error or 'unknown error'}"


def metric_phrase(run: RunResult) -> str:
    m = run.metric
    if not m.ok:
        return f"{METRIC_NAME} WRONG: " + "; ".join(m.problems)
    ranks = ", ".join(str(r) for r in m.writers)
    once = f"written once (rank {ranks})" if m.writes == 1 else f"written once per DP replica (ranks {ranks})"
    return f"{METRIC_NAME} {m.observed:g} = mean over DP×CP group {list(m.group)}, {once}"


def _diagnosis_phrase(run: RunResult) -> str:
    if run.report is None:
        return "; ".join(run.notes) or "no diagnosis"
    findings = run.report.findings
    if not findings:
        return "the diagnosis found no split collective"
    first = next((f for f in findings if f.id == FINDING_ID), findings[0])
    return f"diagnosed {first.id}: {first.summary}"


def phases_line(runs: tuple[RunResult, ...]) -> str:
    parts = []
    for run in runs:
        p = run.phases
        bits = [
            f"startup {p['startup']:.1f} s" if "startup" in p else None,
            f"hang called {p['hang_detection']:.1f} s after the last progress" if "hang_detection" in p else None,
            f"diagnosis {p['diagnosis']:.1f} s" if "diagnosis" in p else None,
            f"teardown {p['teardown']:.1f} s" if "teardown" in p else None,
        ]
        parts.append(f"{run.gate} " + ", ".join(b for b in bits if b))
    return "time: " + "; ".join(parts)


def verdict_line(result: VerifyResult) -> str:
    layout, label = result.layout, _layout_label(result.layout)
    needs_cp = "the bug needs CP>1" + (f" (this layout has cp={layout.cp})" if layout.cp == 1 else "")
    if result.mode == "both":
        buggy = expected_outcome(EngineGate.BUGGY, layout)
        what = (
            f"the buggy gate deadlocks here ({needs_cp}) and the fixed gate completes with the right metric"
            if buggy == OUTCOME_DEADLOCK
            else f"neither gate hangs on {label}: {needs_cp}; both log the right metric"
        )
        return f"verdict: PASS — {what}" if result.passed else f"verdict: FAIL — expected {what}; see the runs above"
    run = result.runs[0]
    if result.safe:
        tail = f"; {needs_cp}, so it would deadlock with cp > 1 (mtpdiag apply)" if run.gate == EngineGate.BUGGY else ""
        return f"verdict: SAFE — the {run.gate} gate completes on {label} with the right metric{tail}"
    why = (
        "it deadlocks (the MTP reduce is gated on cp == 0; mtpdiag apply, verl PR #5895)"
        if run.outcome == OUTCOME_DEADLOCK
        else "it did not complete with the right metric"
    )
    return f"verdict: UNSAFE — the {run.gate} gate on {label}: {why}"


def _layout_label(layout: ParallelLayout | Layout) -> str:
    out = f"tp{layout.tp} cp{layout.cp} pp{layout.pp} dp{layout.dp}"
    if layout.ep > 1:
        out += f" ep{layout.ep}"
    if layout.etp is not None:
        out += f" etp{layout.etp}"
    if layout.vpp is not None:
        out += f" vpp{layout.vpp}"
    return out


def report_text(report: Report) -> str:
    from mtpdiag.pipeline.output import terminal_width
    from mtpdiag.report import render

    return render(report, "console", color=sys.stdout.isatty(), width=terminal_width()).rstrip("\n")


def indent(text: str) -> str:
    return "\n".join(f"    {line}" if line else line for line in text.splitlines())
