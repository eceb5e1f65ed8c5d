"""Parallel sizes read from a command line (Megatron-LM flags, verl hydra overrides, short flags).

Only the sizes leave this module: a command line may carry secrets, so callers pass argv in and get
``{"tp": 2, ...}`` back, and must not keep argv.
"""

from __future__ import annotations

import re

from mtpdiag.layout.overrides import parse_override
from mtpdiag.vocabulary.sizes import CONFIG_SECTIONS, HYDRA_KEYS, MEGATRON_FLAGS, SHORT_FLAGS

# Hydra prefixes that describe the trained model (the actor, or the SFT trainer's engine). Other
# ``*.megatron.*`` groups (ref, critic, reward model) count only where these say nothing; a rollout's
# ``tensor_model_parallel_size`` is the inference engine's and never counts.
_PRIMARY_PREFIXES = tuple(section + "." for section in CONFIG_SECTIONS)
_INT = re.compile(r"[0-9]{1,9}")  # ASCII and bounded: int() refuses 5000 digits


def layout_hints(argv: list[str]) -> dict[str, int]:
    """Parallel sizes named on ``argv``; when one size is given twice the last one wins."""
    primary: dict[str, int] = {}
    secondary: dict[str, int] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, eq, inline = token.partition("=")
        if flag in MEGATRON_FLAGS or flag in SHORT_FLAGS:
            key = MEGATRON_FLAGS.get(flag) or SHORT_FLAGS[flag]
            if eq:
                _put(primary, key, inline)
            elif i + 1 < len(argv) and _size(argv[i + 1]) is not None:
                _put(primary, key, argv[i + 1])
                i += 1
        else:
            override = parse_override(token)
            if override is not None and not override.is_delete and not override.selects_a_group:
                _take_override(override.key, override.value or "", primary, secondary)
        i += 1
    return {**secondary, **primary}


def merge_hints(*sources: dict[str, int]) -> dict[str, int]:
    """Merge hint dicts; an earlier source wins over a later one for the same key."""
    out: dict[str, int] = {}
    for hints in sources:
        for key, value in hints.items():
            out.setdefault(key, value)
    return out


def _take_override(path: str, value: str, primary: dict[str, int], secondary: dict[str, int]) -> None:
    head, _, last = path.rpartition(".")
    key = HYDRA_KEYS.get(last)
    if key is None or not head:
        return
    if path.startswith(_PRIMARY_PREFIXES):
        _put(primary, key, value)
    elif "megatron" in head.split("."):
        _put(secondary, key, value)


def _put(into: dict[str, int], key: str, raw: str) -> None:
    size = _size(raw)
    if size is not None:
        into.pop(key, None)
        into[key] = size


def _size(raw: str) -> int | None:
    raw = raw.strip().strip("'\"")
    if not _INT.fullmatch(raw):
        return None
    value = int(raw)
    return value if value >= 1 else None
