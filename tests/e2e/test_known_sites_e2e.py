"""End to end: the DeepSeek indexer's pipeline hang (Megatron-LM #4745) is not the MTP signature.

A real torchrun/gloo job with real megatron-core ``parallel_state`` (PP=2) runs the installed
``DSAIndexerLossLoggingHelper.track_indexer_metrics``. Only the last stage holds indexer layers, so
only it has saved a loss: the first stage returns early from ``reduce_loss_in_tracker`` and goes on to
the next collective, while the last waits in the pipeline all_reduce. The known-site table must name
that site the indexer's, on the pipeline group, and never the MTP reduce on DP×CP that its short name
``reduce_loss_in_tracker`` shares.
"""

from __future__ import annotations

import textwrap

import pytest

from mtpdiag.analysis.known_sites import is_mtp_site, lookup, signature_of, skip_of
from mtpdiag.model import Site
from support.jobs_e2e import by_rank, hung_job, run_json

pytestmark = pytest.mark.e2e

# Test input: a worker that runs megatron-core's own indexer-loss logging the way training.py does.
WORKER = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from mtpdiag.fix.verify.cpu_rank import prepare_cpu_rank
    prepare_cpu_rank()  # as the reproducers' ranks do
    from megatron.core import parallel_state as mpu
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper

    NUM_LAYERS = 2

    def forward_backward():
        """The indexer layers live on the last stage; only they save a loss into the tracker."""
        if mpu.is_pipeline_last_stage():
            # save_loss_to_tracker allocates on torch.cuda.current_device(); seed the tracker on CPU.
            DSAIndexerLossLoggingHelper.tracker["values"] = torch.zeros(NUM_LAYERS)
            DSAIndexerLossLoggingHelper.save_loss_to_tracker(torch.tensor(0.5), layer_number=2,
                                                            num_layers=NUM_LAYERS)

    def main():
        dist.init_process_group("gloo")
        mpu.initialize_model_parallel(pipeline_model_parallel_size=2)
        forward_backward()
        print("step", flush=True)
        DSAIndexerLossLoggingHelper.track_indexer_metrics(loss_scale=1.0, iteration=1, writer=None)
        dist.barrier()  # the next collective of the step

    main()
''')


@pytest.fixture(scope="module")
def dsa_hang(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dsa_pp")
    script = tmp / "dsa_worker.py"
    script.write_text(WORKER)
    with hung_job(str(script), [], tmp, nproc=2) as job:
        yield job


def test_the_indexer_hang_is_named_on_the_pipeline_group(dsa_hang):
    report = run_json("inspect", "--pid", str(dsa_hang.pid), "--pp", "2")
    ranks = by_rank(report)
    last = ranks[1]
    assert last["op"] == "all_reduce"
    assert last["site"]["function"] == "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker"
    assert last["site"]["file"].endswith("experimental_attention_variant/dsa.py")
    assert ranks[0]["op"] == "barrier"  # the first stage returned early and went on

    site = Site(file=last["site"]["file"], line=last["site"]["line"], function=last["site"]["function"])
    assert signature_of(site) == "dsa-indexer" and not is_mtp_site(site)
    assert lookup(site).kinds[0] == "pp"
    assert "#4745" in skip_of(site)
    # What Python < 3.11 or a Flight Recorder frame reports: the short name, in the same file.
    short = Site(file=site.file, line=site.line, function="reduce_loss_in_tracker")
    assert signature_of(short) == "dsa-indexer" and not is_mtp_site(short)

    assert "mtp-cp-gated-reduce" not in [f["id"] for f in report["findings"]]
    split = [m for m in report["mismatches"] if m["site"]["function"] == last["site"]["function"]]
    assert [(m["group"], m["members"], m["entered"], m["absent"]) for m in split] == [("pp", [0, 1], [1], [0])]
