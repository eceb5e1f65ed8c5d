"""The gate: the coordinate condition that let some ranks of a group into a collective and kept others out.

Only coordinates that vary inside the group instances count: a pipeline-stage test around a DP×CP
collective splits nothing, since every member of a DP×CP group is on the same stage (docs/design.md,
"When is a rank-dependent gate harmless?").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import NamedTuple, Protocol

from mtpdiag.vocabulary.groups import COORDINATES
from mtpdiag.vocabulary.states import GateStrength

CoordsOf = Callable[[int], Mapping[str, int]]


class SplitInstance(Protocol):
    """A partly entered group instance: a ``Mismatch``, or the analysis's lighter form of one."""

    @property
    def members(self) -> Sequence[int]: ...
    @property
    def entered(self) -> Sequence[int]: ...
    @property
    def absent(self) -> Sequence[int]: ...


Values = Callable[[str, Sequence[int]], Sequence[int]]  # coordinate ``name`` of each of ``ranks``


def values_of(coords_of: CoordsOf) -> Values:
    """``Values`` read rank by rank from ``coords_of``."""

    def values(name: str, ranks: Sequence[int]) -> list[int]:
        return list(map(itemgetter(name), map(coords_of, ranks)))

    return values


def varying_coordinates(members: Sequence[Sequence[int]], values: Values) -> tuple[str, ...]:
    """Coordinates that take more than one value inside at least one of the instances (``members``: each
    instance's ranks).

    Each member is compared with its instance's first member, one coordinate at a time over all the
    instances at once (8,192 split pairs of a 16k-rank job are one list comparison per coordinate)."""
    ranks = list(chain.from_iterable(members))
    firsts, sizes = [m[0] for m in members], list(map(len, members))
    return tuple(
        name
        for name in COORDINATES
        if list(values(name, ranks)) != list(chain.from_iterable(map(repeat, values(name, firsts), sizes)))
    )


class GateReading(NamedTuple):
    """A gate and how much it can be trusted (see ``read_gate``)."""

    gate: dict[str, int] | None
    strength: GateStrength | None  # None: no gate
    alternatives: tuple[dict[str, int], ...]


def read_gate(instances: Sequence[SplitInstance], coords_of: CoordsOf) -> GateReading:
    """The gate, as a hypothesis: ``strong`` when at least two ranks on each side split cleanly along it and
    nothing else separates them; ``weak`` when a side is one rank, or other coordinates separate the sides
    just as well (``alternatives``). Then data-dependent divergence (a loop that ran once more on some ranks,
    a branch on rank-local data) fits as well as a rank test."""
    return read_split_gate(
        [m.members for m in instances],
        [m.entered for m in instances],
        [m.absent for m in instances],
        values_of(coords_of),
    )


def read_split_gate(
    members: Sequence[Sequence[int]],
    entered: Sequence[Sequence[int]],
    absent: Sequence[Sequence[int]],
    values: Values,
    varying: tuple[str, ...] | None = None,
) -> GateReading:
    """``read_gate`` of instances given as their members, entered and absent ranks (in the same order), with
    coordinates read in bulk (``ParallelLayout.coordinate``: no Python step per rank at 16k ranks).
    ``varying``: the coordinates that vary inside the instances, when the caller knows them
    (``ParallelLayout.varying_in``)."""
    sides = _sides(members, entered, absent, values, varying)
    gate = _gate(sides)
    if gate is None:
        return GateReading(None, None, ())
    alternatives: tuple[dict[str, int], ...] = ()
    if len(gate) > 1 and all(not sides.admits_any({k: v}) for k, v in gate.items()):
        first, *rest = gate.items()
        gate, alternatives = dict([first]), tuple({k: v} for k, v in rest)
    strength = (
        GateStrength.STRONG
        if sides.entered_count >= 2 and sides.absent_count >= 2 and not alternatives
        else GateStrength.WEAK
    )
    return GateReading(gate, strength, alternatives)


class _Sides:
    """The coordinates ``names`` of the entered and of the absent ranks of some instances, a column of values
    per coordinate (read in bulk; each question below is then a few C loops over them)."""

    def __init__(self, names: Sequence[str], entered: Sequence[int], absent: Sequence[int], values: Values) -> None:
        self.entered_count, self.absent_count = len(entered), len(absent)
        self.entered = {name: values(name, entered) for name in names}
        self.absent = {name: values(name, absent) for name in names}

    def admits_any(self, gate: Mapping[str, int]) -> bool:
        """Whether some absent rank passes ``gate`` (whose coordinates are among ``names``)."""
        return tuple(gate.values()) in set(zip(*[self.absent[k] for k in gate], strict=True))

    def shared(self) -> dict[str, int]:
        """The coordinates that hold one value on every entered rank, with it."""
        out: dict[str, int] = {}
        for name, column in self.entered.items():
            values = set(column)
            if len(values) == 1:
                out[name] = values.pop()
        return out


def gate_of(instances: Sequence[SplitInstance], coords_of: CoordsOf) -> dict[str, int] | None:
    """Coordinate values shared by every entered rank and by no absent rank, over all split instances.

    Each coordinate that separates entered from absent on its own is part of the gate (``{"cp": 0}``).
    When none does, the conjunction of the shared values is used if it separates them (``tp == 0 and
    cp == 0`` around a TP×CP group), pruned of coordinates it does not need. None if nothing separates.
    """
    return _gate(
        _sides(
            [m.members for m in instances],
            [m.entered for m in instances],
            [m.absent for m in instances],
            values_of(coords_of),
        )
    )


def _sides(
    members: Sequence[Sequence[int]],
    entered: Sequence[Sequence[int]],
    absent: Sequence[Sequence[int]],
    values: Values,
    varying: tuple[str, ...] | None = None,
) -> _Sides:
    """The sides of instances over the coordinates that vary inside them (``varying``, when known)."""
    names = varying if varying is not None else varying_coordinates(members, values)
    return _Sides(names, list(chain.from_iterable(entered)), list(chain.from_iterable(absent)), values)


def _gate(sides: _Sides) -> dict[str, int] | None:
    if not sides.entered_count or not sides.absent_count:
        return None
    shared = sides.shared()
    alone = {k: v for k, v in shared.items() if not sides.admits_any({k: v})}
    if alone:
        return alone
    if not shared or sides.admits_any(shared):
        return None
    for name in list(shared):
        trial = {k: v for k, v in shared.items() if k != name}
        if trial and not sides.admits_any(trial):
            shared = trial
    return shared


def gate_terms(gate: Mapping[str, int]) -> list[tuple[str, int]]:
    """A gate's (coordinate, value) pairs in coordinate order, so one gate always reads the same way."""
    order = {k: i for i, k in enumerate(COORDINATES)}
    return sorted(gate.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))


def describe_gate(gate: Mapping[str, int] | None) -> str:
    """``{"cp": 0, "tp": 0}`` -> ``tp == 0 and cp == 0``."""
    if not gate:
        return "no coordinate"
    return " and ".join(f"{k} == {v}" for k, v in gate_terms(gate))
