"""A collective called by a helper in the file of a known function is placed at the known function.

On the BLOOM-176B eval hang as the bigscience logbook posted it (benchmarks/accuracy/incidents/, a real py-spy
capture), three TP peers wait in ``broadcast`` called by megatron's ``_build_key_size_numel_dictionaries``, a
helper in ``megatron/mpu/data.py`` that ``broadcast_data`` of the same file calls. The known-site table knows
``broadcast_data`` (the batch broadcast from tp rank 0, on the TP group), not its helper: the report names
``broadcast_data``. A collective whose call site is itself known, or whose caller is in another file, keeps
its innermost call site.
"""

from __future__ import annotations

from pathlib import Path

from mtpdiag.inputs import load_paths
from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot

INCIDENTS = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy" / "incidents"
BLOOM = INCIDENTS / "bloom-176b-eval-dataloader-deadlock"


def _report():
    snapshot = load_paths([str(BLOOM / "node48.txt"), str(BLOOM / "node49.txt")])
    return diagnose_snapshot(snapshot, LayoutOptions(tp=4, pp=2, world_size=16))


def test_the_tp_peers_of_the_loader_wait_at_broadcast_data_not_its_helper():
    report = _report()
    at = {v.pid: (v.op, v.site.function if v.site else None, v.site.line if v.site else None) for v in report.ranks}
    for pid in (688515, 688516, 688517):  # the three TP peers of the process in the DataLoader
        assert at[pid] == ("broadcast", "broadcast_data", 88), at[pid]
    # the others keep their own call sites: known (pipeline p2p) or of another file (deepspeed's engine)
    assert at[688510] == ("broadcast", "_bcast_pipe_scalar", 542)
    assert at[688514] == (None, "_next_batch", 627)
    straggler = report.findings[0]
    assert straggler.id == "straggler"
    assert "broadcast at broadcast_data (data.py:88): 3" in straggler.summary, straggler.summary
    assert "_build_key_size_numel_dictionaries" not in straggler.summary
    print(straggler.summary)
