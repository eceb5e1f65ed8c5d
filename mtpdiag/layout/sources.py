"""Where a job's parallel layout comes from: explicit flags, a verl config, or the targets' command lines.

A hang report is only as good as its layout: a wrong cp or pp puts ranks in the wrong groups and the
diagnosis blames the wrong collective. So the sources must agree with each other, and the one-line
``source`` that comes back tells the reader where the layout was taken from. Reading the config file is
the only I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from mtpdiag.errors import InputError
from mtpdiag.layout.megatron import LayoutError, ParallelLayout
from mtpdiag.vocabulary.sizes import COMMAND_LINE_FLAGS, CONFIG_NAMES, SOURCE_KEYS

HINTS = "command line of the target processes"


class _Source(msgspec.Struct, frozen=True):
    """One place sizes came from, and how that place spells a size (for conflict messages)."""

    name: str  # "flags", "config job.yaml", "command line of the target processes"
    label: str  # what the returned ``source`` says about it
    values: Mapping[str, int | str]
    spell: Callable[[str, object], str]
    world_size: int | None = None  # a world size the source implies, if any


def read_verl_config(path: str, overrides: Iterable[str] = ()) -> dict[str, int]:
    """Parallel sizes of the trained model in a verl config, after hydra-style ``overrides``.

    Only the actor (or the SFT trainer's engine) counts: the rollout's and the critic's sizes describe
    other worker groups. Returns the sizes that are set among tp, cp, pp, ep, etp and vpp; a null value
    means unset and is left out, so the caller can tell "1" from "not said".
    """
    from mtpdiag.layout.verl_config import read_sizes  # omegaconf costs ~0.1 s: only when a config is read

    return read_sizes(path, overrides)[0]


def resolve_layout(
    world_size: int | None,
    *,
    flags: Mapping[str, int | str | None],
    config: str | None = None,
    overrides: Iterable[str] = (),
    hints: Iterable[Mapping[str, int | str]] = (),
    holds_rank: int | None = None,
) -> tuple[ParallelLayout | None, str | None]:
    """The job's layout and a one-line account of where it came from.

    Sources, in priority order: ``flags`` (None values mean "not given"), the verl ``config`` with its
    ``overrides``, and ``hints`` read from the target processes' command lines. Sizes are merged across
    sources, and a size that two sources give differently is an error: guessing which one is stale would
    put ranks in the wrong groups without telling anyone. Returns (None, None) when there is no source.

    When the world size is neither given nor implied by the config (dumps of one node, without WORLD_SIZE),
    the smallest world those sizes fit that holds rank ``holds_rank`` is assumed, and the source says so;
    without ``holds_rank`` the layout is (None, source).
    """
    overrides = list(overrides)
    if overrides and not config:
        raise InputError(f"config overrides given without a config file: {overrides[0]}")
    sources = [
        s for s in (_flag_source(flags), _config_source(config, overrides), _hint_source(hints)) if s is not None
    ]
    if not sources:
        return None, None
    values = _merge(sources)
    source = " + ".join(s.label for s in sources)
    if world_size is None:
        world_size = next((s.world_size for s in sources if s.world_size), None)
        if world_size is not None:
            source += f" (world size {world_size} from trainer.nnodes * trainer.n_gpus_per_node)"
        elif holds_rank is None:
            return None, source
        else:
            layout = smallest_world(values, holds_rank)
            if layout is None:
                raise InputError(f"no world with these sizes ({source}) holds rank {holds_rank}")
            return layout, (
                f"{source} (world size unknown: {layout.world_size} assumed, the smallest these "
                f"sizes fit that holds rank {holds_rank}; pass --world-size)"
            )
    try:
        layout = ParallelLayout.for_world(world_size, **_arguments(values))
    except LayoutError as exc:
        if any(s.name != HINTS for s in sources):
            raise InputError(str(exc)) from None
        # Sizes read off command lines are a guess (another job's may be among them): a guess that does not fit
        # is dropped and said, never the reason a hung job gets no report.
        return None, f"{source}, which does not fit ({exc})"
    return layout, source


def _arguments(values: Mapping[str, int | str]) -> dict[str, Any]:
    """The sizes (ints) and the order (a string) as ``ParallelLayout.for_world``'s keyword arguments: it checks
    each one's type and value, and says which is wrong."""
    return dict(values)


def smallest_world(values: Mapping[str, int | str], holds_rank: int, limit: int = 1 << 18) -> ParallelLayout | None:
    """The layout of the smallest world that ``values`` (sizes without dp) fit and that holds ``holds_rank``."""
    step = 1
    for key in ("tp", "cp", "pp"):
        step *= int(values.get(key, 1) or 1)
    world = max(step, -(-(holds_rank + 1) // step) * step)
    while world <= limit:
        try:
            return ParallelLayout.for_world(world, **_arguments(values))
        except LayoutError:
            world += step
    return None


def _flag_source(flags: Mapping[str, int | str | None]) -> _Source | None:
    values = _checked({k: v for k, v in flags.items() if v is not None}, "flags")
    if not values:
        return None
    shown = " ".join(_spell_mtpdiag_flag(k, v) for k, v in values.items())
    return _Source("flags", f"flags {shown}", values, _spell_mtpdiag_flag)


def _config_source(path: str | None, overrides: list[str]) -> _Source | None:
    if not path:
        return None
    from mtpdiag.layout.verl_config import read_sizes

    values, world_size = read_sizes(path, overrides)
    label = f"verl config {path}" + (f" with {len(overrides)} override(s)" if overrides else "")
    return _Source(f"config {path}", label, values, _spell_config_key, world_size)


def _hint_source(hints: Iterable[Mapping[str, int | str]]) -> _Source | None:
    """Merge per-process hints; processes of one job that disagree mean the targets are not one job."""
    merged: dict[str, int | str] = {}
    for hint in hints:
        unknown = sorted(set(hint) - set(SOURCE_KEYS))
        if unknown:  # hints come from files too: a damaged or foreign bundle is bad input, not a bug
            raise InputError(
                f"a capture's layout hints hold unknown keys {unknown[:3]} (expected {', '.join(SOURCE_KEYS)})"
            )
        for key, value in _checked(hint, "hints").items():
            if key in merged and merged[key] != value:
                raise InputError(
                    f"layout conflict between target processes: {_spell_flag(key, merged[key])} on one, "
                    f"{_spell_flag(key, value)} on another; pass the layout with flags or --config"
                )
            merged[key] = value
    if not merged:
        return None
    shown = " ".join(_spell_flag(k, merged[k]) for k in SOURCE_KEYS if k in merged)
    return _Source(HINTS, f"command line ({shown})", merged, _spell_flag)


def _spell_mtpdiag_flag(key: str, value: object) -> str:
    return f"--{key} {value}"


def _spell_config_key(key: str, value: object) -> str:
    return f"{CONFIG_NAMES[key]}={value}"


def _spell_flag(key: str, value: object) -> str:
    return f"{COMMAND_LINE_FLAGS[key]} {value}"


def _checked(values: Mapping[str, int | str], what: str) -> dict[str, int | str]:
    """Reject keys a caller should never pass (a programming error, not bad user input)."""
    unknown = set(values) - set(SOURCE_KEYS)
    if unknown:
        raise ValueError(f"unknown layout keys in {what}: {sorted(unknown)}")
    return {k: values[k] for k in SOURCE_KEYS if k in values}


def _merge(sources: list[_Source]) -> dict[str, int | str]:
    """One value per key; the first source to give a key sets it, and any other value is a conflict."""
    merged: dict[str, tuple[int | str, _Source]] = {}
    for source in sources:
        for key, value in source.values.items():
            if key not in merged:
                merged[key] = (value, source)
            elif merged[key][0] != value:
                first_value, first = merged[key]
                raise InputError(
                    f"layout conflict: {first.spell(key, first_value)} ({first.name}) but "
                    f"{source.spell(key, value)} ({source.name})"
                )
    return {key: value for key, (value, _) in merged.items()}
