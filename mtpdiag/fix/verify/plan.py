"""What ``verify`` runs: the layout (flags, a verl config, or a hung job), and the gate of the engine to judge.

The layout sources are merged by ``layout.sources.resolve_layout`` as for ``inspect``; dp is the verify
world's own choice (the fewest replicas the layout allows, or the job's). Worlds are CPU processes here, so
``build_layout`` refuses more than ``MAX_WORLD``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mtpdiag.errors import InputError
from mtpdiag.fix.verify import MAX_WORLD
from mtpdiag.layout import LayoutError, ParallelLayout
from mtpdiag.vocabulary.states import CheckStatus, EngineGate

ENGINE_CHOICES = ("fixed", "buggy", "both", "installed")


@dataclass(frozen=True)
class EngineChoice:
    """The gates to run, named as the user named the engine, and what decided them."""

    mode: str  # both | single
    runs: tuple[tuple[str, str], ...]  # (engine label, gate)
    path: str | None = None
    described: str | None = None  # "installed engine .../transformer_impl.py (verl 0.7.1), affected: ..."


def resolve_verify_layout(
    flags: Mapping[str, int | None],
    *,
    dp: int | None,
    order: str | None,
    config: str | None,
    overrides: list[str],
    pid: int | None,
) -> tuple[ParallelLayout, str]:
    """The layout to verify, and where it came from: flags, a verl config, or a hung job (``--pid``).

    Sources are merged by ``layout.sources.resolve_layout``: a flag that contradicts the config or the
    job is an input error naming both. dp is the verify world's own choice (default 1, or the job's).
    """
    flag_sizes = {k: v for k, v in flags.items() if v is not None}
    given: dict[str, int | str] = {**flag_sizes, **({"order": order} if order else {})}
    if pid is not None:
        job, source = _job_layout(pid, given, config, overrides)
        sizes = {"tp": job.tp, "cp": job.cp, "pp": job.pp, "ep": job.ep, "etp": job.etp, "vpp": job.vpp}
        return build_layout(sizes, dp=dp or job.dp, order=job.order), f"pid {pid}: {source}"
    if config is not None:
        from mtpdiag.layout.sources import read_verl_config, resolve_layout

        sizes = {**read_verl_config(config, overrides), **flag_sizes}
        dp = dp or fewest_dp(sizes)
        world = dp * int(sizes.get("tp") or 1) * int(sizes.get("cp") or 1) * int(sizes.get("pp") or 1)
        resolve_layout(world, flags=given, config=config, overrides=overrides)  # flag-vs-config conflicts
        with_overrides = f" + {len(overrides)} override(s)" if overrides else ""
        return build_layout(sizes, dp=dp, order=order), f"verl config {config}{with_overrides}"
    if overrides:
        raise InputError("--override needs --config")
    return build_layout(flag_sizes, dp=dp, order=order), "flags"


def build_layout(sizes: Mapping[str, int | None], *, dp: int | None, order: str | None) -> ParallelLayout:
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
        raise InputError(
            f"tp*cp*pp*dp = {tp}*{cp}*{pp}*{dp} = {world} CPU processes; verify starts at most {MAX_WORLD}{hint}"
        )
    try:
        return ParallelLayout.for_world(
            world,
            tp=tp,
            cp=cp,
            pp=pp,
            ep=int(sizes.get("ep") or 1),
            vpp=sizes.get("vpp"),
            etp=sizes.get("etp"),
            **({"order": order} if order else {}),
        )
    except LayoutError as exc:
        raise InputError(str(exc)) from None


def fewest_dp(sizes: Mapping[str, int | None]) -> int:
    """The fewest DP replicas the expert layout allows: etp*ep must divide tp*cp*dp."""
    tp, cp = int(sizes.get("tp") or 1), int(sizes.get("cp") or 1)
    expert = int(sizes.get("etp") or tp) * int(sizes.get("ep") or 1)
    return next(d for d in range(1, expert + 1) if (tp * cp * d) % expert == 0)


def _job_layout(
    pid: int, given: Mapping[str, int | str], config: str | None, overrides: list[str]
) -> tuple[ParallelLayout, str]:
    """Capture the hung job once and resolve its layout as ``inspect`` does."""
    from mtpdiag.capture import capture
    from mtpdiag.layout.sources import resolve_layout
    from mtpdiag.pipeline import world_size_of

    snapshot = capture(pids=[pid])
    hints = [dict(c.layout_hints) for c in snapshot.captures if c.layout_hints]
    world = world_size_of(snapshot)
    layout, source = resolve_layout(world, flags=given, config=config, overrides=overrides, hints=hints)
    if layout is None:
        raise InputError(
            f"could not tell the parallel sizes of the job behind pid {pid} "
            f"({'no WORLD_SIZE' if source else 'no sizes on its command line'}); "
            "pass --tp/--cp/--pp or --config"
        )
    return layout, source or "?"


def choose_engine(engine: str) -> EngineChoice:
    """fixed, buggy, both; or the gate an engine file (the installed verl's, or a path) uses."""
    if engine == "both":
        return EngineChoice("both", (("buggy", "buggy"), ("fixed", "fixed")))
    if engine in (EngineGate.FIXED, EngineGate.BUGGY):
        return EngineChoice("single", ((engine, engine),))
    from mtpdiag.fix.engine import check_engine, locate_engine

    if engine == "installed":
        try:
            path = locate_engine()
        except InputError:
            raise InputError(
                "--engine installed: verl is not installed in this Python; pass --engine with "
                "the path to verl's workers/engine/megatron/transformer_impl.py, or buggy|fixed|both"
            ) from None
        if path is None:
            raise InputError(
                "the installed verl has no Megatron engine (workers/engine/megatron/"
                "transformer_impl.py): nothing to verify"
            )
    else:
        path = Path(engine)
        if not path.exists() and "/" not in engine and not engine.endswith(".py"):
            raise InputError(f"--engine {engine!r}: use one of {', '.join(ENGINE_CHOICES)} or a path to an engine file")
    check = check_engine(path)
    if check.gate is None or check.status in (CheckStatus.UNKNOWN, CheckStatus.NOT_APPLICABLE):
        raise InputError(
            f"{path}: {check.status}: {check.reason}; verify needs an engine whose MTP gate is "
            "known (or --engine buggy|fixed|both)"
        )
    version = f" (verl {check.verl_version})" if check.verl_version else ""
    label = "installed" if engine == "installed" else str(path)
    described = (
        f"{'installed ' if engine == 'installed' else ''}engine {path}{version}, {check.status}: the {check.gate} gate"
    )
    return EngineChoice("single", ((label, check.gate),), path=str(path), described=described)


def require_runtime() -> None:
    """verify's workers need torch and megatron-core (found without importing them) and py-spy."""
    for module, package in (("torch", "torch"), ("megatron", "megatron-core")):
        if importlib.util.find_spec(module) is None:
            raise InputError(f"verify needs {package} in this Python (pip install 'mtpdiag[verify]')")
    from mtpdiag.capture.pyspy import find_pyspy

    find_pyspy()
