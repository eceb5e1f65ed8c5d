"""Reading verl configs: OmegaConf with hydra-style overrides (kept apart: omegaconf is slow to import)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeGuard

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtpdiag.errors import InputError
from mtpdiag.layout.overrides import parse_override
from mtpdiag.model import decimal
from mtpdiag.vocabulary.sizes import CONFIG_NAMES, CONFIG_SECTIONS


def read_sizes(path: str, overrides: Iterable[str]) -> tuple[dict[str, int], int | None]:
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
    parsed = parse_override(override)
    if parsed is None:
        raise InputError(f"bad override {override!r} for config {path}: expected key=value")
    try:
        if parsed.is_delete:
            _delete(cfg, parsed.key)
            return
        key, raw = parsed.key, parsed.value or ""
        value = yaml.safe_load(raw) if raw.strip() else ""
        if parsed.selects_a_group:
            return
        if isinstance(value, str) and isinstance(
            OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False), DictConfig
        ):
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
    raise InputError(
        f"config {path} has no megatron section ({' or '.join(CONFIG_SECTIONS)} with {CONFIG_NAMES['tp']} etc.)"
    )


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


def _is_positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _first_line(exc: BaseException) -> str:
    """A one-line reason; YAML errors say what and where, without the multi-line context."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark or exc.context_mark
        return exc.problem + (f" (line {mark.line + 1})" if mark else "")
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
