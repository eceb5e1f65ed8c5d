"""Progress per process group across ranks (``model.group_marks``, ``parse.groups_completed``), on dumps recorded
from the NCCL-behaviour reproducer (tests/fixtures/captures/nccl_mtp_cp_pp_spin/fr_live: the four ranks' dumps after
the hang, asked for through the pipe) and on earlier dumps of the same job derived from them (``as_of``: what each
rank would have written at an earlier moment while the job moved).
"""

from __future__ import annotations

import pickle

import pytest

from mtpdiag.inputs.flight_recorder.dump import read_groups_completed
from mtpdiag.inputs.flight_recorder.parse import groups_completed
from mtpdiag.model.group_marks import GroupCompleted, advance
from support.fr_fixtures import FR_FIXTURES, as_of, nccl_dump, nccl_scenarios

HANG = "nccl_mtp_cp_pp_spin"
T0 = 1796064475  # s: the recorded job's collectives completed between T0 + 0.8 and T0 + 1.9
READ_AT = float(T0 + 600)  # when the dumps were read: long after (the dump files' times)
END = 1 << 63


def _groups(data: dict, rank: int) -> tuple[GroupCompleted, ...]:
    return groups_completed(data, rank, READ_AT)


def _at(t_s: float) -> int:
    return int((T0 + t_s) * 1e9)


def _completions(data: dict) -> set[float]:
    return {e["time_discovered_completed_ns"] / 1e9 for e in data["entries"] if e["time_discovered_completed_ns"]}


def test_as_of_after_the_last_entry_gives_back_every_recorded_pg_status():
    """The derivation of earlier dumps counts ``pg_status`` as torch did: for every recorded NCCL-format dump,
    the counters it derives from the entries are those the rank wrote."""
    checked = 0
    for directory in nccl_scenarios():
        for rank in range(4):
            data = nccl_dump(directory.parent.name, rank, live=directory.name == "fr_live")
            assert as_of(data, END)["pg_status"] == data["pg_status"], (directory, rank)
            checked += 1
    assert checked >= 8


def test_progress_is_dated_by_the_completion_and_without_one_by_the_dump():
    nccl = _groups(nccl_dump(HANG, 0), 0)
    cp = next(g for g in nccl if g.key == "13[0, 1]")  # rank 0's context-parallel group: 3 all_gathers
    assert cp.seq == 3 and cp.at == pytest.approx(T0 + 1.230, abs=1e-3)
    assert all(g.at <= READ_AT for g in nccl)
    gloo = read_groups_completed(str(FR_FIXTURES / "gloo_mtp_cp_pp" / "rank_0"), 0, READ_AT)
    assert gloo and all(g.at == READ_AT for g in gloo)  # torch 2.13's gloo records no completion: the dump's time


def test_a_rank_read_for_the_first_time_after_a_hang_shows_no_progress():
    """Ranks 0-2 were read after the hang; rank 3's first dump adds nothing: every group it shares is already at
    its mark, and the groups only it shows (its point-to-point ops) are a baseline."""
    marks: dict = {}
    for rank in (0, 1, 2):
        marks, _ = advance(marks, _groups(nccl_dump(HANG, rank), rank))
    marks, newest = advance(marks, _groups(nccl_dump(HANG, 3), 3))
    assert newest is None
    assert marks["14[2, 3]"][0] == 3  # rank 3's context-parallel group, already marked by rank 2


def test_a_rank_read_long_ago_dates_its_progress_by_the_completion_not_by_the_read():
    """Rank 3 was read early (at T0 + 1.1 s), the others after the hang. Its dump after the hang is past its
    shared groups' marks nowhere; what it did show since (its own sends and receives) is dated when the last of
    them completed, before the hang, never when the dump was read: the quiet window is not moved forward."""
    early = as_of(nccl_dump(HANG, 3), _at(1.1))
    marks, _ = advance({}, _groups(early, 3))
    for rank in (0, 1, 2):
        marks, _ = advance(marks, _groups(nccl_dump(HANG, rank), rank))
    late = nccl_dump(HANG, 3)
    marks, newest = advance(marks, _groups(late, 3))
    assert newest is not None and newest in _completions(late)
    assert newest == pytest.approx(T0 + 1.770, abs=1e-3)  # rank 3's last receive
    assert newest < READ_AT
    shared = [g for g in _groups(late, 3) if not g.key.startswith("rank ")]
    assert advance(marks, shared)[1] is None


def test_two_subgroups_with_the_same_name_on_different_ranks_are_kept_apart():
    """torch's ``split_group`` names each rank's own subgroup alike, so rank 2's context-parallel group may carry
    the name of rank 0's: derived here by giving rank 2's group (recorded as "14", ranks [2, 3]) rank 0's name
    "13" in ``pg_config`` and its entries' ``process_group``. Rank 0 reaching collective 3 in its group must not
    hide rank 2 reaching collective 3 in its own."""

    def renamed(data: dict) -> dict:
        data["pg_config"]["13"] = dict(data["pg_config"].pop("14"), name="13")
        for e in data["entries"]:
            if e["process_group"][0] == "14":
                e["process_group"] = ("13", e["process_group"][1])
        return data

    def cp(groups: tuple[GroupCompleted, ...]) -> list[GroupCompleted]:
        return [g for g in groups if g.key.startswith("13[")]

    rank2_early = renamed(as_of(nccl_dump(HANG, 2), _at(1.1)))
    marks, _ = advance({}, cp(_groups(rank2_early, 2)))
    assert list(marks) == ["13[2, 3]"] and marks["13[2, 3]"][0] == 1
    marks, _ = advance(marks, cp(_groups(nccl_dump(HANG, 0), 0)))
    assert marks["13[0, 1]"][0] == 3 and marks["13[2, 3]"][0] == 1
    rank2_late = renamed(nccl_dump(HANG, 2))
    marks, newest = advance(marks, cp(_groups(rank2_late, 2)))
    assert newest == pytest.approx(T0 + 1.450, abs=1e-3)  # rank 2's third all_gather in its own group
    assert marks["13[2, 3]"][0] == 3


def test_a_dump_we_cannot_read_is_a_one_line_refusal(tmp_path):
    from mtpdiag.errors import InputError

    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps(nccl_dump(HANG, 0))[:100])  # a dump torch is still writing
    with pytest.raises(InputError, match="not a readable Flight Recorder dump"):
        read_groups_completed(str(path), 0, READ_AT)
