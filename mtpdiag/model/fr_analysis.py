"""What matching the Flight Recorder across ranks finds (``analysis.flight_recorder``), as the records the
report's ``flight_recorder`` section carries: their fields are its JSON.

* ``GroupMatch``, ``Divergence``, ``FRCallSplit``, ``RankAt``, ``AbsentWhy``: per group, where its members
  first disagree, who issued what there and who did not, and whether each absent rank skipped the call or
  is behind it; ``P2PMismatch``: a pending send or receive without its match; ``FRAnalysis``: all of them;
* ``FRGroupProgress`` (with its ``FRPendingOp``s) and ``FRSplitCheck``: the recorder's view next to the stacks
  (``analysis.flight_recorder.correlate``).
"""

from __future__ import annotations

from collections.abc import Iterable

from mtpdiag.model.fields import Record
from mtpdiag.model.frames import Site
from mtpdiag.vocabulary.groups import GroupKind
from mtpdiag.vocabulary.matching import AbsentVerdict, DivergenceKind, MatchRole, MembersFrom, OrderRule, P2PKind
from mtpdiag.vocabulary.ops import UNEVEN_INPUT_OPS, UNEVEN_OUTPUT_OPS
from mtpdiag.vocabulary.states import Role

Sizes = tuple[tuple[int, ...], ...]
Signature = tuple[str, tuple[int | None, int | None], frozenset[str], frozenset[str]]  # op, sizes, dtypes


def size_key(op: str, input_numel: int, output_numel: int) -> tuple[int | None, int | None]:
    """The element counts every member of a collective must agree on (none for the ops whose per-rank sizes
    legitimately differ)."""
    return (None if op in UNEVEN_INPUT_OPS else input_numel, None if op in UNEVEN_OUTPUT_OPS else output_numel)


def signature(
    op: str, input_numel: int, output_numel: int, input_dtypes: Iterable[str], output_dtypes: Iterable[str]
) -> Signature:
    """What two members' calls at one sequence number must share: the op, the sizes and the dtypes."""
    return (op, size_key(op, input_numel, output_numel), frozenset(input_dtypes), frozenset(output_dtypes))


class AbsentWhy(Record, frozen=True, omit_defaults=False):
    """Why rank ``rank`` is absent from a call: ``verdict`` (skipped | shifted | behind | unknown), the
    ``rule`` that decided it (same-group | record-order | stack-order | none) and a sentence."""

    rank: int
    verdict: AbsentVerdict
    rule: OrderRule
    reason: str


class RankAt(Record, frozen=True, kw_only=True, omit_defaults=False):
    """One member of a group at the divergent sequence number, and the call it issued there (the call's
    fields are null when it issued nothing).

    ``state``: the call's state, ``timed out``, ``not reached`` (its last entered number is lower),
    ``not recorded`` (dropped from its ring buffer) or ``no dump``. ``doing``: its latest pending op anywhere
    (else its latest op), as text. ``input_dtypes``/``output_dtypes`` are sorted.
    """

    rank: int
    state: str
    last_entered: int
    last_completed: int
    doing: str
    op: str | None = None
    profiling_name: str | None = None
    site: Site | None = None
    input_numel: int | None = None
    output_numel: int | None = None
    input_sizes: Sizes | None = None
    output_sizes: Sizes | None = None
    input_dtypes: tuple[str, ...] | None = None
    output_dtypes: tuple[str, ...] | None = None
    record_id: int | None = None

    def signature(self) -> Signature | None:
        """The call's ``signature``; None when the rank issued nothing at the number."""
        if self.op is None:
            return None
        return signature(
            self.op, self.input_numel or 0, self.output_numel or 0, self.input_dtypes or (), self.output_dtypes or ()
        )


class FRCallSplit(Record, frozen=True, kw_only=True, omit_defaults=False):
    """One distinct (op, call site) at a divergence: who issued it and who did not.

    ``absent`` are all other members; ``absent_doing`` says what each did instead ("all_gather_into_tensor
    #2 at DistributedOptimizer.step", "reached only #1 here; at ..."); ``why`` says whether each skipped
    this call or will reach it (``analysis.flight_recorder.order``), by rank. ``role``: root when some absent
    rank skipped it, consequence when every absent rank with a dump was shifted or is behind, else unknown.
    """

    op: str
    profiling_name: str
    site: Site | None
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    role: MatchRole
    absent_doing: dict[int, str]
    why: dict[int, AbsentWhy]


def culprits(ranks: tuple[RankAt, ...], missing: tuple[int, ...], reference: int) -> tuple[int, ...]:
    """The members that never reached the number, else those whose call differs from ``reference``'s."""
    if missing:
        return missing
    ref = next((r.signature() for r in ranks if r.rank == reference), None)
    if ref is None:
        return ()
    return tuple(r.rank for r in ranks if r.op is not None and r.signature() != ref)


class Divergence(Record, frozen=True, kw_only=True, omit_defaults=False):
    """The first sequence number at which a group's members disagree.

    ``reference`` is the rank the ``culprits`` are judged against: torch's analyzer (torchfrtrace) takes
    the first rank in its file order as the reference and names as culprits the members that never
    reached the number, or else those whose op, sizes or dtypes differ from the reference's. Here the
    reference is a rank of the largest agreeing set (lowest rank on a tie); ``culprits_against`` gives
    the culprits for any other reference.
    """

    group: str
    desc: str
    kind: GroupKind | None
    members: tuple[int, ...]
    members_from: MembersFrom
    seq: int
    problems: tuple[DivergenceKind, ...]
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


class P2PMismatch(Record, frozen=True, kw_only=True, omit_defaults=False):
    """A pending send or recv whose peer has no matching pending op (``kind`` unmatched) or one of another
    size (``kind`` sizes). Ranks are global; ``peer_doing`` is what the peer is doing instead."""

    group: str
    desc: str
    kind: P2PKind
    op: str  # send | recv
    rank: int
    peer: int | None
    numel: int
    peer_numel: int | None
    site: Site | None
    peer_doing: str


class GroupMatch(Record, frozen=True, kw_only=True, omit_defaults=False):
    """One process group, matched across its members. ``members_from``: pg_config (torch's record),
    given (the caller's, e.g. the layout's) or entries (only the ranks seen using it).
    ``stuck``: the lowest number some dumped member entered but has not completed, when there is no
    divergence before it: every member that reached it waits there (an "all waiting" group)."""

    name: str
    desc: str
    kind: GroupKind | None
    members: tuple[int, ...]
    members_from: MembersFrom
    last_entered: dict[int, int]  # by rank
    last_completed: dict[int, int]
    no_dump: tuple[int, ...]
    stuck: int | None
    divergence: Divergence | None


class FRAnalysis(Record, frozen=True, omit_defaults=False):
    """Every group's match and every unmatched send/recv. ``notes``: what limits the analysis."""

    groups: tuple[GroupMatch, ...]
    p2p: tuple[P2PMismatch, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        return tuple(g.divergence for g in self.groups if g.divergence is not None)

    def group(self, name: str) -> GroupMatch | None:
        return next((g for g in self.groups if g.name == name), None)


class FRPendingOp(Record, frozen=True, kw_only=True, omit_defaults=False):
    """An op a rank has pending in a group, as the recorder holds it."""

    op: str
    collective_seq_id: int
    p2p_seq_id: int
    state: str
    input_sizes: Sizes
    output_sizes: Sizes
    site: Site | None


class FRGroupProgress(Record, frozen=True, kw_only=True, omit_defaults=False):
    """How far each member got in one group's collective sequence, by the recorder's account (0: none seen);
    ``behind``: members whose last entered number is lower than another member's; ``pending``: each member's
    ops that have not completed, by rank."""

    name: str
    desc: str
    kind: GroupKind | None
    members: tuple[int, ...]
    members_from: MembersFrom
    last_entered: dict[int, int]
    last_completed: dict[int, int]
    pending: dict[int, tuple[FRPendingOp, ...]]
    behind: tuple[int, ...]
    no_dump: tuple[int, ...]


class FRSplitCheck(Record, frozen=True, kw_only=True):
    """A split of the diagnosis held against the recorder: the recorder's group for it (``fr_group``, null
    when it has no pending op of the split's for the entered ranks), who that group says entered the
    split's sequence number and who did not, and whether that ``agrees`` with the stacks."""

    op: str
    group: str
    role: Role
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    fr_group: str | None
    fr_desc: str | None = None
    fr_members: tuple[int, ...] | None = None
    fr_members_from: MembersFrom | None = None
    seq: int | None = None
    fr_entered: tuple[int, ...] | None = None
    fr_absent: tuple[int, ...] | None = None
    agrees: bool | None = None
