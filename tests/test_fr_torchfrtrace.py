"""mtpdiag's matcher against torch's own analyzer, torchfrtrace: the same collective, the same culprits.

On every Flight Recorder fixture (the recorded gloo jobs, the NCCL-format dumps of the NCCL-behaviour
reproducer when present, and variants with op-type and size mismatches derived from real dumps) both
tools must find a problem in the same groups, at the same sequence number, and blame the same ranks:
the ranks missing from it, or, judged against torchfrtrace's reference rank (the rank whose collective
it prints), the ranks whose op, sizes or dtypes differ. torchfrtrace also reports members whose state
differs (one completed, one scheduled); mtpdiag does not count state, which each rank discovers on its
own, so such blocks are left out here. Also run on the live job of ``test_flight_recorder.py``.
"""

from __future__ import annotations

import pytest

from fr_fixtures import FR_FIXTURES, dump_files, entries_of, gloo_scenarios, nccl_scenarios, raw, write_set
from frtrace import FRTraceBlock, first_block_per_group, run_torchfrtrace
from mtpdiag.analysis.flight_recorder import Divergence, match_groups
from mtpdiag.inputs.flight_recorder import load_fr_dumps

STATE_ONLY = {"COLLECTIVE_STATE_MISMATCH"}


def assert_agreement(files) -> dict[str, Divergence]:
    """torchfrtrace and mtpdiag agree on the dumps ``files`` (``<prefix><rank>`` pickles); returns ours."""
    prefix = files[0].name.rstrip("0123456789")
    blocks, text = run_torchfrtrace(list(files), prefix)
    theirs = {g: b for g, b in first_block_per_group(blocks).items()
              if b.kind != "errors" or {t for _, t in b.culprits} - STATE_ONLY}
    analysis = match_groups(load_fr_dumps([str(f) for f in files]))
    ours = {g.name: g.divergence for g in analysis.groups if g.divergence is not None}
    assert theirs, f"torchfrtrace found nothing:\n{text[-3000:]}"
    assert set(theirs) == set(ours), text[-3000:]
    for name, block in theirs.items():
        _agree(block, ours[name])
    return ours


def _agree(block: FRTraceBlock, d: Divergence) -> None:
    assert (block.seq, block.desc) == (d.seq, d.desc)
    assert block.expected == frozenset(d.members)
    assert block.profiling_name in {c.profiling_name for c in d.calls}
    if block.kind == "missing":
        assert block.missing == frozenset(d.missing) == frozenset(d.culprits)
        return
    reference = [r.rank for r in d.ranks if r.call is not None and r.call.profiling_name == block.profiling_name
                 and r.rank not in block.culprit_ranks]
    assert reference, f"no rank of ours issued torchfrtrace's reference {block.profiling_name}"
    assert frozenset(d.culprits_against(reference[0])) == block.culprit_ranks


@pytest.mark.parametrize("directory", gloo_scenarios() + nccl_scenarios(),
                         ids=lambda p: p.parent.name if p.name == "fr" else p.name)
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
