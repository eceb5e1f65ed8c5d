"""mtpdiag's matcher against torch's own analyzer, torchfrtrace: the same collective, the same culprits.

On every Flight Recorder fixture (the recorded gloo jobs, the NCCL-format dumps of the NCCL-behaviour
reproducer when present, and variants with op-type and size mismatches derived from real dumps) both
tools must find a problem in the same groups, at the same sequence number, and blame the same ranks:
the ranks missing from it, or, judged against torchfrtrace's reference rank (the rank whose collective
it prints), the ranks whose op, sizes or dtypes differ. torchfrtrace also reports members whose state
differs (one completed, one scheduled); mtpdiag does not count state, which each rank discovers on its
own, so such blocks are left out here (``support.frtrace.assert_agreement``). Also run on the live job of
``tests/e2e/test_flight_recorder.py``.
"""

from __future__ import annotations

import pytest

from support.fr_fixtures import FR_FIXTURES, dump_files, entries_of, gloo_scenarios, nccl_scenarios, raw, write_set
from support.frtrace import assert_agreement


@pytest.mark.parametrize(
    "directory", gloo_scenarios() + nccl_scenarios(), ids=lambda p: p.parent.name if p.name == "fr" else p.name
)
def test_every_fixture(directory):
    files = dump_files(directory)
    assert len(files) >= 2
    assert_agreement(files)


def test_an_op_type_mismatch(tmp_path):
    """The verl bug as NCCL records it (derived as in test_fr_match: rank 3 issues the optimizer's
    ``nccl:_all_gather_base`` as DP_CP #1 where rank 2 issued the MTP ``nccl:all_reduce``)."""
    dumps = {r: raw("gloo_mtp_cp_pp", r) for r in range(4)}
    reduce2 = entries_of(dumps[2], "DATA_PARALLEL_GROUP_WITH_CP")[0]
    reduce2["profiling_name"] = "nccl:all_reduce"
    gather = dict(reduce2, profiling_name="nccl:_all_gather_base")
    dumps[2]["entries"].append(dict(gather, record_id=reduce2["record_id"] + 1, collective_seq_id=2))
    dumps[3]["entries"].append(dict(gather, record_id=len(dumps[3]["entries"]), collective_seq_id=1))
    write_set(tmp_path, dumps)
    ours = assert_agreement(sorted(tmp_path.iterdir()))
    assert any(d.problems == ("op_type",) for d in ours.values())


def test_a_size_mismatch(tmp_path):
    """Megatron-LM #3400's shape (derived as in test_fr_match: 14 vs 15 elements in one all_gather)."""
    dumps = {r: raw("gloo_mtp_cp_dp", r) for r in range(4)}
    for rank, n in ((0, 14), (1, 15)):
        entries_of(dumps[rank], "CONTEXT_PARALLEL_GROUP")[0].update(input_sizes=[[n]], output_sizes=[[2, n]])
    write_set(tmp_path, dumps)
    ours = assert_agreement(sorted(tmp_path.iterdir()))
    assert any(d.problems == ("sizes",) for d in ours.values())


def test_the_fixture_directory_exists():
    assert (FR_FIXTURES / "gloo_mtp_cp_pp" / "rank_0").is_file()
