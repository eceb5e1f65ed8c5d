"""Which rank a pasted dump is, from every source, ``--rank-from``, conflicts; and the world size.

Inputs are recorded dumps (tests/fixtures/pastes/) with the lines people add around them made
mechanically: an env line, a log prefix, a ``head`` file header, a flag on the command line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.errors import InputError
from mtpdiag.inputs import load_paths
from support import pastes as P

REPO = Path(__file__).resolve().parents[2]
TITLES = P.PASTES / "titles"
pytestmark = pytest.mark.skipif(not P.scenarios(), reason="no recorded pastes (run tests/fixtures/record_pastes.py)")


def _dump(rank: int = 2, form: str = "pyspy") -> Path:
    return next(p for p in P.files("mtp_cp_pp", form) if P.rank_of(p) == rank)


def _rank(tmp_path: Path, name: str, text: str, **kw) -> int | None:
    (capture,) = load_paths([P.written(tmp_path, name, text)], **kw).captures
    return capture.rank


def _one_line_error(tmp_path: Path, name: str, text: str, **kw) -> str:
    with pytest.raises(InputError) as exc:
        load_paths([P.written(tmp_path, name, text)], **kw)
    assert "\n" not in str(exc.value)
    return str(exc.value)


# ---------------------------------------------------------------- each source


def test_rank_from_each_source(tmp_path):
    text = _dump(2).read_text()
    assert _rank(tmp_path, "rank2.txt", text) == 2  # the file name
    assert _rank(tmp_path, "a.txt", "RANK=2\nWORLD_SIZE=4\n" + text) == 2  # an env line pasted with it
    assert _rank(tmp_path, "b.txt", P.prefixed(text, "[rank2]: ")) == 2  # torch's log prefix
    assert _rank(tmp_path, "c.txt", P.prefixed(text, "rank2: ")) == 2
    assert _rank(tmp_path, "d.txt", P.prefixed(text, "[2026-01-29 13:12:37 TP2] ")) == 2  # sglang's log prefix
    assert _rank(tmp_path, "e.txt", "==> rank2.txt <==\n" + text) == 2  # head's file header
    flagged = re.sub(r"^(Process \d+: .*)$", r"\1 --rank 2", text, count=1, flags=re.MULTILINE)
    assert _rank(tmp_path, "f.txt", flagged) == 2  # a launcher's --rank flag on the command line
    assert _rank(tmp_path, "g.txt", text) is None  # nothing says


def test_a_tp_coordinate_behind_a_pipeline_stage_is_not_a_rank(tmp_path):
    text = _dump(2).read_text()
    assert _rank(tmp_path, "a.txt", P.prefixed(text, "[2026-01-29 13:12:37 PP1 TP2] ")) is None
    assert _rank(tmp_path, "b.txt", P.prefixed(text, "[default2]: ")) is None  # torchrun's tee: a local rank


@pytest.mark.skipif(not TITLES.exists(), reason="process titles not recorded")
def test_rank_from_a_recorded_process_title(tmp_path):
    assert load_paths([str(TITLES / "sglang-tp3.pyspy.txt")]).captures[0].rank == 3
    assert load_paths([str(TITLES / "sglang-pp1-tp0.pyspy.txt")]).captures[0].rank is None
    ray = (TITLES / "ray-worker.pyspy.txt").read_text()
    assert _rank(tmp_path, "ray.txt", ray) is None  # a Ray worker's title names no rank ...
    assert _rank(tmp_path, "ray-env.txt", "RANK=5\nWORLD_SIZE=8\n" + ray) == 5  # ... the paste around it may
    title = (TITLES / "sglang-tp3.pyspy.txt").read_text()
    message = _one_line_error(tmp_path, "rank1.txt", title)
    assert "rank1.txt" in message and "sglang::scheduler_TP3" in message


# ---------------------------------------------------------------- conflicts and --rank-from


def test_two_sources_that_disagree_are_an_input_error_naming_both(tmp_path):
    text = _dump(2).read_text()
    message = _one_line_error(tmp_path, "rank3.txt", "RANK=2\n" + text)
    assert "rank3.txt" in message and "says rank 3" in message and "RANK=2" in message and "says rank 2" in message
    message = _one_line_error(tmp_path, "x.txt", "RANK=1\n" + P.prefixed(text, "[rank2]: "))
    assert "RANK=1" in message and "[rank2]:" in message and "--rank-from" in message


def test_rank_from_is_searched_around_the_dump_then_in_the_path(tmp_path):
    text = _dump(2).read_text()
    assert _rank(tmp_path, "dump-r7.txt", text, rank_from=r"worker-(\d+)") == 7  # no match: the name still counts
    node = tmp_path / "node-03-gpu-2"
    node.mkdir()
    assert _rank(node, "dump-r7.txt", text, rank_from=r"gpu-(\d+)") == 2  # the user's word beats the name
    assert _rank(tmp_path, "x.txt", "job 17, global rank 2 stack:\n" + text, rank_from=r"global rank (\d+)") == 2
    assert _rank(tmp_path, "rank3.txt", "RANK=2\n" + text, rank_from=r"RANK=(\d+)") == 2  # settles a conflict


@pytest.mark.parametrize("regex,words", [("(", "not a regular expression"), (r"rank\d+", "no group")])
def test_a_bad_rank_from_is_an_input_error(regex, words):
    with pytest.raises(InputError, match=words):
        load_paths([str(_dump(2))], rank_from=regex)


def test_two_processes_of_one_file_naming_one_rank_are_a_conflict_that_says_how_to_tell_them_apart(tmp_path):
    """No refusal (issue #20): both processes are kept, and the conflict names the file, the pids and --rank-from."""
    paths = P.files("mtp_cp_pp", "pyspy")
    text = "".join(P.prefixed(p.read_text(), "[rank1]: ") for p in paths[:2])
    path = P.written(tmp_path, "two.txt", text)
    snapshot = load_paths([path])
    assert [c.rank for c in snapshot.captures] == [1, 1]
    (conflict,) = snapshot.conflicts
    assert conflict.rank == 1 and all(s.startswith(f"{path} (pid ") for s in conflict.sources)
    assert "--rank-from REGEX" in conflict.why


def _mtpdiag(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_analyze_rank_from_on_the_command_line(tmp_path):
    """Files named by host and slot, not rank: --rank-from tells which number is the rank."""
    paths = []
    for p in P.files("mtp_cp_pp", "pyspy"):
        target = tmp_path / f"node-07.slot-{P.rank_of(p)}.log"
        target.write_text(p.read_text())
        paths.append(str(target))
    done = _mtpdiag("analyze", *paths, "--world-size", "4", "--json", "--rank-from", r"slot-(\d+)")
    assert done.returncode == 1, done.stderr
    assert '"mtp-cp-gated-reduce"' in done.stdout
    bad = _mtpdiag("analyze", *paths, "--rank-from", "(")
    assert (
        bad.returncode == 2 and bad.stderr.startswith("mtpdiag: error: --rank-from") and "Traceback" not in bad.stderr
    )


# ---------------------------------------------------------------- world size


def test_world_size_comes_from_the_dumps_never_from_the_number_of_files(tmp_path):
    paths = P.files("mtp_cp_pp", "pyspy")[:3]
    sized = [P.written(tmp_path, p.name, f"WORLD_SIZE=4\n{p.read_text()}") for p in paths]
    snapshot = load_paths(sized)
    assert len(snapshot.captures) == 3 and snapshot.world_sizes == [4]
    slurm = [P.written(tmp_path, "s-" + p.name, f"export SLURM_NTASKS=4\n{p.read_text()}") for p in paths]
    assert load_paths(slurm).world_sizes == [4]
    assert load_paths(P.names(paths)).world_sizes == []


def test_a_paste_of_several_processes_shares_its_world_size_and_refuses_two(tmp_path):
    paths = P.files("mtp_cp_pp", "pyspy")
    one = P.written(tmp_path, "all.txt", "WORLD_SIZE=4\n" + P.joined(paths))
    snapshot = load_paths([one])
    assert [c.world_size for c in snapshot.captures] == [4, 4, 4, 4]
    assert [c.rank for c in snapshot.captures] == [0, 1, 2, 3]
    two = P.written(
        tmp_path, "two.txt", "WORLD_SIZE=4\n" + P.joined(paths[:2]) + "\nWORLD_SIZE=8\n" + P.joined(paths[2:])
    )
    with pytest.raises(InputError, match="world sizes differ"):
        load_paths([two])
