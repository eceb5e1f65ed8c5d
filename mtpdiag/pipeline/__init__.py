"""The stages wired together, as every command runs them: capture or read → resolve the layout → diagnose →
report (``watch``'s samples, which tell a hang from slow progress, are ``sampling``). What each stage does lives in
its package; this module only connects them, and says on stderr what the report would otherwise leave a script to
find.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from mtpdiag.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_PROBLEM, InputError, NothingCaptured
from mtpdiag.model import Report, Snapshot, replace, who_and_why
from mtpdiag.vocabulary.states import Verdict

if TYPE_CHECKING:  # watch's and --ray's parts, imported where they run
    from mtpdiag.capture.ray_cluster import RayCluster
    from mtpdiag.model.flight_recorder import FRDump
    from mtpdiag.model.watchdog import WatchdogLog

# The largest world mtpdiag diagnoses; the analysis and the reports are linear in it.
MAX_WORLD_SIZE = 1 << 18


class LayoutOptions(msgspec.Struct, frozen=True):
    tp: int | None = None
    cp: int | None = None
    pp: int | None = None
    ep: int | None = None
    etp: int | None = None
    vpp: int | None = None
    order: str | None = None
    config: str | None = None
    overrides: tuple[str, ...] = ()
    world_size: int | None = None

    def flags(self) -> dict[str, int | str | None]:
        out: dict[str, int | str | None] = {k: getattr(self, k) for k in ("tp", "cp", "pp", "ep", "etp", "vpp")}
        if self.order:
            out["order"] = self.order
        return out


def world_size_of(snapshot: Snapshot) -> int | None:
    """``Snapshot.world_size``, under the name ``fix.verify.plan`` still imports."""
    return snapshot.world_size


def with_flight_recorder(snapshot: Snapshot, request: bool = False, wait_s: float = 10.0) -> Snapshot:
    """The snapshot with the Flight Recorder dumps its ranks wrote (or, with ``request``, write now through the
    job's debug-info pipe); what could not be had is said on stderr."""
    from mtpdiag.capture.flight_recorder import with_dumps

    snapshot, notes = with_dumps(snapshot, request=request, wait_s=wait_s)
    for note in notes:
        print(f"mtpdiag: note: {_one_printable_line(note)}", file=sys.stderr)
    return snapshot


def capture_ray(cluster: RayCluster, said: set[str] | None = None, **options: Any) -> Snapshot:
    """``--ray``: every node's ranks, captured through Ray (``capture.ray_cluster``). Each node that could not be
    captured is a stderr line with the reason (once: not again when it is in ``said``), and a line of the
    snapshot's errors (so of the report's notes and of a bundle); the nodes that answered make the snapshot."""
    result = cluster.capture(**options)
    said = set() if said is None else said
    for line in (*result.failed, *result.notes):
        if line not in said:
            said.add(line)
            print(f"mtpdiag: warning: {_one_printable_line(line)}", file=sys.stderr)
    captures = result.snapshot.captures
    if not captures and not result.failed:
        raise InputError(
            f"no node of the Ray cluster at {cluster.address} runs a process with RANK in its "
            f"environment ({len(result.nodes)} nodes asked)"
        )
    if not any(c.threads for c in captures):
        first = result.failed[0] if result.failed else who_and_why(captures[0])
        raise NothingCaptured(
            f"nothing could be captured on the {len(result.nodes)} nodes of the Ray cluster (first: {first})"
        )
    return result.snapshot


def import_ahead(formats: tuple[str, ...]) -> None:
    """Import what ``with_flight_recorder``, ``diagnose_snapshot`` and the renderers of ``formats`` will import.

    ``inspect`` calls this while py-spy dumps the ranks (``capture(meanwhile=...)``): the imports (about a
    third of its start-up) then overlap that wait instead of following it.
    """
    import importlib

    from mtpdiag.report import RENDERERS

    for module in (
        "mtpdiag.capture.flight_recorder",
        "mtpdiag.analysis",
        "mtpdiag.layout.sources",
        *(f"mtpdiag.report.{RENDERERS[fmt].module}" for fmt in formats),
    ):
        importlib.import_module(module)
    if "console" in formats:
        try:  # rich loads its emoji table with the first markup it renders (a private module: skipped if moved)
            importlib.import_module("rich._emoji_codes")
        except ImportError:
            pass


def with_world_size(snapshot: Snapshot, world_size: int) -> Snapshot:
    """Give every capture that lacks WORLD_SIZE the one from --world-size."""
    captures = tuple(
        c if c.world_size else replace(c, env=replace(c.env, WORLD_SIZE=str(world_size))) for c in snapshot.captures
    )
    return replace(snapshot, captures=captures)


def diagnose_snapshot(
    snapshot: Snapshot, layout_options: LayoutOptions, fr: FRDump | None = None, log: WatchdogLog | None = None
) -> Report:
    """Resolve the layout (flags, config, target command lines) and diagnose the snapshot.

    The world size is the captures' WORLD_SIZE (``analyze --world-size`` fills it in), else the config's;
    failing both, the layout of the smallest world the sizes fit that holds every captured rank is assumed,
    and said so. Never the number of files: one node's dumps of a 1,000-rank job are 8 of 1,000 ranks.
    """
    from mtpdiag.analysis import diagnose
    from mtpdiag.layout.sources import resolve_layout

    # The distinct hints only, in capture order: the ranks of one job mostly carry the same ones (so the
    # list stays short and each capture's hints are compared, not copied).
    hints: list[dict[str, int]] = []
    for capture in snapshot.captures:
        if capture.layout_hints and capture.layout_hints not in hints:
            hints.append(dict(capture.layout_hints))
    world_size = snapshot.world_size or layout_options.world_size
    if world_size is None and fr is not None:
        from mtpdiag.analysis.flight_recorder.evidence import world_size as recorded_world

        world_size = recorded_world(fr)
    _check_world_size(world_size, "WORLD_SIZE of the inputs")
    ranks = [c.rank for c in snapshot.captures if c.rank is not None]
    ranks += [d.rank for d in fr.ranks] if fr is not None else []
    ranks += [t.rank for t in log.timeouts if t.rank is not None] if log is not None else []
    _check_world_size(max(ranks) + 1 if ranks else None, "the highest rank in the inputs")
    layout, source = resolve_layout(
        world_size,
        flags=layout_options.flags(),
        config=layout_options.config,
        overrides=list(layout_options.overrides),
        hints=hints,
        holds_rank=max(ranks) if ranks and world_size is None else None,
    )
    _check_world_size(layout.world_size if layout else None, "the config's trainer.nnodes * n_gpus_per_node")
    return diagnose(snapshot, layout, source, fr=fr, log=log)


def _check_world_size(world_size: int | None, source: str) -> None:
    """A corrupt or hostile WORLD_SIZE (10**12) would have the analysis walk every rank for ever."""
    if world_size is not None and world_size > MAX_WORLD_SIZE:
        raise InputError(
            f"world size {world_size} (from {source}) is more than mtpdiag handles ({MAX_WORLD_SIZE} ranks)"
        )


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run a one-shot read → diagnose → report without Python's cyclic garbage collector.

    The model's Structs are untracked by the GC already, but the analysis of 16k ranks still makes
    hundreds of thousands of tuples, dicts and lists: their collections cost 0.12 s of about 0.6 s at
    16k host-bundle ranks. Nothing made here forms a cycle that must be freed before the command exits
    (reference counting frees the rest).

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
        parts.append(f"{len(missed)} of {len(snapshot.captures)} ranks not captured (first: {who_and_why(missed[0])})")
    if snapshot.errors:
        parts.append(f"{len(snapshot.errors)} input(s) skipped (first: {snapshot.errors[0]})")
    if parts:
        rest = (
            "no rank's stack could be read" if len(missed) == len(snapshot.captures) else "the report covers the rest"
        )
        print(f"mtpdiag: warning: {_one_printable_line('; '.join(parts))}; {rest}", file=sys.stderr)


def _one_printable_line(text: str, limit: int = 400) -> str:
    """Text from targets or files, safe for a terminal: no control characters, one line, bounded."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exit_code(report: Report) -> int:
    """1 for a problem, 4 when ranks are stuck but the evidence cannot say why, 0 only when no rank is."""
    if report.verdict == Verdict.PROBLEM:
        return EXIT_PROBLEM
    if report.verdict == Verdict.INCOMPLETE:
        return EXIT_INCOMPLETE
    return EXIT_OK


def hang_bundle_path(out: Path | None, snapshot: Snapshot) -> str:
    """``--out FILE`` as given; in a directory (``--out DIR``, or the current one) a new file per hang, named
    for the host and the time, so that the bundle of an earlier hang is never overwritten."""
    directory = str(out) if out is not None and os.path.isdir(out) else None
    if out is not None and directory is None:
        return str(out)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(directory or os.getcwd(), f"mtpdiag-hang-{_safe(snapshot.host)}-{stamp}")
    path, n = base + ".json", 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}.json"
    return path


def _safe(host: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in host) or "unknown"
