"""The words of ``mtpdiag run``'s multi-node record (``hang-<time>/nodes.json``, docs/design.md)."""

from __future__ import annotations

from mtpdiag.vocabulary.states import StrEnum


class NodeRole(StrEnum):
    """How a node's bundle came into a shared hang directory."""

    CALLED = "called"  # the node called the hang itself (its own quiet window ran out)
    SAW = "saw"  # another node called it first: this node saw the directory appear and dropped its ranks in
