"""What the diagnosis says: where each rank waits, the split collectives, the findings (``mtpdiag.report/1``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpdiag.model.frames import Frame, Site
from mtpdiag.model.sections import FlightRecorderSection, Progress, WatchdogSection
from mtpdiag.vocabulary.states import GateStrength, GroupFrom, RankState, Role, Source, Verdict
from mtpdiag.vocabulary.waits import Confidence, WaitKind

REPORT_SCHEMA = "mtpdiag.report/1"


@dataclass(frozen=True)
class WaitState:
    """Where a rank is stuck, and how sure the evidence makes us.

    ``kind``: collective | host_sync | comm_init | data_loader | lock | io | sleep | running | unknown.
    ``confidence``: certain | likely | possible. ``evidence`` says what the call rests on, in a few words
    each. ``thread`` names the thread that shows it when that is not the main thread.
    """

    kind: WaitKind
    confidence: Confidence
    evidence: tuple[str, ...] = ()
    thread: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "confidence": self.confidence, "evidence": list(self.evidence),
                "thread": self.thread}


@dataclass(frozen=True)
class RankView:
    """One rank as the report shows it. ``state`` is collective|waiting|running|stopped|gone|unreadable
    (``waiting``: blocked outside any collective, e.g. at a host sync or a lock; ``wait`` says on what)."""

    rank: int | None
    pid: int | None
    host: str
    state: RankState
    coords: Mapping[str, int] | None
    op: str | None
    site: Site | None
    stack: tuple[Frame, ...]
    peer: int | None = None  # the other end of a send/recv, when known
    error: str | None = None
    wait: WaitState | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "state": self.state,
            "coords": dict(self.coords) if self.coords is not None else None,
            "op": self.op,
            "site": self.site.to_dict() if self.site else None,
            "stack": [f.to_dict() for f in self.stack],
        }
        if self.peer is not None:
            out["peer"] = self.peer
        if self.error:
            out["error"] = self.error
        out["wait"] = self.wait.to_dict() if self.wait is not None else None
        return out


@dataclass(frozen=True)
class SiteGroup:
    """Ranks that wait in the same op at the same site (op None: in no collective at that user frame; then
    ``wait`` is what they wait on there, e.g. ``host_sync``, or ``running``)."""

    op: str | None
    site: Site | None
    ranks: tuple[int, ...]
    wait: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "site": self.site.to_dict() if self.site else None,
            "ranks": list(self.ranks),
            "wait": self.wait,
        }


@dataclass(frozen=True)
class Mismatch:
    """A process-group instance that only some of its members entered at a site."""

    op: str
    site: Site | None
    group: str
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    gate: Mapping[str, int] | None
    absent_doing: Mapping[int, str] = field(default_factory=dict)  # rank -> "all_gather in ring_attention"
    role: Role = Role.ROOT
    # How the group kind was found: known-site | flight-recorder | unique-fit | guess; every kind that fit.
    group_from: GroupFrom = GroupFrom.UNIQUE_FIT
    group_candidates: tuple[str, ...] = ()
    # strong: several ranks on each side split cleanly along the gate; weak: one rank alone, or other
    # coordinate conditions separate the sides as well (``gate_alternatives``): data-dependent divergence
    # (a loop that ran once more on some ranks) fits just as well.
    gate_strength: GateStrength | None = None
    gate_alternatives: tuple[Mapping[str, int], ...] = ()
    source: Source = Source.STACKS
    seq: int | None = None  # the Flight Recorder's collective sequence number in the group, when known

    def with_role(self, role: Role) -> "Mismatch":
        """``replace(self, role=role)`` without its per-call field introspection (8k instances at 16k ranks);
        tests compare the two, so a new field cannot be dropped here unnoticed."""
        return Mismatch(op=self.op, site=self.site, group=self.group, members=self.members, entered=self.entered,
                        absent=self.absent, gate=self.gate, absent_doing=self.absent_doing, role=role,
                        group_from=self.group_from, group_candidates=self.group_candidates,
                        gate_strength=self.gate_strength, gate_alternatives=self.gate_alternatives,
                        source=self.source, seq=self.seq)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "site": self.site.to_dict() if self.site else None,
            "group": self.group,
            "members": list(self.members),
            "entered": list(self.entered),
            "absent": list(self.absent),
            "gate": dict(self.gate) if self.gate is not None else None,
            "absent_doing": {str(k): v for k, v in sorted(self.absent_doing.items())},
            "role": self.role,
            "group_from": self.group_from,
            "group_candidates": list(self.group_candidates),
            "gate_strength": self.gate_strength,
            "gate_alternatives": [dict(g) for g in self.gate_alternatives],
            "source": self.source,
            "seq": self.seq,
        }


@dataclass(frozen=True)
class Finding:
    """A diagnosed problem, with a stable ``id`` users script against (see docs/design.md)."""

    id: str
    ranks: tuple[int, ...]
    summary: str
    remedy: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "ranks": list(self.ranks), "summary": self.summary}
        out["remedy"] = self.remedy
        if self.details:
            out["details"] = dict(self.details)
        return out


@dataclass(frozen=True)
class Report:
    """The diagnosis. ``verdict``: ok | problem | incomplete."""

    verdict: Verdict
    world_size: int | None
    layout: Mapping[str, Any] | None
    ranks: tuple[RankView, ...]
    sites: tuple[SiteGroup, ...]
    mismatches: tuple[Mismatch, ...] = ()
    findings: tuple[Finding, ...] = ()
    layout_source: str | None = None
    notes: tuple[str, ...] = ()  # what is missing or uncertain, in plain words
    # Optional sections (``model.sections``), present when their evidence was there.
    progress: Progress | None = None
    flight_recorder: FlightRecorderSection | None = None
    watchdog: WatchdogSection | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": REPORT_SCHEMA,
            "verdict": self.verdict,
            "world_size": self.world_size,
            "layout": dict(self.layout) if self.layout is not None else None,
            "layout_source": self.layout_source,
            "ranks": [r.to_dict() for r in self.ranks],
            "sites": [s.to_dict() for s in self.sites],
            "mismatches": [m.to_dict() for m in self.mismatches],
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }
        for key, section in (("progress", self.progress), ("flight_recorder", self.flight_recorder),
                             ("watchdog", self.watchdog)):
            if section is not None:
                out[key] = section.to_dict()
        return out
