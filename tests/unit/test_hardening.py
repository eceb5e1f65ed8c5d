"""Every class of bad input in files, flags and the file ``apply`` rewrites, through the real CLI (``python -m
mtpdiag``): one stderr line, the documented exit code (2 input error, 3 nothing captured), no traceback, and
partial results kept where there are any. Live targets are tests/e2e/test_hardening_live.py's.

Privileges are taken away rather than granted: the tests run as root, and ``setpriv --bounding-set=-cap`` runs
mtpdiag without the capability that would let root through (CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH). ``chattr +i``
makes a file that even root cannot write. docs/hardening.md maps each input class to its test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.hardening import MTP, mtpdiag, needs_root_and, one_error_line, partial_report, without_cap

# ------------------------------------------------------------------------------------------ files


def _truncated(tmp_path: Path, source: Path, name: str) -> Path:
    text = source.read_text()
    target = tmp_path / name
    target.write_text(text[: len(text) // 2])
    return target


def test_truncated_json_dump(tmp_path):
    cut = _truncated(tmp_path, MTP / "rank0.json", "rank0.json")
    one_error_line(mtpdiag("analyze", str(cut)), 2, str(cut), "invalid or truncated JSON")


def test_truncated_json_among_good_dumps_keeps_the_others(tmp_path):
    cut = _truncated(tmp_path, MTP / "rank0.json", "rank0.json")
    done = mtpdiag(
        "analyze", str(cut), *(str(MTP / f"rank{r}.json") for r in (1, 2, 3)), "--json", "--cp", "2", "--pp", "2"
    )
    report = partial_report(done, "1 input(s) skipped", "rank0.json", "truncated JSON")
    states = {r["rank"]: r["state"] for r in report["ranks"]}
    assert sorted(r for r, s in states.items() if s != "gone") == [1, 2, 3]
    assert any(f["id"] == "mtp-cp-gated-reduce" for f in report["findings"])  # still diagnosed
    assert any("truncated JSON" in n for n in report["notes"])


def test_truncated_bundle(tmp_path):
    cut = _truncated(tmp_path, MTP / "bundle.json", "host.mtpdiag.json")
    one_error_line(mtpdiag("analyze", str(cut), "--json"), 2, str(cut), "invalid or truncated JSON")


def test_garbage_text_file(tmp_path):
    garbage = tmp_path / "notes.txt"
    garbage.write_text("the job hung again\nno idea why\n")
    one_error_line(mtpdiag("analyze", str(garbage)), 2, str(garbage), "not a py-spy dump")


def test_binary_file(tmp_path):
    blob = tmp_path / "core.dump"
    blob.write_bytes(bytes(range(256)) * 4)
    one_error_line(mtpdiag("analyze", str(blob)), 2, str(blob), "not a text file")


def test_empty_directory(tmp_path):
    one_error_line(mtpdiag("analyze", str(tmp_path)), 2, str(tmp_path), "no capture files")


def test_missing_path(tmp_path):
    one_error_line(mtpdiag("analyze", str(tmp_path / "nowhere")), 2, "no such file or directory")


def test_unreadable_file(tmp_path):
    """Owned by nobody, mode 0600, read by root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH."""
    needs_root_and("setpriv")
    dump = tmp_path / "rank0.json"
    shutil.copyfile(MTP / "rank0.json", dump)
    os.chown(dump, 65534, 65534)
    dump.chmod(0o600)
    one_error_line(
        mtpdiag("analyze", str(dump), prefix=without_cap("dac_override", "dac_read_search")),
        2,
        str(dump),
        "cannot read",
        "Permission denied",
    )


def _bundle_with(tmp_path: Path, name: str, world_size: str) -> Path:
    data = json.loads((MTP / "bundle.json").read_text())
    for capture in data["captures"]:
        capture["env"]["WORLD_SIZE"] = world_size
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_bundle_in_which_no_rank_was_readable_is_incomplete_with_how_to_capture(tmp_path):
    """Every rank of the job is there and stuck, and none could be read: incomplete (exit 4), with what made the
    captures fail and what to collect, never exit 3 (the ranks were found; their stacks were not)."""
    data = json.loads((MTP / "bundle.json").read_text())
    for capture in data["captures"]:
        capture.update(threads=[], state="unreadable", error="py-spy timed out after 10s")
    path = tmp_path / "all-unreadable.mtpdiag.json"
    path.write_text(json.dumps(data))
    done = mtpdiag("analyze", str(path))
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert done.stdout.startswith(
        "INCOMPLETE: no stack in the input: none of ranks 0, 1, 2, 3 could be read (py-spy timed out after 10s)"
    )
    assert "uninterruptible sleep" in done.stdout and "dump every rank" in done.stdout
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bundle_with_no_capture_at_all_is_nothing_captured(tmp_path):
    data = json.loads((MTP / "bundle.json").read_text())
    data["captures"] = []
    path = tmp_path / "empty.mtpdiag.json"
    path.write_text(json.dumps(data))
    one_error_line(mtpdiag("analyze", str(path)), 3, "hold no capture")


def test_bundle_of_a_newer_schema(tmp_path):
    data = json.loads((MTP / "bundle.json").read_text())
    data["schema"] = "mtpdiag.bundle/2"
    path = tmp_path / "future.mtpdiag.json"
    path.write_text(json.dumps(data))
    one_error_line(mtpdiag("analyze", str(path)), 2, "mtpdiag.bundle/2", "reads mtpdiag.bundle/1", "upgrade")


def test_bundles_whose_world_sizes_conflict(tmp_path):
    other = _bundle_with(tmp_path, "other-host.mtpdiag.json", "8")
    one_error_line(
        mtpdiag("analyze", str(MTP / "bundle.json"), str(other)),
        2,
        "world sizes differ",
        str(MTP / "bundle.json"),
        str(other),
    )


def test_world_size_beyond_what_mtpdiag_handles(tmp_path):
    huge = _bundle_with(tmp_path, "huge.mtpdiag.json", "999999999")
    one_error_line(mtpdiag("analyze", str(huge)), 2, "world size 999999999", "more than mtpdiag handles")


def test_duplicate_ranks():
    """One rank in two files is no refusal (issue #20): the JSON and the text dump of one capture are one rank;
    rank 0 of another job is kept beside it, as a conflict the report names (tests/unit/test_same_rank.py)."""
    same = mtpdiag("analyze", str(MTP / "rank0.json"), str(MTP / "rank0.txt"), "--json")
    assert same.returncode in (1, 4) and "error" not in same.stderr, same.stderr
    assert [r["rank"] for r in json.loads(same.stdout)["ranks"]] == [0]
    other = MTP.parent / "straggler" / "rank0.json"
    differ = mtpdiag("analyze", str(MTP / "rank0.json"), str(other), "--json")
    assert differ.returncode in (1, 4) and "error" not in differ.stderr, differ.stderr
    report = json.loads(differ.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 0]
    assert any("rank 0 was captured differently" in n and str(other) in n for n in report["notes"])


def test_layout_that_does_not_divide_the_world_size():
    dumps = [str(MTP / f"rank{r}.json") for r in range(4)]  # raw JSON dumps carry no layout hints
    one_error_line(mtpdiag("analyze", *dumps, "--cp", "3", "--world-size", "4"), 2, "does not divide the world size 4")


def test_a_layout_without_a_world_size_assumes_the_smallest_world_and_says_so():
    """Dumps without WORLD_SIZE are a partial capture as far as anyone knows: cp 3 with ranks 0-3 is a world of
    at least 6, not an error; the report says what it assumed and which ranks it did not see."""
    dumps = [str(MTP / f"rank{r}.json") for r in range(4)]
    done = mtpdiag("analyze", *dumps, "--cp", "3", "--json")
    report = json.loads(done.stdout)
    assert report["world_size"] == 6 and report["layout"]["cp"] == 3
    assert "6 assumed" in report["layout_source"] and "--world-size" in report["layout_source"]
    assert any("4 of 6 ranks captured" in n for n in report["notes"]) or any(
        f["id"] == "missing-rank" and f["ranks"] == [4, 5] for f in report["findings"]
    )


def test_layout_flag_that_contradicts_the_targets_command_line():
    one_error_line(
        mtpdiag("analyze", str(MTP / "bundle.json"), "--cp", "3"),
        2,
        "layout conflict",
        "--cp 3",
        "--context-parallel-size 2",
    )


def test_control_characters_from_a_file_never_reach_the_terminal(tmp_path):
    """A bundle someone handed over, with an escape sequence (retitle the terminal), a bell and a bidi
    override in a function name, and a clear-screen and a newline in an error: all replaced on reading."""
    data = json.loads((MTP / "bundle.json").read_text())
    (site,) = [f for f in data["captures"][1]["threads"][0]["frames"] if f["function"] == "ring_attention"]
    site["function"] = "ring_attention\x1b]0;pwned\x07\u202e"
    data["captures"][0]["threads"] = []
    data["captures"][0]["error"] = "py-spy failed\x1b[2J\nsecond line"
    path = tmp_path / "handed-over.mtpdiag.json"
    path.write_text(json.dumps(data))
    for fmt in ([], ["--markdown"], ["--json"]):
        done = mtpdiag("analyze", str(path), *fmt)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
        for bad in ("\x1b", "\x07", "\u202e"):
            assert bad not in done.stdout + done.stderr, (fmt, repr(bad))
        assert "pwned" in done.stdout  # the name is still shown, only its control characters are not
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("mtpdiag: warning: 1 of 4 ranks not captured") and "second line" in line


# ------------------------------------------------------------------------------------------ apply


@pytest.fixture
def engine_071(tmp_path) -> Path:
    from support.verl_wheels import verl_engine_file

    target = tmp_path / "engine" / "transformer_impl.py"
    target.parent.mkdir()
    shutil.copyfile(verl_engine_file("0.7.1"), target)
    return target


GATE = "        if self.model_config.mtp.enable and self.is_mp_src_rank_with_outputs():\n"


def test_apply_refuses_an_unknown_code_shape(engine_071):
    """The MTP gate split into two nested ifs: affected, but not a shape apply rewrites."""
    text = engine_071.read_text()
    assert text.count(GATE) == 1
    engine_071.write_text(
        text.replace(
            GATE, "        if self.model_config.mtp.enable:\n          if self.is_mp_src_rank_with_outputs():\n"
        )
    )
    mangled = engine_071.read_bytes()
    one_error_line(mtpdiag("apply", "--path", str(engine_071)), 2, "left unchanged", "fix it by hand")
    assert engine_071.read_bytes() == mangled
    assert [p.name for p in engine_071.parent.iterdir()] == [engine_071.name]  # no backup, no temp file


def test_apply_refuses_an_immutable_file(engine_071):
    """``chattr +i``: not even root may write it (chmod 0444 would not stop root)."""
    needs_root_and("chattr")
    original = engine_071.read_bytes()
    if subprocess.run(["chattr", "+i", str(engine_071)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem does not support chattr +i")
    try:
        one_error_line(mtpdiag("apply", "--path", str(engine_071)), 2, str(engine_071), "read-only", "not changed")
    finally:
        subprocess.run(["chattr", "-i", str(engine_071)], check=True)
    assert engine_071.read_bytes() == original
    assert [p.name for p in engine_071.parent.iterdir()] == [engine_071.name]


def test_apply_refuses_an_unreadable_file(engine_071):
    """Owned by nobody, mode 0600, and mtpdiag without the DAC override capabilities."""
    needs_root_and("setpriv")
    original = engine_071.read_bytes()
    os.chown(engine_071, 65534, 65534)
    engine_071.chmod(0o600)
    one_error_line(
        mtpdiag("apply", "--path", str(engine_071), prefix=without_cap("dac_override", "dac_read_search")),
        2,
        "not readable",
    )
    assert engine_071.read_bytes() == original
    assert [p.name for p in engine_071.parent.iterdir()] == [engine_071.name]


def test_a_bundle_with_unknown_layout_hints_is_an_input_error(tmp_path):
    """Found by the fuzzer: layout hints {"a": 1} in a handed-over bundle raised a ValueError (internal error)."""
    data = json.loads((MTP / "bundle.json").read_text())
    data["captures"][0]["layout_hints"] = {"a": 1}
    path = tmp_path / "foreign.mtpdiag.json"
    path.write_text(json.dumps(data))
    one_error_line(mtpdiag("analyze", str(path)), 2, "unknown keys ['a']")
