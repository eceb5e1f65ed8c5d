"""Options shared by several subcommands, and the capture → diagnose → report plumbing they share."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from mtpdiag.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_PROBLEM, InputError
from mtpdiag.model import Report, Snapshot, who_and_why

# typer options (module-level so every command spells them the same way)
PID = typer.Option(None, "--pid", help="A worker pid, or a launcher (torchrun agent, raylet) to expand. Repeatable.")
ALL = typer.Option(False, "--all", help="Every process on this host whose environment has RANK and WORLD_SIZE.")
NATIVE = typer.Option(False, "--native", help="Pass --native to py-spy: C/C++ frames too, as evidence of what "
                      "each rank waits on (the call site stays the Python one).")
NATIVE_TIMEOUT = typer.Option(30.0, "--native-timeout", min=0.1, help="Seconds to wait for each --native dump "
                              "before dumping that rank again without it.")
NONBLOCKING = typer.Option(False, "--nonblocking", help="Never pause the targets (py-spy --nonblocking).")
TIMEOUT = typer.Option(10.0, "--timeout", min=0.1, help="Seconds to wait for each py-spy dump.")
TP = typer.Option(None, "--tp", min=1, help="Tensor-parallel size.")
CP = typer.Option(None, "--cp", min=1, help="Context-parallel size.")
PP = typer.Option(None, "--pp", min=1, help="Pipeline-parallel size.")
EP = typer.Option(None, "--ep", min=1, help="Expert-parallel size.")
ETP = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel size.")
VPP = typer.Option(None, "--vpp", min=1, help="Virtual pipeline size.")
ORDER = typer.Option(None, "--order", help="Megatron rank order (default tp-cp-ep-dp-pp).")
CONFIG = typer.Option(None, "--config", help="A verl config YAML to read the parallel sizes from.")
OVERRIDE = typer.Option(None, "--override", help="A hydra key=value override for --config. Repeatable.")
JSON = typer.Option(False, "--json", help="Print the mtpdiag.report/1 JSON document.")
MARKDOWN = typer.Option(False, "--markdown", help="Print a markdown report for an incident ticket.")
HTML = typer.Option(None, "--html", help="Also write a self-contained HTML report to this file.")


# The largest world mtpdiag diagnoses; the analysis and the reports are linear in it.
MAX_WORLD_SIZE = 1 << 18


@dataclass(frozen=True)
class LayoutOptions:
    tp: Optional[int] = None
    cp: Optional[int] = None
    pp: Optional[int] = None
    ep: Optional[int] = None
    etp: Optional[int] = None
    vpp: Optional[int] = None
    order: Optional[str] = None
    config: Optional[str] = None
    overrides: tuple[str, ...] = ()
    world_size: Optional[int] = None

    def flags(self) -> dict:
        out = {k: getattr(self, k) for k in ("tp", "cp", "pp", "ep", "etp", "vpp")}
        if self.order:
            out["order"] = self.order
        return out


def world_size_of(snapshot: Snapshot) -> int | None:
    """The largest WORLD_SIZE the captures carry (diagnose() notes any disagreement)."""
    sizes = snapshot.world_sizes
    return sizes[-1] if sizes else None


def with_flight_recorder(snapshot: Snapshot, request: bool = False, wait_s: float = 10.0) -> Snapshot:
    """The snapshot with the Flight Recorder dumps its ranks wrote (or, with ``request``, write now through the
    job's debug-info pipe); what could not be had is said on stderr."""
    from dataclasses import replace

    from mtpdiag.capture.flight_recorder import find_dumps

    found = find_dumps(snapshot.captures, request=request, wait_s=wait_s)
    if found.dumps is None:
        if request:
            for note in found.notes:
                typer.echo(f"mtpdiag: note: {_one_printable_line(note)}", err=True)
        return snapshot
    dumps = replace(found.dumps, notes=(*found.dumps.notes, *found.notes))
    return replace(snapshot, flight_recorder=dumps)


def check_formats(as_json: bool, as_markdown: bool) -> None:
    """Refuse contradictory output flags before anything is captured or sampled."""
    if as_json and as_markdown:
        raise InputError("choose one of --json and --markdown")


def diagnose_snapshot(snapshot: Snapshot, layout_options: LayoutOptions, fr=None, log=None) -> Report:
    """Resolve the layout (flags, config, target command lines) and diagnose the snapshot.

    The world size is the captures' WORLD_SIZE (``analyze --world-size`` fills it in), else the config's;
    failing both, the layout of the smallest world the sizes fit that holds every captured rank is assumed,
    and said so. Never the number of files: one node's dumps of a 1,000-rank job are 8 of 1,000 ranks.
    """
    from mtpdiag.analysis import diagnose
    from mtpdiag.layout.sources import resolve_layout

    # The distinct hints only, in capture order: the ranks of one job mostly carry the same ones.
    hints = [dict(h) for h in dict.fromkeys(c.layout_hints for c in snapshot.captures if c.layout_hints)]
    world_size = world_size_of(snapshot) or layout_options.world_size
    if world_size is None and fr is not None:
        from mtpdiag.analysis.flight_recorder.evidence import world_size as recorded_world

        world_size = recorded_world(fr)
    _check_world_size(world_size, "WORLD_SIZE of the inputs")
    ranks = [c.rank for c in snapshot.captures if c.rank is not None]
    ranks += [d.rank for d in fr.ranks] if fr is not None else []
    ranks += [t.rank for t in log.timeouts if t.rank is not None] if log is not None else []
    _check_world_size(max(ranks) + 1 if ranks else None, "the highest rank in the inputs")
    layout, source = resolve_layout(world_size, flags=layout_options.flags(),
                                    config=layout_options.config, overrides=list(layout_options.overrides),
                                    hints=hints, holds_rank=max(ranks) if ranks and world_size is None else None)
    _check_world_size(layout.world_size if layout else None, "the config's trainer.nnodes * n_gpus_per_node")
    return diagnose(snapshot, layout, source, fr=fr, log=log)


def _check_world_size(world_size: int | None, source: str) -> None:
    """A corrupt or hostile WORLD_SIZE (10**12) would have the analysis walk every rank for ever."""
    if world_size is not None and world_size > MAX_WORLD_SIZE:
        raise InputError(f"world size {world_size} (from {source}) is more than mtpdiag handles "
                         f"({MAX_WORLD_SIZE} ranks)")


def emit(report: Report, as_json: bool, as_markdown: bool, html: Optional[Path] = None) -> None:
    """Write the report to stdout in the chosen format (and HTML to a file when asked)."""
    check_formats(as_json, as_markdown)
    if html is not None:
        from mtpdiag.report import html as html_report

        _write_text(html, html_report.render(report))
    if as_json:
        from mtpdiag.report import json_report

        sys.stdout.write(json_report.render(report) + "\n")
    elif as_markdown:
        from mtpdiag.report import markdown

        sys.stdout.write(markdown.render(report))
    else:
        from mtpdiag.report import console

        sys.stdout.write(console.render(report, color=sys.stdout.isatty(), width=_width()))
    sys.stdout.flush()


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run a one-shot read → diagnose → report without Python's cyclic garbage collector.

    Parsing 2,048 bundles creates millions of acyclic containers, and each full collection walks all
    of them again: at 16k ranks that was a third of ``analyze``'s time. Nothing made here forms a
    cycle that must be freed before the command exits (reference counting frees the rest).

    On the way out, what was made is moved to the oldest generation (``freeze`` then ``unfreeze``)
    rather than left young: otherwise the first allocation after ``enable`` runs a young collection
    over everything made here (0.1 s at 16k ranks, after the report is written).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def warn_incomplete(snapshot: Snapshot) -> None:
    """One stderr line when part of the input could not be read: the report says so too, but a script that
    parses --json, or a person skimming the grid, should not have to look for it."""
    missed = [c for c in snapshot.captures if not c.threads]
    parts = []
    if missed:
        parts.append(f"{len(missed)} of {len(snapshot.captures)} ranks not captured "
                     f"(first: {who_and_why(missed[0])})")
    if snapshot.errors:
        parts.append(f"{len(snapshot.errors)} input(s) skipped (first: {snapshot.errors[0]})")
    if parts:
        typer.echo(f"mtpdiag: warning: {_one_printable_line('; '.join(parts))}; the report covers the rest",
                   err=True)


def _one_printable_line(text: str, limit: int = 400) -> str:
    """Text from targets or files, safe for a terminal: no control characters, one line, bounded."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exit_code(report: Report) -> int:
    """1 for a problem, 4 when ranks are stuck but the evidence cannot say why, 0 only when no rank is."""
    if report.verdict == "problem":
        return EXIT_PROBLEM
    if report.verdict == "incomplete":
        return EXIT_INCOMPLETE
    return EXIT_OK


def _width() -> int:
    import shutil

    return max(100, min(shutil.get_terminal_size((140, 40)).columns, 200))


def _write_text(path: Path, text: str) -> None:
    from mtpdiag.atomic import shared_mode, write_atomic

    try:
        write_atomic(path, text, mode=shared_mode())
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
