"""The gate: the coordinate condition that let some ranks of a group into a collective and kept others out.

Only coordinates that vary inside the group instances count: a pipeline-stage test around a DP×CP
collective splits nothing, since every member of a DP×CP group is on the same stage (docs/design.md,
"When is a rank-dependent gate harmless?").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    """Coordinates that take more than one value inside at least one of the instances."""
    varying: set[str] = set()
    for m in instances:
        if not m.members:
            continue
        first = coords_of(m.members[0])
        for r in m.members[1:]:
            coords = coords_of(r)
            varying.update(name for name in COORDINATES if coords[name] != first[name])
        if len(varying) == len(COORDINATES):
            break
    return tuple(name for name in COORDINATES if name in varying)


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
    gate = gate_of(instances, coords_of)
    if gate is None:
        return GateReading(None, None, ())
    alternatives: tuple[dict[str, int], ...] = ()
    if len(gate) > 1 and _each_alone(gate, instances, coords_of):
        first, *rest = gate.items()
        gate, alternatives = dict([first]), tuple({k: v} for k, v in rest)
    entered = sum(len(m.entered) for m in instances)
    absent = sum(len(m.absent) for m in instances)
    strength = GateStrength.STRONG if entered >= 2 and absent >= 2 and not alternatives else GateStrength.WEAK
    return GateReading(gate, strength, alternatives)


def _each_alone(gate: Mapping[str, int], instances: Sequence[SplitInstance], coords_of: CoordsOf) -> bool:
    absent = [r for m in instances for r in m.absent]
    return all(not _admits_any({k: v}, absent, coords_of) for k, v in gate.items())


def gate_of(instances: Sequence[SplitInstance], coords_of: CoordsOf) -> dict[str, int] | None:
    """Coordinate values shared by every entered rank and by no absent rank, over all split instances.

    Each coordinate that separates entered from absent on its own is part of the gate (``{"cp": 0}``).
    When none does, the conjunction of the shared values is used if it separates them (``tp == 0 and
    cp == 0`` around a TP×CP group), pruned of coordinates it does not need. None if nothing separates.
    """
    entered = [r for m in instances for r in m.entered]
    absent = [r for m in instances for r in m.absent]
    if not entered or not absent:
        return None
    shared: dict[str, int] = {}
    for name in varying_coordinates(instances, coords_of):
        values = {coords_of(r)[name] for r in entered}
        if len(values) == 1:
            shared[name] = values.pop()
    alone = {k: v for k, v in shared.items() if all(coords_of(a)[k] != v for a in absent)}
    if alone:
        return alone
    if not shared or _admits_any(shared, absent, coords_of):
        return None
    for name in list(shared):
        trial = {k: v for k, v in shared.items() if k != name}
        if trial and not _admits_any(trial, absent, coords_of):
            shared = trial
    return shared


def _admits_any(gate: Mapping[str, int], ranks: Sequence[int], coords_of: CoordsOf) -> bool:
    return any(all(coords_of(r)[k] == v for k, v in gate.items()) for r in ranks)


def gate_terms(gate: Mapping[str, int]) -> list[tuple[str, int]]:
    """A gate's (coordinate, value) pairs in coordinate order, so one gate always reads the same way."""
    order = {k: i for i, k in enumerate(COORDINATES)}
    return sorted(gate.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))


def describe_gate(gate: Mapping[str, int] | None) -> str:
    """``{"cp": 0, "tp": 0}`` -> ``tp == 0 and cp == 0``."""
    if not gate:
        return "no coordinate"
    return " and ".join(f"{k} == {v}" for k, v in gate_terms(gate))
