"""The Flight Recorder matcher's words (``analysis.flight_recorder``): how a group's members first disagree,
what a pending send or receive lacks, whether a rank absent from a call skipped it or is behind, and by which
rule, and the role the matcher gives a split call. Each member is its JSON string in the report's
``flight_recorder`` section."""

from __future__ import annotations

from mtpdiag.vocabulary.states import StrEnum


class DivergenceKind(StrEnum):
    """How a group's members disagree at its first divergent sequence number (``Divergence.problems``)."""

    MISSING_RANKS = "missing_ranks"  # some members never reached the number while others entered it
    OP_TYPE = "op_type"  # members issued different ops there
    SIZES = "sizes"  # the same op with different element counts
    DTYPES = "dtypes"  # the same op with different dtypes


class P2PKind(StrEnum):
    """What a pending send or receive lacks (``P2PMismatch.kind``)."""

    UNMATCHED = "unmatched"  # the peer has no matching pending op
    SIZES = "sizes"  # the peer's matching op has another size


class MatchRole(StrEnum):
    """A split call's role by the recorder's program order (``FRCallSplit.role``): ``root`` when some absent
    rank skipped it, ``consequence`` when every absent rank with a dump was shifted or is behind, ``unknown``
    when the record cannot say (the wait-for graph decides then)."""

    ROOT = "root"
    CONSEQUENCE = "consequence"
    UNKNOWN = "unknown"


class AbsentVerdict(StrEnum):
    """Why a rank did not issue a call its group's other members issued (``AbsentWhy.verdict``)."""

    SKIPPED = "skipped"  # it went on without the call: a root
    SHIFTED = "shifted"  # it issued the call later, after an extra op: a consequence
    BEHIND = "behind"  # it has not got there yet: a consequence
    UNKNOWN = "unknown"


class OrderRule(StrEnum):
    """The rule that decided an ``AbsentVerdict`` (``analysis.flight_recorder.order``), strongest first."""

    SAME_GROUP = "same-group"
    RECORD_ORDER = "record-order"
    STACK_ORDER = "stack-order"
    NONE = "none"


class MembersFrom(StrEnum):
    """Where a recorded group's membership came from."""

    PG_CONFIG = "pg_config"  # torch's own record of the group
    GIVEN = "given"  # the caller's (the layout's)
    ENTRIES = "entries"  # only the ranks seen using the group
