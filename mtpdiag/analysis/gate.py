"""The gate: the coordinate condition that let some ranks of a group into a collective and kept others out.

Only coordinates that vary inside the group instances count: a pipeline-stage test around a DP×CP
collective splits nothing, since every member of a DP×CP group is on the same stage (docs/design.md,
"When is a rank-dependent gate harmless?").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def varying_coordinates(instances: Sequence[SplitInstance], coords_of: CoordsOf) -> tuple[str, ...]:
    """Coordinates that take more than one value inside at least one of the instances.

    Each member is compared with its instance's first member, one coordinate at a time over all the
    instances at once (8,192 split pairs of a 16k-rank job are one list comparison per coordinate)."""
    members = [r for m in instances for r in m.members]
    firsts = [m.members[0] for m in instances for _ in m.members]
    mine, theirs = list(map(coords_of, members)), list(map(coords_of, firsts))
    return tuple(name for name in COORDINATES
                 if list(map(itemgetter(name), mine)) != list(map(itemgetter(name), theirs)))


class GateReading(NamedTuple):
    """A gate and how much it can be trusted (see ``read_gate``)."""

    gate: dict[str, int] | None
    strength: GateStrength | None  # None: no gate
    alternatives: tuple[dict[str, int], ...]


def read_gate(instances: Sequence[SplitInstance], coords_of: CoordsOf,
              varying: tuple[str, ...] | None = None) -> GateReading:
    """The gate, as a hypothesis: ``strong`` when at least two ranks on each side split cleanly along it and
    nothing else separates them; ``weak`` when a side is one rank, or other coordinates separate the sides
    just as well (``alternatives``). Then data-dependent divergence (a loop that ran once more on some ranks,
    a branch on rank-local data) fits as well as a rank test. ``varying``: ``varying_coordinates`` of the
    instances, when the caller knows it."""
    sides = _Sides(instances, coords_of)
    gate = _gate(instances, coords_of, sides, varying)
    if gate is None:
        return GateReading(None, None, ())
    alternatives: tuple[dict[str, int], ...] = ()
    if len(gate) > 1 and all(not sides.admits_any({k: v}) for k, v in gate.items()):
        first, *rest = gate.items()
        gate, alternatives = dict([first]), tuple({k: v} for k, v in rest)
    strength = GateStrength.STRONG if len(sides.entered) >= 2 and len(sides.absent) >= 2 and not alternatives \
        else GateStrength.WEAK
    return GateReading(gate, strength, alternatives)


class _Sides:
    """The coordinates of the entered and of the absent ranks of some instances, looked up once."""

    def __init__(self, instances: Sequence[SplitInstance], coords_of: CoordsOf) -> None:
        self.entered = list(map(coords_of, [r for m in instances for r in m.entered]))
        self.absent = list(map(coords_of, [r for m in instances for r in m.absent]))

    def admits_any(self, gate: Mapping[str, int]) -> bool:
        """Whether some absent rank passes ``gate``."""
        if len(gate) == 1:
            (name, value), = gate.items()
            return value in set(map(itemgetter(name), self.absent))
        return any(all(c[k] == v for k, v in gate.items()) for c in self.absent)


def gate_of(instances: Sequence[SplitInstance], coords_of: CoordsOf) -> dict[str, int] | None:
    """Coordinate values shared by every entered rank and by no absent rank, over all split instances.

    Each coordinate that separates entered from absent on its own is part of the gate (``{"cp": 0}``).
    When none does, the conjunction of the shared values is used if it separates them (``tp == 0 and
    cp == 0`` around a TP×CP group), pruned of coordinates it does not need. None if nothing separates.
    """
    return _gate(instances, coords_of, _Sides(instances, coords_of))


def _gate(instances: Sequence[SplitInstance], coords_of: CoordsOf, sides: _Sides,
          varying: tuple[str, ...] | None = None) -> dict[str, int] | None:
    if not sides.entered or not sides.absent:
        return None
    shared: dict[str, int] = {}
    for name in varying if varying is not None else varying_coordinates(instances, coords_of):
        values = set(map(itemgetter(name), sides.entered))
        if len(values) == 1:
            shared[name] = values.pop()
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
