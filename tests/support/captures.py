"""Recorded captures as Snapshots for tests of the pure analysis (tests/fixtures/captures/<scenario>/).

Each scenario holds ``rank{N}.json`` (scrubbed ``py-spy dump --json --locals`` of a real hung job) and
``scenario.json`` (layout, world size, ranks that were SIGSTOPped). The dumps are read with the real
loader; what py-spy does not record is put back from scenario.json: WORLD_SIZE and the stopped state.
Scenarios that recorded the Flight Recorder (``fr/rank_<N>``) carry those dumps in the snapshot.
"""

from __future__ import annotations

import glob
import json
import os
import re

from mtpdiag.inputs import load_paths
from mtpdiag.inputs.flight_recorder import load_fr_dumps
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import STATE_SLEEPING, STATE_STOPPED, Env, Snapshot, replace

CAPTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "captures")
# rank3.json, and rank3.error.txt where py-spy could not read the rank (not rank3.native.json: the --native dump)
RANK_FILE = re.compile(r"rank(\d+)(?:\.json|\.error\.txt)")


def scenario_dir(name: str) -> str:
    return os.path.join(CAPTURES, name)


def load_scenario(name: str, drop_ranks: tuple[int, ...] = ()) -> tuple[Snapshot, ParallelLayout, dict]:
    """Snapshot, layout and scenario.json of a recorded scenario; ``drop_ranks`` leaves rank files out."""
    with open(os.path.join(scenario_dir(name), "scenario.json"), encoding="utf-8") as f:
        meta = json.load(f)
    files = sorted(
        p for p in glob.glob(os.path.join(scenario_dir(name), "rank*")) if RANK_FILE.fullmatch(os.path.basename(p))
    )
    keep = [p for p in files if int(RANK_FILE.fullmatch(os.path.basename(p))[1]) not in drop_ranks]
    snapshot = load_paths(keep)
    fr_dir = os.path.join(scenario_dir(name), "fr")
    if os.path.isdir(fr_dir):  # the Flight Recorder dumps the same hang wrote (NCCL-behaviour scenarios)
        dumps = load_fr_dumps(os.path.join(fr_dir, "rank_"))
        kept = tuple(d for d in dumps.ranks if d.rank not in drop_ranks)
        snapshot = replace(snapshot, flight_recorder=replace(dumps, ranks=kept))
    world = meta["world_size"]
    stopped = set(meta.get("stopped_ranks") or ())
    captures = tuple(
        replace(c, env=Env(WORLD_SIZE=str(world)), state=STATE_STOPPED if c.rank in stopped else STATE_SLEEPING)
        for c in snapshot.captures
    )
    sizes = meta["layout"]
    layout = ParallelLayout.for_world(
        world, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), pp=sizes.get("pp", 1), ep=sizes.get("ep", 1)
    )
    return replace(snapshot, captures=captures), layout, meta


def scenarios() -> list[str]:
    return sorted(d for d in os.listdir(CAPTURES) if os.path.isfile(os.path.join(CAPTURES, d, "scenario.json")))


def tile(snapshot: Snapshot, layout: ParallelLayout, big: ParallelLayout) -> Snapshot:
    """The recorded hang repeated over a bigger world: every rank of ``big`` gets the recorded stack of
    the rank with the same (tp, cp, pp) coordinates, and a send's ``dst`` is moved to its new peer."""
    by_coords = {}
    for c in snapshot.captures:
        co = layout.coords(c.rank)
        by_coords[(co["tp"], co["cp"], co["pp"])] = c
    old_rank = {key: c.rank for key, c in by_coords.items()}
    captures = []
    for rank in range(big.world_size):
        co = big.coords(rank)
        key = (co["tp"], co["cp"], co["pp"])
        recorded = by_coords[key]
        thread = recorded.main_thread
        frames = tuple(_moved_peer(f, old_rank[key], rank, layout, big) for f in thread.frames)
        captures.append(
            replace(
                recorded,
                rank=rank,
                pid=1_000_000 + rank,
                env=Env(WORLD_SIZE=str(big.world_size)),
                threads=(replace(thread, frames=frames, native_id=1_000_000 + rank),),
            )
        )
    return replace(snapshot, captures=tuple(captures))


def _moved_peer(frame, old: int, new: int, layout: ParallelLayout, big: ParallelLayout):
    if frame.args is None:
        return frame
    moved = {}
    for name in ("dst", "src"):
        value = frame.arg(name)
        if value is not None:
            stage = layout.coords(value)["pp"] - layout.coords(old)["pp"]
            stages = big.group_of("pp", new)
            moved[name] = stages[(stages.index(new) + stage) % len(stages)]
    return replace(frame, args=replace(frame.args, **moved)) if moved else frame
