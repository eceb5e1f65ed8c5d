"""The known-site table: matching by qualified name and file, signatures, and one source for check/lint.

The sites start from the MTP reduce of a recorded hang (``mtp_cp_pp``, rank 2) and move it to the other
helpers' files and names, the way py-spy (qualified names on Python >= 3.11, short ones before), its text
dump (shortened paths) and the Flight Recorder (short names, full paths) report them.
"""

from __future__ import annotations

import pytest

from mtpdiag.analysis.classify import classify_capture
from mtpdiag.analysis.known_sites import (
    KNOWN_SITES,
    MEGATRON_RELEASES,
    MTP_COLLECTIONS,
    TRACKER_ROWS,
    collection_rows,
    engine_row,
    is_mtp_site,
    kinds_of,
    lookup,
    rows_named,
    signature_of,
    skip_of,
)
from mtpdiag.fix import engine
from mtpdiag.layout import GROUP_KINDS
from mtpdiag.model import replace
from support.captures import load_scenario

MTP_FILE = "megatron/core/transformer/multi_token_prediction.py"
DSA_FILE = "megatron/core/transformer/experimental_attention_variant/dsa.py"


@pytest.fixture(scope="module")
def mtp_site():
    snapshot, _, _ = load_scenario("mtp_cp_pp")
    site = classify_capture(next(c for c in snapshot.captures if c.rank == 2)).site
    assert (site.file, site.function) == (MTP_FILE, "MTPLossLoggingHelper.reduce_loss_in_tracker")
    return site


def test_the_recorded_mtp_reduce_is_the_mtp_signature_on_dp_cp(mtp_site):
    assert signature_of(mtp_site) == "mtp" and is_mtp_site(mtp_site)
    assert lookup(mtp_site).kinds == ("dp_cp",)
    assert kinds_of(mtp_site) == ("dp_cp", "tp_cp")  # megatron-core 0.13's MTP layer averaged over TP×CP
    assert skip_of(mtp_site) is None  # its early return splits no DP×CP group: all members share a stage


@pytest.mark.parametrize("function", ["DSAIndexerLossLoggingHelper.reduce_loss_in_tracker", "reduce_loss_in_tracker"])
def test_the_indexer_reduce_is_never_the_mtp_one(mtp_site, function):
    dsa = replace(mtp_site, file=f"/venv/lib/python3.12/site-packages/{DSA_FILE}", function=function)
    assert signature_of(dsa) == "dsa-indexer" and not is_mtp_site(dsa)
    row = lookup(dsa)
    assert row.kinds == ("pp", "dp")
    assert [(c.op, c.kinds, c.reduce) for c in row.collectives] == [
        ("all_reduce", ("pp",), "SUM"),
        ("all_reduce", ("dp",), "AVG"),
    ]
    assert "#4745" in row.skip and "0.18" in row.versions


def test_a_qualified_name_of_another_class_matches_nothing_in_the_mtp_file(mtp_site):
    other = replace(mtp_site, function="DSAIndexerLossLoggingHelper.reduce_loss_in_tracker")
    assert lookup(other) is None and not is_mtp_site(other)


def test_a_short_name_needs_the_helpers_file(mtp_site):
    short = replace(mtp_site, function="reduce_loss_in_tracker")
    assert is_mtp_site(short)  # Python < 3.11 or a Flight Recorder frame: the file pins the row down
    assert lookup(replace(short, file="/job/train.py")) is None
    assert not is_mtp_site(replace(short, file="/job/train.py"))


def test_py_spy_text_dumps_shorten_the_path_and_still_match(mtp_site):
    """``py-spy dump`` (text) prints ``core/transformer/multi_token_prediction.py`` (tests/fixtures/
    captures/mtp_cp_dp/rank2.txt); a file-only row still needs its whole suffix."""
    assert is_mtp_site(replace(mtp_site, file="core/transformer/multi_token_prediction.py"))
    assert lookup(replace(mtp_site, file="core/tensor_parallel/layers.py", function="forward")).kinds == ("tp",)
    assert lookup(replace(mtp_site, file="layers.py", function="forward")) is None


def test_the_renamed_mtp_reduce_and_verls_callers(mtp_site):
    renamed = replace(mtp_site, function="MTPLossLoggingHelper.reduce_metrics_in_tracker")
    assert is_mtp_site(renamed)
    row = lookup(renamed)
    assert "0.19" in row.versions and "main" in row.versions
    assert [(c.reduce, c.elements, c.kinds) for c in row.collectives] == [
        ("AVG", "L", ("dp_cp",)),
        ("SUM", "L", ("dp_cp",)),
        ("SUM", "L", ("dp_cp",)),
    ]
    dev = next(r for r in TRACKER_ROWS if r.function == row.function and "dev" in r.versions)
    assert [(c.reduce, c.elements) for c in dev.collectives][-1] == ("SUM", "2L")
    verl = replace(mtp_site, file="/site/verl/utils/megatron_utils.py", function="get_megatron_mtp_loss")
    assert is_mtp_site(verl) and lookup(verl).kinds == ("dp_cp",)
    # The engine's own token-count all_reduce is no MTP reduce, though the engine collects the MTP loss.
    engine_site = replace(
        mtp_site,
        file="/site/verl/workers/engine/megatron/transformer_impl.py",
        function="MegatronEngine.forward_backward_batch",
    )
    assert signature_of(engine_site) is None and lookup(engine_site).kinds == ("dp",)


def test_moe_aux_loss_rows_start_on_the_pipeline_group(mtp_site):
    moe = replace(
        mtp_site, file="megatron/core/transformer/moe/moe_utils.py", function="reduce_aux_losses_tracker_across_ranks"
    )
    assert signature_of(moe) == "moe-aux-loss" and lookup(moe).kinds[0] == "pp"
    assert "#1444" in skip_of(moe) and "NeMo-RL #3419" in skip_of(moe)


def test_source_calls_resolve_by_qualified_name_only():
    assert {
        r.signature
        for r in rows_named(
            "megatron.core.transformer.multi_token_prediction.MTPLossLoggingHelper.reduce_metrics_in_tracker"
        )
    } == {"mtp"}
    assert {r.signature for r in rows_named("DSAIndexerLossLoggingHelper.reduce_loss_in_tracker")} == {"dsa-indexer"}
    assert rows_named("reduce_loss_in_tracker") == ()
    assert rows_named("helper.reduce_loss_in_tracker") == ()
    assert [r.function for r in rows_named("verl.utils.megatron_utils.get_megatron_mtp_loss")] == [
        "get_megatron_mtp_loss"
    ]


def test_check_and_lint_read_one_list_of_mtp_functions():
    assert engine.MTP_COLLECTIONS == frozenset(collection_rows("mtp"))
    assert set(MTP_COLLECTIONS) == {
        "MTPLossLoggingHelper.reduce_loss_in_tracker",
        "MTPLossLoggingHelper.reduce_metrics_in_tracker",
        "MTPLossLoggingHelper.track_mtp_metrics",
        "get_megatron_mtp_loss",
    }
    assert engine.ENGINE_FUNCTION == "forward_backward_batch" == engine_row().short_name
    assert "/".join(engine.ENGINE_PARTS) == engine_row().file_suffix


def test_every_row_is_well_formed():
    names = {row.function for row in KNOWN_SITES}
    for row in KNOWN_SITES:
        assert row.kinds and set(row.kinds) <= set(GROUP_KINDS), row
        assert all(set(c.kinds) <= set(GROUP_KINDS) for c in row.collectives), row
        assert set(row.calls) <= names, row
    for row in TRACKER_ROWS:
        assert row.file_suffix and row.signature and row.role and row.versions, row
        assert row.collectives or row.calls, row
        if row.package == "megatron-core":
            assert set(row.versions) <= set(MEGATRON_RELEASES) | {"main", "dev"}, row
            untested = set(row.versions) - set(MEGATRON_RELEASES)
            assert not untested or row.source or row.role == "caller", row  # branch claims say where from
