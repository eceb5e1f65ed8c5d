"""Where a job's parallel layout comes from: explicit flags, a verl config, or the targets' command lines.

A hang report is only as good as its layout: a wrong cp or pp puts ranks in the wrong groups and the
diagnosis blames the wrong collective. So the sources must agree with each other, and the one-line
``source`` that comes back tells the reader where the layout was taken from. Reading the config file is
the only I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtpdiag.errors import InputError
from mtpdiag.layout import LayoutError, ParallelLayout
from mtpdiag.model import decimal

SIZE_KEYS = ("tp", "cp", "pp", "ep", "etp", "vpp")
# Keys a flags or hints dict may carry: the sizes, and the rank order (a string).
SOURCE_KEYS = (*SIZE_KEYS, "order")

# megatron-core's argument names, which verl uses unchanged in its megatron config sections.
CONFIG_NAMES = {
    "tp": "tensor_model_parallel_size",
    "cp": "context_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
}

# The trained model's section: the PPO actor, or the SFT trainer's engine (``engine=megatron``).
CONFIG_SECTIONS = ("actor_rollout_ref.actor.megatron", "engine")

# How a command line hint is shown: Megatron-LM's flag names, the spelling people grep logs for.
COMMAND_LINE_FLAGS = {
    "tp": "--tensor-model-parallel-size",
    "cp": "--context-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
    "vpp": "--virtual-pipeline-model-parallel-size",
    "order": "--order",
}

_KEY = r"[A-Za-z_][\w-]*(?:[./@][\w-]+)*"  # dotted; @ and / only in config-group choices
_OVERRIDE = re.compile(rf"^\+{{0,2}}(?P<key>{_KEY})=(?P<value>.*)$", re.DOTALL)
_DELETE = re.compile(rf"^~(?P<key>{_KEY})(=.*)?$", re.DOTALL)


@dataclass(frozen=True)
class _Source:
    """One place sizes came from, and how that place spells a size (for conflict messages)."""

    name: str                      # "flags", "config job.yaml", "command line of the target processes"
    label: str                     # what the returned ``source`` says about it
    values: Mapping[str, int | str]
    spell: Callable[[str, object], str]
    world_size: int | None = None  # a world size the source implies, if any


def read_verl_config(path: str, overrides: Iterable[str] = ()) -> dict[str, int]:
    """Parallel sizes of the trained model in a verl config, after hydra-style ``overrides``.

    Only the actor (or the SFT trainer's engine) counts: the rollout's and the critic's sizes describe
    other worker groups. Returns the sizes that are set among tp, cp, pp, ep, etp and vpp; a null value
    means unset and is left out, so the caller can tell "1" from "not said".
    """
    return _read_verl(path, overrides)[0]


def resolve_layout(
    world_size: int | None,
    *,
    flags: Mapping[str, int | str | None],
    config: str | None = None,
    overrides: Iterable[str] = (),
    hints: Iterable[Mapping[str, int | str]] = (),
) -> tuple[ParallelLayout | None, str | None]:
    """The job's layout and a one-line account of where it came from.

    Sources, in priority order: ``flags`` (None values mean "not given"), the verl ``config`` with its
    ``overrides``, and ``hints`` read from the target processes' command lines. Sizes are merged across
    sources, and a size that two sources give differently is an error: guessing which one is stale would
    put ranks in the wrong groups without telling anyone. Returns (None, None) when there is no source,
    and (None, source) when the world size is neither given nor implied by the config.
    """
    overrides = list(overrides)
    if overrides and not config:
        raise InputError(f"config overrides given without a config file: {overrides[0]}")
    sources = [s for s in (_flag_source(flags), _config_source(config, overrides), _hint_source(hints))
               if s is not None]
    if not sources:
        return None, None
    values = _merge(sources)
    source = " + ".join(s.label for s in sources)
    if world_size is None:
        world_size = next((s.world_size for s in sources if s.world_size), None)
        if world_size is None:
            return None, source
        source += f" (world size {world_size} from trainer.nnodes * trainer.n_gpus_per_node)"
    try:
        layout = ParallelLayout.for_world(world_size, **values)
    except LayoutError as exc:
        raise InputError(str(exc)) from None
    return layout, source


def _flag_source(flags: Mapping[str, int | str | None]) -> _Source | None:
    values = _checked({k: v for k, v in flags.items() if v is not None}, "flags")
    if not values:
        return None
    shown = " ".join(_spell_mtpdiag_flag(k, v) for k, v in values.items())
    return _Source("flags", f"flags {shown}", values, _spell_mtpdiag_flag)


def _config_source(path: str | None, overrides: list[str]) -> _Source | None:
    if not path:
        return None
    values, world_size = _read_verl(path, overrides)
    label = f"verl config {path}" + (f" with {len(overrides)} override(s)" if overrides else "")
    return _Source(f"config {path}", label, values, _spell_config_key, world_size)


def _hint_source(hints: Iterable[Mapping[str, int | str]]) -> _Source | None:
    """Merge per-process hints; processes of one job that disagree mean the targets are not one job."""
    merged: dict[str, int | str] = {}
    for hint in hints:
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
    return _Source("command line of the target processes", f"command line ({shown})", merged, _spell_flag)


def _spell_mtpdiag_flag(key: str, value: object) -> str:
    return f"--{key} {value}"


def _spell_config_key(key: str, value: object) -> str:
    return f"{CONFIG_NAMES[key]}={value}"


def _spell_flag(key: str, value: object) -> str:
    return f"{COMMAND_LINE_FLAGS[key]} {value}"


def _checked(values: Mapping[str, object], what: str) -> dict[str, int | str]:
    """Reject keys a caller should never pass (a programming error, not bad user input)."""
    unknown = set(values) - set(SOURCE_KEYS)
    if unknown:
        raise ValueError(f"unknown layout keys in {what}: {sorted(unknown)}")
    return {k: values[k] for k in SOURCE_KEYS if k in values}


def _merge(sources: list[_Source]) -> dict[str, int | str]:
    """One value per key; the first source to give a key sets it, and any other value is a conflict."""
    merged: dict[str, tuple[object, _Source]] = {}
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


def _read_verl(path: str, overrides: Iterable[str]) -> tuple[dict[str, int], int | None]:
    """Sizes of the trained model, and the world size ``trainer`` implies (None if it does not)."""
    cfg = _load(path)
    for override in overrides:
        _apply_override(cfg, override, path)
    section_name, section = _megatron_section(cfg, path)
    sizes: dict[str, int] = {}
    for key, name in CONFIG_NAMES.items():
        value = _select(section, name, path, f"{section_name}.{name}")
        if value is not None:
            sizes[key] = _positive_int(value, path, f"{section_name}.{name}")
    nnodes = _select(cfg, "trainer.nnodes", path, "trainer.nnodes")
    per_node = _select(cfg, "trainer.n_gpus_per_node", path, "trainer.n_gpus_per_node")
    world_size = None
    if _is_positive_int(nnodes) and _is_positive_int(per_node):
        world_size = nnodes * per_node
    return sizes, world_size


def _load(path: str) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except OSError as exc:
        raise InputError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        raise InputError(f"config {path} is not valid YAML: {_first_line(exc)}") from None
    except RecursionError:
        raise InputError(f"config {path} is nested too deeply to be a verl config") from None
    if not isinstance(cfg, DictConfig):
        raise InputError(f"config {path} is not a YAML mapping")
    return cfg


def _apply_override(cfg: DictConfig, override: str, path: str) -> None:
    """Hydra's ``key=value``, ``+key=value``, ``++key=value`` and ``~key``, on the loaded file.

    Unlike hydra, ``key=value`` may add a key: the file may be only the top of a hydra defaults tree, so
    a key the job really has can be missing from it. Config-group choices (``engine=megatron``,
    ``+engine@engine=megatron``) select other files, which cannot be composed here; they are skipped.
    """
    delete = _DELETE.match(override)
    match = None if delete else _OVERRIDE.match(override)
    if not (delete or match):
        raise InputError(f"bad override {override!r} for config {path}: expected key=value")
    try:
        if delete:
            _delete(cfg, delete["key"])
            return
        key = match["key"]
        value = yaml.safe_load(match["value"]) if match["value"].strip() else ""
        if "@" in key or "/" in key:
            return
        if isinstance(value, str) and isinstance(OmegaConf.select(cfg, key, default=None,
                                                                  throw_on_resolution_failure=False),
                                                 DictConfig):
            return
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        raise InputError(f"bad override {override!r} for config {path}: {_first_line(exc)}") from None
    except RecursionError:  # a self-referencing YAML alias (&a [*a]) or absurd nesting
        raise InputError(f"bad override {override!r} for config {path}: nested too deeply") from None


def _delete(cfg: DictConfig, key: str) -> None:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if isinstance(parent, DictConfig) and leaf in parent:
        del parent[leaf]


def _megatron_section(cfg: DictConfig, path: str) -> tuple[str, DictConfig]:
    for name in CONFIG_SECTIONS:
        section = OmegaConf.select(cfg, name, throw_on_resolution_failure=False)
        if isinstance(section, DictConfig) and any(key in section for key in CONFIG_NAMES.values()):
            return name, section
    raise InputError(f"config {path} has no megatron section ({' or '.join(CONFIG_SECTIONS)} with "
                     f"{CONFIG_NAMES['tp']} etc.)")


def _select(node: DictConfig, key: str, path: str, shown: str) -> object:
    try:
        return OmegaConf.select(node, key, default=None)
    except OmegaConfBaseException as exc:
        raise InputError(f"config {path}: cannot resolve {shown}: {_first_line(exc)}") from None


def _positive_int(value: object, path: str, shown: str) -> int:
    if isinstance(value, str) and decimal(value) is not None:
        value = decimal(value)
    if not _is_positive_int(value):
        raise InputError(f"config {path}: {shown} must be a positive integer or null, got {value!r}")
    return value


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _first_line(exc: BaseException) -> str:
    """A one-line reason; YAML errors say what and where, without the multi-line context."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark or exc.context_mark
        return exc.problem + (f" (line {mark.line + 1})" if mark else "")
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
