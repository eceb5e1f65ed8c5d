"""``mtpdiag verify``: run a verl engine's MTP-loss gate on real megatron-core (CPU, gloo) and judge it.

The layout comes from flags, a verl config, or a hung job (``--pid``); the gate from ``--engine``
(buggy, fixed, both, the installed verl, or an engine file). Exit 0: the engine is safe on this layout
(for ``both``: buggy hangs exactly where cp > 1 and fixed logs the right metric); 1: it is not; 2: bad
input.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import typer

from mtpdiag.commands import options as o
from mtpdiag.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mtpdiag.layout import LayoutError, ParallelLayout
from mtpdiag.verify import (
    FINDING_ID,
    MAX_WORLD,
    METRIC_NAME,
    OUTCOME_COMPLETED,
    OUTCOME_DEADLOCK,
    RunResult,
    VerifyResult,
    expected_outcome,
)

ENGINE_CHOICES = ("fixed", "buggy", "both", "installed")


@dataclass(frozen=True)
class EngineChoice:
    """The gates to run, named as the user named the engine, and what decided them."""

    mode: str  # both | single
    runs: tuple[tuple[str, str], ...]  # (engine label, gate)
    path: str | None = None
    described: str | None = None  # "installed engine .../transformer_impl.py (verl 0.7.1), affected: ..."


def verify(
    tp: Optional[int] = o.TP,
    cp: Optional[int] = o.CP,
    pp: Optional[int] = o.PP,
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Data-parallel replicas in the verify world "
                                     "(default: the fewest the layout allows, usually 1; the job's with --pid)."),
    ep: Optional[int] = o.EP,
    etp: Optional[int] = o.ETP,
    vpp: Optional[int] = o.VPP,
    order: Optional[str] = o.ORDER,
    engine: str = typer.Option("installed", "--engine", help="fixed | buggy | both | installed | a path to "
                               "verl's workers/engine/megatron/transformer_impl.py."),
    config: Optional[str] = o.CONFIG,
    override: Optional[List[str]] = o.OVERRIDE,
    pid: Optional[int] = typer.Option(None, "--pid", help="Take the parallel sizes from this hung job "
                                      "(a worker or its launcher)."),
    timeout: float = typer.Option(180.0, "--timeout", min=5.0, help="Seconds one world may run before it "
                                  "counts as an error (a hang is called within seconds)."),
    as_json: bool = typer.Option(False, "--json", help="Print the mtpdiag.verify/1 JSON document."),
) -> None:
    """Prove on your parallel layout that an MTP-loss gate completes with the right metric, or show it hang."""
    from mtpdiag.verify.runner import RunSpec, WatchSettings, run_all

    flags = {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp, "vpp": vpp}
    layout, source = resolve_verify_layout(flags, dp=dp, order=order, config=config,
                                           overrides=list(override or ()), pid=pid)
    choice = choose_engine(engine)
    require_runtime()
    if not as_json:
        typer.echo(intro_line(layout, source, choice))

    def show(run: RunResult) -> None:
        if not as_json:
            typer.echo(run_line(run, layout))
            if run.report is not None and run.outcome == OUTCOME_DEADLOCK:
                typer.echo(_indent(_render(run.report)))

    runs = run_all(layout, [RunSpec(e, g) for e, g in choice.runs], WatchSettings(timeout_s=timeout),
                   on_result=show)
    result = VerifyResult(layout=layout, mode=choice.mode, runs=runs, engine_path=choice.path)
    if as_json:
        doc = result.to_dict()
        doc["layout_source"] = source
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        typer.echo(phases_line(runs))
        typer.echo(verdict_line(result))
    raise typer.Exit(EXIT_OK if result.passed else EXIT_PROBLEM)


# ------------------------------------------------------------------------------------ inputs


def resolve_verify_layout(flags: dict, *, dp: int | None, order: str | None, config: str | None,
                          overrides: list[str], pid: int | None) -> tuple[ParallelLayout, str]:
    """The layout to verify, and where it came from: flags, a verl config, or a hung job (``--pid``).

    Sources are merged by ``layout.sources.resolve_layout``: a flag that contradicts the config or the
    job is an input error naming both. dp is the verify world's own choice (default 1, or the job's).
    """
    given = {k: v for k, v in flags.items() if v is not None}
    if order:
        given["order"] = order
    if pid is not None:
        job, source = _job_layout(pid, given, config, overrides)
        sizes = {"tp": job.tp, "cp": job.cp, "pp": job.pp, "ep": job.ep, "etp": job.etp, "vpp": job.vpp}
        return build_layout(sizes, dp=dp or job.dp, order=job.order), f"pid {pid}: {source}"
    if config is not None:
        from mtpdiag.layout.sources import read_verl_config, resolve_layout

        sizes = {**read_verl_config(config, overrides), **given}
        dp = dp or fewest_dp(sizes)
        world = dp * int(sizes.get("tp") or 1) * int(sizes.get("cp") or 1) * int(sizes.get("pp") or 1)
        resolve_layout(world, flags=given, config=config, overrides=overrides)  # flag-vs-config conflicts
        return build_layout(sizes, dp=dp, order=order), f"verl config {config}" + (f" + {len(overrides)} override(s)" if overrides else "")
    if overrides:
        raise InputError("--override needs --config")
    return build_layout(given, dp=dp, order=order), "flags"


def build_layout(sizes: dict, *, dp: int | None, order: str | None) -> ParallelLayout:
    """A ParallelLayout of tp*cp*pp*dp ranks; refuses worlds too big for CPU processes here.

    Without ``dp``, the fewest DP replicas that the expert layout allows (etp*ep must divide tp*cp*dp).
    """
    tp, cp, pp = (int(sizes.get(k) or 1) for k in ("tp", "cp", "pp"))
    dp = dp or fewest_dp(sizes)
    for name, value in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp)):
        if value < 1:
            raise InputError(f"--{name} must be at least 1, got {value}")
    world = tp * cp * pp * dp
    if world > MAX_WORLD:
        hint = " (try --dp 1: the MTP gate depends on tp, cp and pp, not on dp)" if dp > 1 else ""
        raise InputError(f"tp*cp*pp*dp = {tp}*{cp}*{pp}*{dp} = {world} CPU processes; verify starts at most "
                         f"{MAX_WORLD}{hint}")
    try:
        return ParallelLayout.for_world(world, tp=tp, cp=cp, pp=pp, ep=int(sizes.get("ep") or 1),
                                        vpp=sizes.get("vpp"), etp=sizes.get("etp"),
                                        **({"order": order} if order else {}))
    except LayoutError as exc:
        raise InputError(str(exc)) from None


def fewest_dp(sizes: dict) -> int:
    """The fewest DP replicas the expert layout allows: etp*ep must divide tp*cp*dp."""
    tp, cp = int(sizes.get("tp") or 1), int(sizes.get("cp") or 1)
    expert = int(sizes.get("etp") or tp) * int(sizes.get("ep") or 1)
    return next(d for d in range(1, expert + 1) if (tp * cp * d) % expert == 0)


def _job_layout(pid: int, given: dict, config: str | None,
                overrides: list[str]) -> tuple[ParallelLayout, str]:
    """Capture the hung job once and resolve its layout as ``inspect`` does."""
    from mtpdiag.capture import capture
    from mtpdiag.pipeline import world_size_of
    from mtpdiag.layout.sources import resolve_layout

    snapshot = capture(pids=[pid])
    hints = [dict(c.layout_hints) for c in snapshot.captures if c.layout_hints]
    world = world_size_of(snapshot)
    layout, source = resolve_layout(world, flags=given, config=config, overrides=overrides, hints=hints)
    if layout is None:
        raise InputError(f"could not tell the parallel sizes of the job behind pid {pid} "
                         f"({'no WORLD_SIZE' if source else 'no sizes on its command line'}); "
                         "pass --tp/--cp/--pp or --config")
    return layout, source or "?"


def choose_engine(engine: str) -> EngineChoice:
    """fixed, buggy, both; or the gate an engine file (the installed verl's, or a path) uses."""
    if engine == "both":
        return EngineChoice("both", (("buggy", "buggy"), ("fixed", "fixed")))
    if engine in ("fixed", "buggy"):
        return EngineChoice("single", ((engine, engine),))
    from mtpdiag.fix.engine import check_engine, locate_engine

    if engine == "installed":
        try:
            path = locate_engine()
        except InputError:
            raise InputError("--engine installed: verl is not installed in this Python; pass --engine with "
                             "the path to verl's workers/engine/megatron/transformer_impl.py, or buggy|fixed|both"
                             ) from None
        if path is None:
            raise InputError("the installed verl has no Megatron engine (workers/engine/megatron/"
                             "transformer_impl.py): nothing to verify")
    else:
        path = Path(engine)
        if not path.exists() and "/" not in engine and not engine.endswith(".py"):
            raise InputError(f"--engine {engine!r}: use one of {', '.join(ENGINE_CHOICES)} or a path to an "
                             "engine file")
    check = check_engine(path)
    if check.gate is None or check.status in ("unknown", "not-applicable"):
        raise InputError(f"{path}: {check.status}: {check.reason}; verify needs an engine whose MTP gate is "
                         "known (or --engine buggy|fixed|both)")
    version = f" (verl {check.verl_version})" if check.verl_version else ""
    label = "installed" if engine == "installed" else str(path)
    described = f"{'installed ' if engine == 'installed' else ''}engine {path}{version}, {check.status}: " \
                f"the {check.gate} gate"
    return EngineChoice("single", ((label, check.gate),), path=str(path), described=described)


def require_runtime() -> None:
    """verify's workers need torch and megatron-core (found without importing them) and py-spy."""
    for module, package in (("torch", "torch"), ("megatron", "megatron-core")):
        if importlib.util.find_spec(module) is None:
            raise InputError(f"verify needs {package} in this Python (pip install 'mtpdiag[verify]')")
    from mtpdiag.capture.pyspy import find_pyspy

    find_pyspy()


# ------------------------------------------------------------------------------------ output


def intro_line(layout: ParallelLayout, source: str, choice: EngineChoice) -> str:
    gates = " and ".join(g for _, g in choice.runs)
    worlds = len(choice.runs)
    what = choice.described or f"{gates} gate{'s' if worlds > 1 else ''}"
    return (f"verify {_layout_label(layout)} (world {layout.world_size}, layout from {source}): {what}; "
            f"{worlds} world{'s' if worlds > 1 else ''} of {layout.world_size} CPU rank"
            f"{'s' if layout.world_size > 1 else ''} on gloo")


def run_line(run: RunResult, layout: ParallelLayout) -> str:
    """One line per run: what happened, and the diagnosis or the metric."""
    name = run.engine if run.engine == run.gate else \
        f"{'installed' if run.engine == 'installed' else 'engine'} ({run.gate} gate)"
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
        bits = [f"startup {p['startup']:.1f} s" if "startup" in p else None,
                f"hang called {p['hang_detection']:.1f} s after the last progress" if "hang_detection" in p
                else None,
                f"diagnosis {p['diagnosis']:.1f} s" if "diagnosis" in p else None,
                f"teardown {p['teardown']:.1f} s" if "teardown" in p else None]
        parts.append(f"{run.gate} " + ", ".join(b for b in bits if b))
    return "time: " + "; ".join(parts)


def verdict_line(result: VerifyResult) -> str:
    layout, label = result.layout, _layout_label(result.layout)
    needs_cp = "the bug needs CP>1" + (f" (this layout has cp={layout.cp})" if layout.cp == 1 else "")
    if result.mode == "both":
        buggy = expected_outcome("buggy", layout)
        what = (f"the buggy gate deadlocks here ({needs_cp}) and the fixed gate completes with the right metric"
                if buggy == OUTCOME_DEADLOCK else
                f"neither gate hangs on {label}: {needs_cp}; both log the right metric")
        return (f"verdict: PASS — {what}" if result.passed else
                f"verdict: FAIL — expected {what}; see the runs above")
    run = result.runs[0]
    if result.safe:
        tail = f"; {needs_cp}, so it would deadlock with cp > 1 (mtpdiag apply)" if run.gate == "buggy" else ""
        return f"verdict: SAFE — the {run.gate} gate completes on {label} with the right metric{tail}"
    why = ("it deadlocks (the MTP reduce is gated on cp == 0; mtpdiag apply, verl PR #5895)"
           if run.outcome == OUTCOME_DEADLOCK else "it did not complete with the right metric")
    return f"verdict: UNSAFE — the {run.gate} gate on {label}: {why}"


def _layout_label(layout: ParallelLayout) -> str:
    out = f"tp{layout.tp} cp{layout.cp} pp{layout.pp} dp{layout.dp}"
    if layout.ep > 1:
        out += f" ep{layout.ep}"
    if layout.etp is not None:
        out += f" etp{layout.etp}"
    if layout.vpp is not None:
        out += f" vpp{layout.vpp}"
    return out


def _render(report) -> str:
    from mtpdiag.report import render, terminal_width

    return render(report, "console", color=sys.stdout.isatty(), width=terminal_width()).rstrip("\n")


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" if line else line for line in text.splitlines())


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
