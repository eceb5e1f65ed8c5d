"""torch's profiling names (``nccl:all_reduce``, ``nccl:send 0->1``, ``gloo:all_gather``) read into ops.

Every backend's work records ``<backend>:<type>[ <peers>]``. The type is torch's internal name
(``_all_gather_base``, ``all_reduce_barrier``, ``_broadcast_oop``); the report speaks the public function
names the stack analysis uses (``all_gather_into_tensor``, ``barrier``, ``broadcast``). Point-to-point
names carry the two ends as ranks *local to the group*: ``send 1->0`` is sent by group rank 1 to group
rank 0, ``recv 0<-1`` is received by group rank 0 from group rank 1 (ProcessGroupNCCL's ``pointToPoint``).

A batch (``batch_isend_irecv``, ``_coalescing_manager``, an uneven ``all_gather``) records each op with
no events of its own and then one closing entry that holds the state: ``coalesced`` after the parts of a
batch, ``ALLGATHER_coalesced`` after the ``_broadcast_oop`` parts of an uneven all_gather,
``REDUCE_SCATTER_coalesced`` after the ``_reduce_oop`` parts of an uneven reduce_scatter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mtpdiag.vocabulary.ops import RECORDED_BATCH_OPS, RECORDED_OPS, RECORDED_P2P

_SEND = re.compile(r"^(\d{1,9})->(\d{1,9})$")
_RECV = re.compile(r"^(\d{1,9})<-(\d{1,9})$")


@dataclass(frozen=True)
class ProfilingName:
    """One profiling name taken apart. ``src``/``dst`` are group-local ranks of a send/recv."""

    backend: str  # nccl | gloo | ... ("" when the name has no backend)
    type: str  # torch's name: _all_gather_base, send, coalesced, ...
    src: int | None = None
    dst: int | None = None

    @property
    def op(self) -> str:
        return RECORDED_OPS.get(self.type, self.type)

    @property
    def is_p2p(self) -> bool:
        return self.type in RECORDED_P2P

    @property
    def closes_batch(self) -> bool:
        """May close a batch of parts: ``coalesced`` or ``*_coalesced`` (torch's analyzer uses the same test)."""
        return self.type == "coalesced" or self.type.endswith("_coalesced")


def parse_profiling_name(name: str) -> ProfilingName:
    """``nccl:send 1->0`` -> backend nccl, type send, src 1, dst 0 (group-local ranks)."""
    backend, _, rest = name.partition(":") if ":" in name else ("", "", name)
    kind, _, peers = rest.strip().partition(" ")
    src = dst = None
    peers = peers.strip()
    if kind == "send" and (m := _SEND.match(peers)):
        src, dst = int(m.group(1)), int(m.group(2))
    elif kind == "recv" and (m := _RECV.match(peers)):
        dst, src = int(m.group(1)), int(m.group(2))
    return ProfilingName(backend=backend, type=kind, src=src, dst=dst)


def op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``; ``nccl:send 0->1`` -> ``send``; ``nccl:_allgather_base`` ->
    ``all_gather_into_tensor``."""
    return parse_profiling_name(profiling_name).op


def batch_op(closer_type: str, part_ops: list[str]) -> str:
    """The public op a batch stands for: its closing entry's type and its parts' ops.

    ``batch_isend_irecv`` for sends and receives, ``all_gather`` for an uneven all_gather,
    ``<op>_coalesced`` for a coalescing manager's run of one op, ``coalesced`` otherwise.
    """
    if closer_type in RECORDED_BATCH_OPS:
        return RECORDED_BATCH_OPS[closer_type]
    kinds = set(part_ops)
    if kinds and kinds <= RECORDED_P2P:
        return "batch_isend_irecv"
    if len(kinds) == 1:
        (only,) = kinds
        return only if only.endswith("_coalesced") else f"{only}_coalesced"
    return "coalesced"
