"""What matching the recorder across ranks finds, per group: where members first disagree, who issued what
there and who did not (and why), unmatched sends and receives. Typed, frozen, JSON-able."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mtpdiag.analysis.flight_recorder.calls import Call
from mtpdiag.analysis.flight_recorder.order import AbsentWhy
from mtpdiag.model import Site
from mtpdiag.vocabulary.ops import UNEVEN_INPUT_OPS, UNEVEN_OUTPUT_OPS


@dataclass(frozen=True)
class RankAt:
    """One member of a group at the divergent sequence number.

    ``call``: what it issued there (None: nothing). ``state``: the call's state, ``timed out``,
    ``not reached`` (its last entered number is lower), ``not recorded`` (dropped from its ring buffer)
    or ``no dump``. ``doing``: its latest pending op anywhere (else its latest op), as text.
    """

    rank: int
    call: Call | None
    state: str
    last_entered: int
    last_completed: int
    doing: str

    def to_dict(self) -> dict[str, object]:
        c = self.call
        return {
            "rank": self.rank,
            "state": self.state,
            "last_entered": self.last_entered,
            "last_completed": self.last_completed,
            "doing": self.doing,
            "op": c.op if c else None,
            "profiling_name": c.profiling_name if c else None,
            "site": c.site.to_dict() if c and c.site else None,
            "input_numel": c.input_numel if c else None,
            "output_numel": c.output_numel if c else None,
            "input_sizes": [list(s) for s in c.input_sizes] if c else None,
            "output_sizes": [list(s) for s in c.output_sizes] if c else None,
            "input_dtypes": sorted(c.input_dtypes) if c else None,
            "output_dtypes": sorted(c.output_dtypes) if c else None,
            "record_id": c.record_id if c else None,
        }


@dataclass(frozen=True)
class FRCallSplit:
    """One distinct (op, call site) at a divergence: who issued it and who did not.

    ``absent`` are all other members; ``absent_doing`` says what each did instead ("all_gather_into_tensor
    #2 at DistributedOptimizer.step", "reached only #1 here; at ..."); ``why`` says whether each skipped
    this call or will reach it (``order``). ``role``: root when some absent rank skipped it, consequence
    when every absent rank with a dump was shifted or is behind, else unknown.
    """

    op: str
    profiling_name: str
    site: Site | None
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    absent_doing: Mapping[int, str]
    why: Mapping[int, AbsentWhy]
    role: str

    def to_dict(self) -> dict[str, object]:
        return {
            "op": self.op,
            "profiling_name": self.profiling_name,
            "site": self.site.to_dict() if self.site else None,
            "entered": list(self.entered),
            "absent": list(self.absent),
            "role": self.role,
            "absent_doing": {str(r): t for r, t in sorted(self.absent_doing.items())},
            "why": {str(r): w.to_dict() for r, w in sorted(self.why.items())},
        }


@dataclass(frozen=True)
class Divergence:
    """The first sequence number at which a group's members disagree.

    ``reference`` is the rank the ``culprits`` are judged against: torch's analyzer (torchfrtrace) takes
    the first rank in its file order as the reference and names as culprits the members that never
    reached the number, or else those whose op, sizes or dtypes differ from the reference's. Here the
    reference is a rank of the largest agreeing set (lowest rank on a tie); ``culprits_against`` gives
    the culprits for any other reference.
    """

    group: str
    desc: str
    kind: str | None
    members: tuple[int, ...]
    members_from: str
    seq: int
    problems: tuple[str, ...]
    calls: tuple[FRCallSplit, ...]
    ranks: tuple[RankAt, ...]
    missing: tuple[int, ...]
    no_dump: tuple[int, ...]
    reference: int
    culprits: tuple[int, ...]

    def rank(self, rank: int) -> RankAt | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def culprits_against(self, reference: int) -> tuple[int, ...]:
        return culprits(self.ranks, self.missing, reference)

    def to_dict(self) -> dict[str, object]:
        return {
            "group": self.group,
            "desc": self.desc,
            "kind": self.kind,
            "members": list(self.members),
            "members_from": self.members_from,
            "seq": self.seq,
            "problems": list(self.problems),
            "calls": [c.to_dict() for c in self.calls],
            "ranks": [r.to_dict() for r in self.ranks],
            "missing": list(self.missing),
            "no_dump": list(self.no_dump),
            "reference": self.reference,
            "culprits": list(self.culprits),
        }


@dataclass(frozen=True)
class P2PMismatch:
    """A pending send or recv whose peer has no matching pending op (``kind`` unmatched) or one of another
    size (``kind`` sizes). Ranks are global; ``peer_doing`` is what the peer is doing instead."""

    group: str
    desc: str
    kind: str
    op: str  # send | recv
    rank: int
    peer: int | None
    numel: int
    peer_numel: int | None
    site: Site | None
    peer_doing: str

    def to_dict(self) -> dict[str, object]:
        return {
            "group": self.group,
            "desc": self.desc,
            "kind": self.kind,
            "op": self.op,
            "rank": self.rank,
            "peer": self.peer,
            "numel": self.numel,
            "peer_numel": self.peer_numel,
            "site": self.site.to_dict() if self.site else None,
            "peer_doing": self.peer_doing,
        }


@dataclass(frozen=True)
class GroupMatch:
    """One process group, matched across its members. ``members_from``: pg_config (torch's record),
    given (the caller's, e.g. the layout's) or entries (only the ranks seen using it).
    ``stuck``: the lowest number some dumped member entered but has not completed, when there is no
    divergence before it: every member that reached it waits there (an "all waiting" group)."""

    name: str
    desc: str
    kind: str | None
    members: tuple[int, ...]
    members_from: str
    last_entered: Mapping[int, int]
    last_completed: Mapping[int, int]
    no_dump: tuple[int, ...]
    divergence: Divergence | None
    stuck: int | None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "desc": self.desc,
            "kind": self.kind,
            "members": list(self.members),
            "members_from": self.members_from,
            "last_entered": {str(r): n for r, n in sorted(self.last_entered.items())},
            "last_completed": {str(r): n for r, n in sorted(self.last_completed.items())},
            "no_dump": list(self.no_dump),
            "stuck": self.stuck,
            "divergence": self.divergence.to_dict() if self.divergence else None,
        }


@dataclass(frozen=True)
class FRAnalysis:
    """Every group's match and every unmatched send/recv. ``notes``: what limits the analysis."""

    groups: tuple[GroupMatch, ...]
    p2p: tuple[P2PMismatch, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        return tuple(g.divergence for g in self.groups if g.divergence is not None)

    def group(self, name: str) -> GroupMatch | None:
        return next((g for g in self.groups if g.name == name), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "groups": [g.to_dict() for g in self.groups],
            "p2p": [m.to_dict() for m in self.p2p],
            "notes": list(self.notes),
        }


def size_key(c: Call) -> tuple[int | None, int | None]:
    return (None if c.op in UNEVEN_INPUT_OPS else c.input_numel, None if c.op in UNEVEN_OUTPUT_OPS else c.output_numel)


Signature = tuple[str, tuple[int | None, int | None], frozenset[str], frozenset[str]]  # op, sizes, dtypes


def signature(c: Call) -> Signature:
    return (c.op, size_key(c), c.input_dtypes, c.output_dtypes)


def culprits(ranks: tuple[RankAt, ...], missing: tuple[int, ...], reference: int) -> tuple[int, ...]:
    if missing:
        return missing
    ref = next((r.call for r in ranks if r.rank == reference), None)
    if ref is None:
        return ()
    return tuple(r.rank for r in ranks if r.call is not None and signature(r.call) != signature(ref))
