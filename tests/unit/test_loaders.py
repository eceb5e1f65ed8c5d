"""Loading recorded captures: bundles, py-spy JSON and py-spy text, and every way a file can be bad.

The inputs are the captures recorded from a real hang by tests/fixtures/record.py (mtp_cp_pp:
rank0 send, rank1 all_gather, rank2 the MTP all_reduce, rank3 all_gather).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from mtpdiag.errors import InputError
from mtpdiag.inputs import load_paths, rank_from_name
from mtpdiag.inputs.bundle import bundle_text, load_bundle, save_bundle
from mtpdiag.inputs.files import expand
from mtpdiag.model import Env, replace

SCENARIO = Path(__file__).parent.parent / "fixtures" / "captures" / "mtp_cp_pp"
RANKS = (0, 1, 2, 3)


def _files(suffix: str) -> list[str]:
    return [str(SCENARIO / f"rank{r}{suffix}") for r in RANKS]


def _stacks(snapshot) -> dict[int, list[tuple[str, int]]]:
    return {c.rank: [(f.function, f.line) for f in c.main_thread.frames] for c in snapshot.captures}


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_json_and_text_forms_agree_on_ranks_functions_and_lines():
    from_json, from_text = load_paths(_files(".json")), load_paths(_files(".txt"))
    assert [c.rank for c in from_json.captures] == list(RANKS)
    assert _stacks(from_json) == _stacks(from_text)
    assert [c.pid for c in from_json.captures] == [c.pid for c in from_text.captures]
    for j, t in zip(from_json.captures, from_text.captures, strict=True):
        assert [os.path.basename(f.file) for f in j.main_thread.frames] == [
            os.path.basename(f.file) for f in t.main_thread.frames
        ]


def test_innermost_frames_of_the_recorded_hang():
    snapshot = load_paths(_files(".json"))
    inner = {c.rank: c.main_thread.frames for c in snapshot.captures}
    assert inner[0][0].function == "send" and inner[0][0].arg("dst") == 2
    assert inner[1][0].function == "all_gather" and inner[1][2].function == "ring_attention"
    assert inner[2][0].function == "all_reduce"
    assert inner[2][2].function == "MTPLossLoggingHelper.reduce_loss_in_tracker"
    assert inner[2][2].file == "megatron/core/transformer/multi_token_prediction.py"
    assert inner[2][0].file == "torch/distributed/distributed_c10d.py"
    assert inner[3][0].function == "all_gather"
    assert all(c.source == str(SCENARIO / f"rank{c.rank}.json") for c in snapshot.captures)


def test_text_dump_gives_layout_hints_but_keeps_no_command_line():
    snapshot = load_paths(_files(".txt"))
    assert all(dict(c.layout_hints) == {"cp": 2, "pp": 2} for c in snapshot.captures)
    stored = bundle_text(snapshot)
    assert "--gate" not in stored and "python -u" not in stored


def test_mixed_bundle_and_raw_dumps_merge_by_rank(tmp_path):
    first_half = load_paths(_files(".json")[:2])
    bundle = save_bundle(replace(first_half, host="node-a"), str(tmp_path / "node-a.mtpdiag.json"))
    merged = load_paths([bundle, *_files(".txt")[2:]])
    assert [c.rank for c in merged.captures] == list(RANKS)
    assert [c.source for c in merged.captures] == [bundle, bundle, *_files(".txt")[2:]]
    assert merged.errors == ()


def test_directory_is_walked_recursively(tmp_path):
    for r in RANKS:
        sub = tmp_path / f"host{r % 2}" / "dumps"
        sub.mkdir(parents=True, exist_ok=True)
        shutil.copy(SCENARIO / f"rank{r}.json", sub / f"rank{r}.json")
    (tmp_path / "host0" / "notes.md").write_text("not a dump, and not read\n")
    snapshot = load_paths([str(tmp_path)])
    assert [c.rank for c in snapshot.captures] == list(RANKS)
    assert snapshot.errors == ()


def test_a_file_named_again_through_a_directory_a_link_or_a_hard_link_is_read_once(tmp_path):
    for r in RANKS:
        shutil.copy(SCENARIO / f"rank{r}.json", tmp_path / f"rank{r}.json")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-links"
    elsewhere.mkdir()
    (elsewhere / "again.json").symlink_to(tmp_path / "rank0.json")
    os.link(tmp_path / "rank1.json", elsewhere / "rank1-hard.json")
    (elsewhere / "dangling.json").symlink_to(tmp_path / "gone.json")
    os.mkfifo(elsewhere / "pipe.json")  # never opened: reading a FIFO found in a walk would block
    named = [str(tmp_path / "rank2.json"), str(tmp_path), str(elsewhere)]
    # Each file once (a file read twice would now merge into one rank unseen, so the walk itself is asked).
    assert sorted(os.path.basename(f) for f in expand(named)) == [f"rank{r}.json" for r in RANKS]
    snapshot = load_paths(named)
    assert sorted(c.rank for c in snapshot.captures) == list(RANKS)
    assert snapshot.errors == ()


def test_a_path_that_cannot_be_read_names_why(tmp_path):
    with pytest.raises(InputError) as missing:
        load_paths([str(tmp_path / "nope")])
    assert _one_line(missing).endswith("nope: no such file or directory")
    with pytest.raises(InputError) as looping:
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        load_paths([str(tmp_path / "loop")])
    assert "loop: cannot read (" in _one_line(looping)


def test_bundle_round_trip_into_a_directory(tmp_path):
    snapshot = replace(load_paths(_files(".json")), host="gpu-node-7")
    written = save_bundle(snapshot, str(tmp_path))
    assert written == str(tmp_path / "gpu-node-7.mtpdiag.json")
    assert sorted(os.listdir(tmp_path)) == ["gpu-node-7.mtpdiag.json"]  # no temp file left behind
    again = load_bundle(written)
    assert msgspec.to_builtins(again.stored()) == msgspec.to_builtins(snapshot.stored())


BUNDLED = sorted(p.parent for p in SCENARIO.parent.glob("*/bundle.json"))


@pytest.mark.skipif(not BUNDLED, reason="no fixture recorded with mtpdiag collect yet")
@pytest.mark.parametrize("scenario", BUNDLED, ids=lambda p: p.name)
def test_recorded_collect_bundles_match_the_raw_dumps(scenario):
    """``mtpdiag collect`` ran on the same hang as the raw dumps: same ranks, same stacks."""
    meta = json.loads((scenario / "scenario.json").read_text())
    bundle = load_paths([str(scenario / "bundle.json")])
    raw = load_paths(sorted(str(p) for p in scenario.glob("rank*") if re.fullmatch(r"rank\d+\.json", p.name)))
    assert [c.rank for c in bundle.captures] == list(range(meta["world_size"]))
    read = [c for c in bundle.captures if c.threads]  # a rank py-spy could not read has no stack to compare
    assert _stacks(replace(bundle, captures=tuple(read))) == _stacks(raw)
    assert all(c.world_size == meta["world_size"] for c in bundle.captures)
    stopped = {c.rank for c in bundle.captures if c.state == "T"}
    assert stopped == set(meta["stopped_ranks"])
    assert all(c.nonblocking for c in bundle.captures if c.rank in stopped)


@pytest.mark.parametrize(
    "name,rank",
    [
        ("rank3.json", 3),
        ("rank-3.txt", 3),
        ("node1_rank_12.json", 12),
        ("r5.txt", 5),
        ("dump-r7.log", 7),
        ("worker3.txt", None),
        ("pid3084.json", None),
    ],
)
def test_rank_from_file_name(name, rank):
    assert rank_from_name(f"/some/dir/{name}") == rank


def test_rank_from_a_pasted_env_line(tmp_path):
    pasted = tmp_path / "ticket-paste.txt"
    pasted.write_text("RANK=2\nWORLD_SIZE=4\nSECRET_TOKEN=abc\n\n" + (SCENARIO / "rank2.txt").read_text())
    capture = load_paths([str(pasted)]).captures[0]
    assert capture.rank == 2 and capture.world_size == 4
    assert capture.env.as_dict() == {"RANK": "2", "WORLD_SIZE": "4"}


def test_raw_dump_without_rank_is_kept_with_rank_none(tmp_path):
    shutil.copy(SCENARIO / "rank1.json", tmp_path / "dump.json")
    capture = load_paths([str(tmp_path / "dump.json")]).captures[0]
    assert capture.rank is None and capture.main_thread.frames[0].function == "all_gather"


def test_truncated_text_is_partial_but_kept(tmp_path):
    lines = (SCENARIO / "rank2.txt").read_text().splitlines(keepends=True)
    first_frame = next(i for i, line in enumerate(lines) if line.startswith("    "))
    cut = tmp_path / "rank2.txt"
    cut.write_text("".join(lines[: first_frame + 3]) + lines[first_frame + 3][:9])
    capture = load_paths([str(cut)]).captures[0]
    assert [f.function for f in capture.main_thread.frames] == [
        "all_reduce",
        "_exception_logger.<locals>.wrapper",
        "MTPLossLoggingHelper.reduce_loss_in_tracker",
    ]


# ---------------------------------------------------------------- bad input


def test_truncated_json_alone_is_an_input_error_naming_the_file(tmp_path):
    text = (SCENARIO / "rank0.json").read_text()
    cut = tmp_path / "rank0.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(InputError) as exc:
        load_paths([str(cut)])
    assert str(cut) in _one_line(exc) and "truncated" in str(exc.value)


def test_a_bad_file_among_good_ones_is_recorded_not_fatal(tmp_path):
    text = (SCENARIO / "rank3.json").read_text()
    cut = tmp_path / "rank3.json"
    cut.write_text(text[:100])
    snapshot = load_paths([*_files(".json")[:3], str(cut)])
    assert [c.rank for c in snapshot.captures] == [0, 1, 2]
    assert len(snapshot.errors) == 1 and str(cut) in snapshot.errors[0]


def test_garbage_text_is_an_input_error(tmp_path):
    garbage = tmp_path / "rank1.txt"
    garbage.write_text("Traceback? no.\nThis is a lunch order, not a stack dump.\n")
    with pytest.raises(InputError) as exc:
        load_paths([str(garbage)])
    assert str(garbage) in _one_line(exc)


def test_binary_files_and_empty_files_of_no_rank_are_input_errors(tmp_path):
    binary, empty = tmp_path / "rank0.dump", tmp_path / "dump.txt"
    binary.write_bytes(b"\x00\xff\xfe" * 50)
    empty.write_text("")
    for bad in (binary, empty):
        with pytest.raises(InputError) as exc:
            load_paths([str(bad)])
        assert str(bad) in _one_line(exc)


def test_an_empty_file_named_after_a_rank_is_that_rank_unreadable(tmp_path):
    """``timeout 10 py-spy dump --pid P > rank3.txt`` leaves an empty file when py-spy hangs on the rank."""
    empty = tmp_path / "rank3.txt"
    empty.write_text("\n")
    (alone,) = load_paths([str(empty)]).captures  # alone: that rank, unreadable (the diagnosis says what to do)
    assert (
        alone.rank == 3 and alone.state == "unreadable" and alone.source == str(empty) and "empty file" in alone.error
    )
    snapshot = load_paths([*_files(".json")[:3], str(empty)])
    (frozen,) = [c for c in snapshot.captures if c.rank == 3]
    assert frozen.state == "unreadable" and not frozen.threads and "empty file" in frozen.error


def test_empty_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as exc:
        load_paths([str(tmp_path)])
    assert str(tmp_path) in _one_line(exc)


def test_nonexistent_path_is_an_input_error(tmp_path):
    missing = tmp_path / "no-such-bundle.json"
    with pytest.raises(InputError) as exc:
        load_paths([*_files(".json"), str(missing)])
    assert str(missing) in _one_line(exc)


def test_same_rank_in_two_files_is_one_capture_or_a_conflict_naming_both():
    """The JSON and the text dump of one capture are one rank; another job's rank 0 is kept beside it, named
    (tests/unit/test_same_rank.py holds the rest)."""
    same = load_paths([str(SCENARIO / "rank0.json"), str(SCENARIO / "rank0.txt")])
    assert [c.rank for c in same.captures] == [0] and same.conflicts == ()
    other = SCENARIO.parent / "straggler" / "rank0.json"
    differ = load_paths([str(SCENARIO / "rank0.json"), str(other)])
    assert [c.rank for c in differ.captures] == [0, 0]
    assert [c.sources for c in differ.conflicts] == [(str(SCENARIO / "rank0.json"), str(other))]


def test_conflicting_world_sizes_name_both_bundles(tmp_path):
    snapshot = load_paths(_files(".json"))

    def sized(capture, size):
        return replace(capture, env=Env(RANK=str(capture.rank), WORLD_SIZE=str(size)))

    a = save_bundle(
        replace(snapshot, captures=tuple(sized(c, 4) for c in snapshot.captures[:2])), str(tmp_path / "a.mtpdiag.json")
    )
    b = save_bundle(
        replace(snapshot, captures=tuple(sized(c, 8) for c in snapshot.captures[2:])), str(tmp_path / "b.mtpdiag.json")
    )
    with pytest.raises(InputError) as exc:
        load_paths([a, b])
    message = _one_line(exc)
    assert a in message and b in message and "4" in message and "8" in message


def test_json_that_is_not_a_dump_is_an_input_error():
    with pytest.raises(InputError) as exc:
        load_paths([str(SCENARIO / "scenario.json")])
    assert "scenario.json" in _one_line(exc)


def test_load_bundle_rejects_truncated_and_foreign_files(tmp_path):
    written = save_bundle(load_paths(_files(".json")), str(tmp_path / "b.json"))
    text = Path(written).read_text()
    Path(written).write_text(text[:-40])
    with pytest.raises(InputError) as exc:
        load_bundle(written)
    assert written in _one_line(exc)
    with pytest.raises(InputError) as exc:
        load_bundle(str(SCENARIO / "rank0.json"))  # a py-spy dump, not a bundle
    assert "rank0.json" in _one_line(exc)
