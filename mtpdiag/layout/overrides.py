"""Hydra's override grammar, as far as mtpdiag reads it: ``key=value``, ``+key=value``, ``++key=value`` and
``~key[=value]`` (hydra's OverrideParser.g4).

A key is a dotted path (``actor_rollout_ref.actor.megatron.context_parallel_size``, ``list.0.item``), a
config group (``hydra/launcher``), either followed by ``@package``. Its names start with a letter, ``_`` or
``$`` and go on with letters, digits, ``_``, ``-`` and ``$`` (hydra's key identifiers); a list index is an
unsigned integer. The value is everything after the ``=`` (hydra allows spaces around it). The verl config
reader applies overrides; the command-line reader takes the sizes out of them: both read them here, so a
token one of them takes is a token the other takes.
"""

from __future__ import annotations

import re

import msgspec

_NAME = r"[A-Za-z_$][A-Za-z0-9_$-]*"
_INDEX = r"(?:0|[1-9](?:_?[0-9])*)"
_PART = rf"(?:{_NAME}|{_INDEX})"
_PACKAGE = rf"(?:{_NAME}|{_PART}(?:\.{_PART})+)"  # a name, or a dotted path (which may hold list indices)
_GROUP = rf"{_NAME}(?:/{_NAME})+"
KEY = rf"(?:{_GROUP}|{_PACKAGE})(?:@{_PACKAGE})?"
_OVERRIDE = re.compile(rf"^(?P<op>\+\+|\+|~)?(?P<key>{KEY})(?:=(?P<value>.*))?$", re.DOTALL)


class Override(msgspec.Struct, frozen=True):
    """One override. ``op``: "" (set), "+" (add), "++" (add or set) or "~" (delete); ``value`` is None only
    for a delete without one."""

    op: str
    key: str
    value: str | None

    @property
    def is_delete(self) -> bool:
        return self.op == "~"

    @property
    def selects_a_group(self) -> bool:
        """A config-group choice (``engine@engine=megatron``, ``hydra/launcher=x``): it names another file."""
        return "@" in self.key or "/" in self.key

    @property
    def path(self) -> tuple[str, ...]:
        """The key's dotted parts."""
        return tuple(self.key.split("."))


def parse_override(token: str) -> Override | None:
    """The override ``token`` spells, or None when it is not one (a flag, a word, ``1abc=2``)."""
    m = _OVERRIDE.match(token)
    if m is None or (m["value"] is None and m["op"] != "~"):
        return None
    return Override(op=m["op"] or "", key=m["key"], value=m["value"])
