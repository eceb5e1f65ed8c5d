"""``p2p-unmatched``: a send or recv whose peer is not in the matching op. Only root waits get a finding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mtpdiag.analysis.causes import P2PWait
from mtpdiag.analysis.findings.facts import Facts, Mode
from mtpdiag.analysis.findings.words import Words, grouped, union
from mtpdiag.analysis.mismatch import doing
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Finding, P2PDetails, P2PUnmatched, RankView
from mtpdiag.vocabulary.ops import RECV_OPS, SEND_OPS
from mtpdiag.vocabulary.states import RankState


def p2p_call(w: P2PWait) -> str:
    if w.op in SEND_OPS:
        return f"{w.op}(dst={w.peer})"
    if w.op in RECV_OPS:
        return f"{w.op}(src={w.peer})"
    return f"{w.op} with rank {w.peer}"


def _matching(op: str) -> str:
    return "recv" if op in SEND_OPS else "send" if op in RECV_OPS else "matching send/recv"


def _peer_doing(view: RankView | None, words: Words) -> str:
    """``in send(dst=0) at send_backward (worker.py:92)``, ``running in load_batch``, ``not captured``."""
    if view is None or view.state != RankState.COLLECTIVE or view.op is None:
        return doing(view)
    call = view.op
    if view.peer is not None and view.rank is not None:
        call = p2p_call(P2PWait(view.rank, view.op, view.site, view.peer))
    return f"in {call} at {words.where(view.site)}"


def findings(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """The root send/recv waits of the wait-for graph (with groups only: a world-op split has none)."""
    if facts.mode != Mode.GROUPS or facts.causes is None:
        return []
    return _findings(facts.causes.root_p2p, facts.by_rank, facts.layout)


def _findings(roots: Sequence[P2PWait], views: Mapping[int, RankView], layout: ParallelLayout | None) -> list[Finding]:
    """One finding per root (op, site) of unmatched send/recv waits; the summary names both ends."""
    words = Words(layout)
    out: list[Finding] = []
    for (op, site), waits in grouped(roots, lambda w: (w.op, w.site)).items():
        first = waits[0]
        summary = (
            f"{words.rank(first.rank)} waits in {p2p_call(first)} at {words.where(site)}; "
            f"{words.rank(first.peer)} is {_peer_doing(views.get(first.peer), words)}, "
            f"not in a matching {_matching(op)}"
        )
        if len(waits) > 1:
            summary += f" (and {len(waits) - 1} more such pair{'s' if len(waits) > 2 else ''})"
        ranks = union([[w.rank, w.peer] for w in waits])
        out.append(
            P2PUnmatched(
                ranks=ranks,
                summary=summary,
                remedy=(
                    "the two ends disagree on the number or order of their sends and receives: compare "
                    "the microbatch counts and the schedules of both pipeline stages"
                ),
                details=P2PDetails(
                    op=op,
                    site=site,
                    pairs=tuple((w.rank, w.peer) for w in waits),
                    peer_doing={w.peer: doing(views.get(w.peer)) for w in waits},
                ),
            )
        )
    return out
