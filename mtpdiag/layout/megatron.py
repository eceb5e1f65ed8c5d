"""Megatron-core's rank layout, recomputed without megatron-core.

``ParallelLayout`` gives every rank's TP/CP/EP/DP/PP coordinates and every process-group instance of
each kind, exactly as megatron-core's ``RankGenerator`` in ``initialize_model_parallel`` builds them:
a rank is a mixed-radix number whose digits are the parallel ranks, in ``order`` (first = fastest).
The expert groups (ep, etp, edp, ...) come from a second generator with tp=etp, cp=1 and ep set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import NoReturn

import msgspec

from mtpdiag.model.report import Layout
from mtpdiag.vocabulary.groups import COORDINATES
from mtpdiag.vocabulary.labels import coords_label

DEFAULT_ORDER = "tp-cp-ep-dp-pp"

# group kind -> (generator, tokens). "dense" is megatron's decoder generator, "expert" its expert one.
GROUP_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)),
    "cp": ("dense", ("cp",)),
    "dp": ("dense", ("dp",)),
    "pp": ("dense", ("pp",)),
    "dp_cp": ("dense", ("dp", "cp")),
    "tp_cp": ("dense", ("tp", "cp")),
    "tp_dp": ("dense", ("tp", "dp")),
    "tp_dp_cp": ("dense", ("tp", "dp", "cp")),
    "mp": ("dense", ("tp", "pp")),
    "world": ("dense", ("tp", "cp", "dp", "pp")),
    "ep": ("expert", ("ep",)),
    "etp": ("expert", ("tp",)),
    "edp": ("expert", ("dp",)),
    "tp_ep": ("expert", ("tp", "ep")),
    "tp_ep_pp": ("expert", ("tp", "ep", "pp")),
}

# Group kinds a person thinks in, smallest first; used when a site's group must be inferred.
INFERENCE_ORDER = (
    "tp",
    "cp",
    "ep",
    "pp",
    "dp",
    "etp",
    "edp",
    "tp_cp",
    "dp_cp",
    "tp_dp",
    "tp_ep",
    "mp",
    "tp_dp_cp",
    "tp_ep_pp",
    "world",
)


class LayoutError(ValueError):
    """Parallel sizes that cannot describe the world (an input error)."""


class _Generator(msgspec.Struct, frozen=True):
    """One megatron RankGenerator: ordered (name, size) digits, fastest first."""

    digits: tuple[tuple[str, int], ...]

    @property
    def world_size(self) -> int:
        out = 1
        for _, size in self.digits:
            out *= size
        return out

    def strides(self) -> dict[str, tuple[int, int]]:
        """Each digit's (stride, size): its coordinate of a rank is ``rank // stride % size``."""
        out, stride = {}, 1
        for name, size in self.digits:
            out[name] = (stride, size)
            stride *= size
        return out

    def groups(self, tokens: Iterable[str]) -> list[tuple[int, ...]]:
        """Same result, same order, as RankGenerator.get_ranks('-'.join(tokens)); each instance ascending."""
        wanted = set(tokens)
        strides, stride = {}, 1
        for name, size in self.digits:
            strides[name] = stride
            stride *= size
        offsets = _numbers([(strides[n], s) for n, s in self.digits if n in wanted])
        bases = _numbers([(strides[n], s) for n, s in self.digits if n not in wanted])
        # Every instance is the first one shifted by a base. Built in C loops, not one Python step per rank
        # (a 16k-rank world's 8,192 CP pairs took 10 ms): many small instances as columns, few large ones
        # one by one.
        if len(offsets) < len(bases):
            return list(zip(*[list(map(o.__add__, bases)) for o in offsets], strict=True))
        return [tuple(map(b.__add__, offsets)) for b in bases]


def _numbers(dims: list[tuple[int, int]]) -> list[int]:
    """The value of every index over ``dims`` (stride, size), first fastest, in index order: ascending, since
    each stride is at least the span of the digits before it."""
    out = [0]
    for stride, size in dims:
        out = [o + step for step in range(0, stride * size, stride) for o in out]
    return out


def _ordered(order: str, sizes: dict[str, int]) -> tuple[tuple[str, int], ...]:
    tokens = order.lower().split("-")
    if len(set(tokens)) != len(tokens) or not set(tokens) <= set(sizes):
        raise LayoutError(f"invalid order {order!r}: use the tokens tp, cp, ep, dp, pp once each")
    for name, size in sizes.items():
        if name not in tokens:
            if size != 1:
                raise LayoutError(f"order {order!r} lacks {name}, whose size is {size}")
            tokens.append(name)
    return tuple((t, sizes[t]) for t in tokens)


class ParallelLayout(msgspec.Struct, frozen=True, dict=True):
    """Parallel sizes of a job. ``dp`` is derived from the world size (see ``for_world``). The ``__dict__``
    holds the cached properties (the generators, the digits and the group indexes), never a field."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    vpp: int | None = None
    etp: int | None = None
    order: str = DEFAULT_ORDER

    @staticmethod
    def for_world(
        world_size: int,
        tp: int = 1,
        cp: int = 1,
        pp: int = 1,
        ep: int = 1,
        vpp: int | None = None,
        etp: int | None = None,
        order: str = DEFAULT_ORDER,
    ) -> ParallelLayout:
        """Derive dp from the world size; sizes that do not divide it are a ``LayoutError``."""
        for name, value in (("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep), ("etp", etp or 1)):
            if not isinstance(value, int) or value < 1:
                raise LayoutError(f"{name} must be a positive integer, got {value!r}")
        if world_size < 1:
            raise LayoutError(f"world size must be positive, got {world_size}")
        model = tp * cp * pp
        if world_size % model:
            raise LayoutError(f"tp*cp*pp = {tp}*{cp}*{pp} = {model} does not divide the world size {world_size}")
        expert_model = (etp or tp) * ep * pp
        if world_size % expert_model:
            raise LayoutError(
                f"etp*ep*pp = {etp or tp}*{ep}*{pp} = {expert_model} does not divide the world size {world_size}"
            )
        if vpp is not None and pp < 2:
            raise LayoutError("vpp needs pp > 1 (interleaved schedule)")
        layout = ParallelLayout(tp=tp, cp=cp, ep=ep, dp=world_size // model, pp=pp, vpp=vpp, etp=etp, order=order)
        _ = layout._dense, layout._expert  # validate the order now
        # initialize_model_parallel refuses these too (same tests, same case-sensitive endswith).
        expert_dp = world_size // expert_model
        if not (order.endswith("pp") or pp == 1 or expert_dp == layout.dp):
            raise LayoutError(
                f"order {order!r} does not end in pp, which megatron allows only when the expert "
                f"data-parallel size equals dp (here {expert_dp} and {layout.dp})"
            )
        # With pp outermost both generators give the same pipeline groups; only other orders need the test.
        if not order.endswith("pp") and layout._dense.groups(("pp",)) != layout._expert.groups(("pp",)):
            raise LayoutError(
                f"order {order!r} gives the dense and the expert layers different pipeline "
                f"groups, which megatron refuses"
            )
        return layout

    @cached_property
    def world_size(self) -> int:
        """Cached: ``coords`` checks every rank against it (16k times for a 16k-rank report)."""
        return self.tp * self.cp * self.dp * self.pp

    @cached_property
    def _dense(self) -> _Generator:
        return _Generator(_ordered(self.order, {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}))

    @cached_property
    def _expert(self) -> _Generator:
        etp = self.etp or self.tp
        edp = self.world_size // (etp * self.ep * self.pp)
        return _Generator(_ordered(self.order, {"tp": etp, "cp": 1, "ep": self.ep, "dp": edp, "pp": self.pp}))

    def coords(self, rank: int) -> dict[str, int]:
        """tp, cp, ep, dp, pp coordinates of a global rank (ep from the expert generator)."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a world of {self.world_size}")
        return self.coords_each((rank,))[0]  # type: ignore[return-value]

    def coords_each(self, ranks: Iterable[int | None]) -> list[dict[str, int] | None]:
        """``coords`` of each rank, None for a rank outside the world (or None): a report's 16k ranks in one
        call, at half the cost of one call per rank."""
        world = self.world_size
        (tp, tp_n), (cp, cp_n), (ep, ep_n), (dp, dp_n), (pp, pp_n) = self._digits
        return [
            {
                "tp": rank // tp % tp_n,
                "cp": rank // cp % cp_n,
                "ep": rank // ep % ep_n,
                "dp": rank // dp % dp_n,
                "pp": rank // pp % pp_n,
            }
            if rank is not None and 0 <= rank < world
            else None
            for rank in ranks
        ]

    @cached_property
    def _digits(self) -> tuple[tuple[int, int], ...]:
        """(stride, size) of tp, cp, ep, dp and pp (``COORDINATES``) in a rank's mixed-radix number (ep from the expert
        generator): the report asks the coordinates of each of 16k ranks."""
        dense, expert = self._dense.strides(), self._expert.strides()
        return (dense["tp"], dense["cp"], expert["ep"] if self.ep > 1 else (1, 1), dense["dp"], dense["pp"])

    def pp_neighbour(self, rank: int, step: int) -> int:
        """The rank ``step`` stages on in ``rank``'s pipeline group (wrapping): ``group_of("pp", rank)``'s
        members are in stage order, one pp stride apart, so this is arithmetic, not a group lookup."""
        stride, size = self._digits[4]
        stage = rank // stride % size
        return rank + ((stage + step) % size - stage) * stride

    def coordinates_alike(self, kind: str) -> bool:
        """Whether the members of every instance of ``kind`` differ from each other in the same coordinates
        (so a question about which coordinates vary inside instances is answered by any one of them).

        A dense kind's instance is its first one shifted by a base whose digits are zero where the kind's
        are, so the dense coordinates (tp, cp, dp, pp) of base + offset are the base's plus the offset's, with
        no carry. The ep coordinate comes from the expert generator, and is constant only when ep == 1."""
        return self.ep == 1 and GROUP_KINDS[kind][0] == "dense"

    def varying_in(self, kind: str) -> tuple[str, ...] | None:
        """The coordinates that vary inside each instance of ``kind`` when every instance varies in the same
        ones (``coordinates_alike``), else None: a dense instance's dense coordinates are its digits, and the
        kind's digits take every value of theirs there, so those of size > 1 vary and no other does."""
        if not self.coordinates_alike(kind):
            return None
        sizes = dict(self._dense.digits)
        return tuple(name for name in COORDINATES if name in GROUP_KINDS[kind][1] and sizes[name] > 1)

    def coordinate(self, name: str, ranks: Iterable[int]) -> list[int]:
        """``coords(rank)[name]`` of each rank of the world, in C loops: a gate reads it of thousands."""
        stride, size = self._digits[COORDINATES.index(name)]
        return list(map(size.__rmod__, map(stride.__rfloordiv__, ranks)))

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Every instance of a group kind, in megatron's order."""
        return list(self._kind_groups(kind))

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The instance of ``kind`` that holds ``rank``."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a world of {self.world_size}")
        return self.group_index(kind)[rank]

    def group_index(self, kind: str) -> Sequence[tuple[int, ...]]:
        """Every rank's instance of ``kind``, indexed by rank (one shared tuple per instance), built on first
        use. A list, not a dict: half the cost to build at 16k ranks, and faster to look up."""
        index = self._index_cache.get(kind)
        if index is None:
            index = self._index_cache[kind] = [()] * self.world_size
            for group in self._kind_groups(kind):
                for rank in group:
                    index[rank] = group
        return index

    def _kind_groups(self, kind: str) -> tuple[tuple[int, ...], ...]:
        """Built per kind on first use: at 16k ranks, all kinds at once cost half a second."""
        if kind not in GROUP_KINDS:
            _unknown_kind(kind)
        groups = self._groups_cache.get(kind)
        if groups is None:
            gen, tokens = GROUP_KINDS[kind]
            groups = tuple((self._dense if gen == "dense" else self._expert).groups(tokens))
            self._groups_cache[kind] = groups
        return groups

    @cached_property
    def _groups_cache(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        return {}

    @cached_property
    def _index_cache(self) -> dict[str, list[tuple[int, ...]]]:
        return {}

    def record(self) -> Layout:
        """The layout as the report and ``verify --json`` state it (``model.Layout``)."""
        return Layout(
            tp=self.tp, cp=self.cp, ep=self.ep, dp=self.dp, pp=self.pp, order=self.order, vpp=self.vpp, etp=self.etp
        )

    def describe(self, rank: int) -> str:
        """``tp0 cp1 pp1`` style label; sizes of 1 are left out, except tp, cp and pp."""
        return coords_label(self.coords(rank), {"ep": self.ep, "dp": self.dp})


def _unknown_kind(kind: str) -> NoReturn:
    raise LayoutError(f"unknown group kind {kind!r}; known: {', '.join(GROUP_KINDS)}")
