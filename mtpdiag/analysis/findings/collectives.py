"""Findings of split collectives (``mtp-cp-gated-reduce``, ``gated-collective``) and of collectives every member
entered differently (``size-mismatch``, ``dtype-mismatch``). Only root splits get a finding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from mtpdiag.analysis.findings.facts import Facts
from mtpdiag.analysis.findings.words import (
    TRACKER_WORDS,
    Words,
    doing_phrase,
    gate_source_phrase,
    grouped,
    groups_phrase,
    order_phrase,
    union,
)
from mtpdiag.analysis.gate import describe_gate
from mtpdiag.analysis.known_sites import is_mtp_site, signature_of, skip_of
from mtpdiag.analysis.program_order import RootOrder
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import (
    DtypeMismatch,
    Finding,
    GatedCollective,
    Mismatch,
    MtpCpGatedReduce,
    Site,
    SizeDetails,
    SizeMismatch,
    SplitDetails,
    replace,
)
from mtpdiag.vocabulary.groups import GroupKind
from mtpdiag.vocabulary.matching import DivergenceKind
from mtpdiag.vocabulary.states import GateStrength, Source

if TYPE_CHECKING:  # the Flight Recorder's analysis is imported only when there are dumps
    from mtpdiag.analysis.flight_recorder.evidence import SizeProblem


def mtp_findings(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """The verl #5895 signature: the MTP loss reduce on DP×CP, entered only where cp == 0."""
    return [_finding(*split, facts.layout, _order(facts, *split)) for split in _root_splits(facts) if _is_mtp(*split)]


def gated_findings(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """Every other root split collective (a known metric tracker's, or any gated call)."""
    return [
        _finding(*split, facts.layout, _order(facts, *split)) for split in _root_splits(facts) if not _is_mtp(*split)
    ]


def _order(facts: Facts, op: str, site: Site | None, kind: str, _instances: Sequence[Mismatch]) -> RootOrder | None:
    """Why program order makes this root the root of its cycle, when it does."""
    return facts.causes.orders.get(("m", op, site, kind)) if facts.causes is not None else None


def _root_splits(facts: Facts) -> Iterator[tuple[str, Site | None, str, list[Mismatch]]]:
    """(op, site, group kind, its split instances) of each root, in the order the roots come."""
    for (op, site, kind), instances in grouped(facts.roots, lambda m: (m.op, m.site, m.group)).items():
        yield op, site, kind, instances


def _is_mtp(_op: str, site: Site | None, kind: str, instances: Sequence[Mismatch]) -> bool:
    gate = instances[0].gate
    return is_mtp_site(site) and kind == GroupKind.DP_CP and gate is not None and gate.get("cp") == 0


def _finding(
    op: str,
    site: Site | None,
    kind: str,
    instances: list[Mismatch],
    layout: ParallelLayout | None,
    order: RootOrder | None = None,
) -> Finding:
    """One finding per root (op, site, group): the verl #5895 signature or a gated collective."""
    words = Words(layout)
    members = union(m.members for m in instances)
    entered = union(m.entered for m in instances)
    absent = union(m.absent for m in instances)
    gate = instances[0].gate
    doing_of = {r: d for m in instances for r, d in m.absent_doing.items()}
    details = SplitDetails(
        op=op,
        site=site,
        group=kind,
        gate=dict(gate) if gate is not None else None,
        members=members,
        entered=entered,
        absent=absent,
        instances=len(instances),
        group_from=instances[0].group_from,
        group_candidates=instances[0].group_candidates,
        gate_strength=instances[0].gate_strength,
        source=instances[0].source,
    )
    group = groups_phrase(kind, instances, words)
    never = f"{words.ranks(absent, coords=True)} never joined ({doing_phrase(absent, doing_of)})"
    if order is not None:
        details = replace(details, order=order.details())
        never = order_phrase(order, op, entered, words)
        skipped = set(order.skipped_by)
        rest = [r for r in absent if r not in skipped]
        if rest:
            never += f"; {words.ranks(rest, coords=True)} never joined ({doing_phrase(rest, doing_of)})"
    if _is_mtp(op, site, kind, instances):
        cp = layout.cp if layout is not None else "N"
        return MtpCpGatedReduce(
            ranks=members,
            details=details,
            summary=(
                f"MTP loss {op} on {group} entered only by {describe_gate(gate)} ranks "
                f"({words.ranks(entered)}); {never}: verl #5895 deadlock"
            ),
            remedy=f"mtpdiag check && mtpdiag apply (verl PR #5895), then mtpdiag verify --cp {cp}",
        )
    where = f"{site.file}:{site.line}" if site else "its call site"
    signature = signature_of(site)
    if signature in TRACKER_WORDS and gate is not None:
        name, fix = TRACKER_WORDS[signature]
        return GatedCollective(
            ranks=members,
            details=replace(details, signature=signature),
            summary=(
                f"{name} {op} at {words.where(site)} on {group} entered only by {describe_gate(gate)} "
                f"ranks ({words.ranks(entered)}); {never}: {_skip_words(site)}"
            ),
            remedy=fix,
        )
    if gate:
        summary = (
            f"{op} at {words.where(site)} on {group} entered only by {describe_gate(gate)} ranks "
            f"({words.ranks(entered)}){gate_source_phrase(instances[0])}; {never}"
        )
        remedy = (
            f"every rank of the {words.group(kind)} group must call {op} at {where}: move it out "
            f"of the {describe_gate(gate)} branch, or run it on a group whose members all pass that test"
        )
        if instances[0].gate_strength == GateStrength.WEAK:
            remedy += (
                "; if no such branch exists, look for a loop or branch on rank-local data (a count, a "
                "length, a flag) that made these ranks skip or repeat it"
            )
    else:
        summary = (
            f"{op} at {words.where(site)} on {group} entered only by {words.ranks(entered)}; "
            f"{never}; no single coordinate separates them"
        )
        remedy = (
            f"every rank of the {words.group(kind)} group must reach {op} at {where}; "
            "compare the absent ranks' stacks with the entered ones to see where they turned off"
        )
    return GatedCollective(ranks=members, summary=summary, remedy=remedy, details=details)


def _skip_words(site: Site | None) -> str:
    """``reduce_loss_in_tracker returns before its first collective when ...``: how the table says its
    function lets part of the group skip it."""
    skip = skip_of(site)
    if skip is None or site is None:
        return "a tracker skip"
    return f"{site.function.rsplit('.', 1)[-1]} {skip}"


def size_mismatches(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """Every member entered one collective with different sizes (Megatron-LM #3400: 14 vs 15 entries)."""
    return _size_findings([p for p in facts.size_problems if p.problem == DivergenceKind.SIZES], facts.layout)


def dtype_mismatches(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """Every member entered one collective with different dtypes."""
    return _size_findings([p for p in facts.size_problems if p.problem != DivergenceKind.SIZES], facts.layout)


def _size_findings(problems: Sequence[SizeProblem], layout: ParallelLayout | None) -> list[Finding]:
    """Every member entered the same collective, with different sizes or dtypes (``fr_evidence.SizeProblem``).

    NCCL does not check: it hangs, or reduces garbage. Megatron-LM #3400: the MoE aux-loss tracker held 14
    entries on some ranks and 15 on others because the MTP layers were left out of ``force_initialize``. The
    same picture shows when one rank has gone to validation while the others still train.
    """
    words = Words(layout)
    out: list[Finding] = []
    for p in problems:
        name = words.group(p.kind) if p.kind else p.desc or p.group
        values = "; ".join(f"{words.ranks(list(ranks))} with {value}" for value, ranks in p.by_value.items())
        sizes = p.problem == DivergenceKind.SIZES
        what = "sizes" if sizes else "dtypes"
        known = signature_of(p.site)
        if known == "moe-aux-loss":
            remedy = (
                "the ranks' MoE aux-loss trackers hold different entries: initialise every entry on every "
                "rank (megatron's track_moe_metrics(force_initialize=True), and count the MTP layers too: "
                "Megatron-LM #3400/#3401)"
            )
        else:
            remedy = (
                f"every member must pass tensors of the same {'size' if sizes else 'dtype'} to "
                f"{p.op} at {words.where(p.site)}: compare how each rank builds it (a list whose length "
                "depends on the layers a stage holds, a rank in another phase such as validation)"
            )
        out.append(
            (SizeMismatch if sizes else DtypeMismatch)(
                ranks=p.members,
                remedy=remedy,
                summary=(
                    f"{p.op} #{p.seq} at {words.where(p.site)} on the {name} group {words.members(p.members)} "
                    f"was entered by every member, with different {what}: {values}"
                ),
                details=SizeDetails(
                    op=p.op,
                    seq=p.seq,
                    group=p.kind or p.desc,
                    fr_group=p.group,
                    site=p.site,
                    values=dict(p.by_value),
                    source=Source.FLIGHT_RECORDER,
                ),
            )
        )
    return out
