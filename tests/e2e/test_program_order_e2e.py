"""Root cause by program order on live jobs (issue #20): real torchrun/gloo, real megatron-core, real py-spy.

* ``examples/lookalikes --scenario dsa-indexer --step-sync --log-interval 10``: the first stage returns early
  from megatron-core's ``DSAIndexerLossLoggingHelper.reduce_loss_in_tracker`` and waits in the job's own world
  all_reduce (``step_sync``) at a later line of ``main``; the last stage waits in the indexer's pipeline
  all_reduce. ``inspect --pp 2`` (and with the recorded ``--cp 2 --pp 2``) must name the indexer's reduce on
  the pipeline groups the root and the later all_reduce its consequence.
* ``examples/gated_collectives --scenario tracker-loop`` under ``tests/fixtures/fr_worker.py``: a tracker of the
  job's own returns early inside a loop body, and line order points the wrong way; ``inspect`` picks up the
  Flight Recorder dumps the job writes where ``TORCH_FR_DUMP_TEMP_FILE`` says, and the recorder decides.

Both jobs are started together and killed at the end of the module. Nothing here asserts on timing.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest

from support.jobs_e2e import run_json
from support.recorder import record

pytestmark = pytest.mark.e2e

STEP_SYNC, TRACKER_LOOP = "lookalike_dsa_step_sync_gloo", "tracker_loop_gloo_fr"
PP_GROUPS = [[0, 2], [1, 3]]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Both reproducers, started together, each yielded once hung (and, for the loop, once it has dumped)."""
    with ExitStack() as stack:
        started = {}
        for name in (STEP_SYNC, TRACKER_LOOP):
            folder = tmp_path_factory.mktemp(name)
            started[name] = stack.enter_context(record.hung_job(record.SCENARIOS[name], log_dir=str(folder)))
        yield {name: job for name, (job, _ranks, _stopped) in started.items()}


def _function(m: dict) -> str:
    return m["site"]["function"].rsplit(".", 1)[-1]


def _roots(report: dict) -> list[dict]:
    return [m for m in report["mismatches"] if m["role"] == "root"]


@pytest.mark.parametrize("layout", [["--pp", "2"], ["--cp", "2", "--pp", "2"]], ids=["pp2", "cp2-pp2"])
def test_inspect_names_the_indexer_reduce_the_root_and_the_later_world_all_reduce_a_consequence(live, layout):
    report = run_json("inspect", "--pid", str(live[STEP_SYNC].pid), *layout)
    roots = _roots(report)
    assert {_function(m) for m in roots} == {"reduce_loss_in_tracker"}
    assert sorted(m["members"] for m in roots) == PP_GROUPS
    assert all(m["group"] == "pp" and m["group_from"] == "known-site" for m in roots)
    assert sorted(r for m in roots for r in m["entered"]) == [2, 3]
    assert sorted(r for m in roots for r in m["absent"]) == [0, 1]
    later = [m for m in report["mismatches"] if _function(m) == "step_sync"]
    assert later and {m["role"] for m in later} == {"consequence"}
    assert all("world" in m["group_candidates"] for m in later)
    first = report["findings"][0]
    assert first["id"] == "gated-collective"
    assert first["details"]["order"]["source"] == "stacks+known-site"
    assert first["details"]["order"]["skipped_by"] == [0, 1]
    assert "returned before this all_reduce and wait at all_reduce in step_sync" in first["summary"]


def test_inspect_of_the_loop_body_tracker_lets_the_flight_recorder_decide(live):
    report = run_json("inspect", "--pid", str(live[TRACKER_LOOP].pid), "--cp", "2", "--pp", "2")
    assert report["flight_recorder"] is not None and sorted(report["flight_recorder"]["ranks"]) == [0, 1, 2, 3]
    roots = _roots(report)
    assert {_function(m) for m in roots} == {"reduce"}
    assert sorted(r for m in roots for r in m["entered"]) == [2, 3]
    assert sorted(r for m in roots for r in m["absent"]) == [0, 1]
    assert {m["role"] for m in report["mismatches"] if _function(m) == "sync_counts"} == {"consequence"}
    order = report["findings"][0]["details"]["order"]
    assert (order["source"], order["confidence"]) == ("flight-recorder", "certain")


# ---------------------------------------------------------------- the recorded fixtures, against the READMEs

# scenario -> rank -> (op, call site, the function of the frame the two stages share, at which of its lines)
WHERE = {
    STEP_SYNC: {
        0: ("all_reduce", "step_sync", "main", 355),
        1: ("all_reduce", "step_sync", "main", 355),
        2: ("all_reduce", "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker", "main", 354),
        3: ("all_reduce", "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker", "main", 354),
    },
    TRACKER_LOOP: {
        0: ("all_reduce", "sync_counts", "log_metrics", 230),
        1: ("all_reduce", "sync_counts", "log_metrics", 230),
        2: ("all_reduce", "MetricTracker.reduce", "log_metrics", 231),
        3: ("all_reduce", "MetricTracker.reduce", "log_metrics", 231),
    },
}


def _where(threads: list[dict], shared: str) -> tuple[str, str, str, int]:
    frames = next(t for t in threads if t["thread_name"] == "MainThread")["frames"]
    site = next(f for f in frames if not record._is_torch_distributed(f))
    frame = next(f for f in frames if f["name"] == shared)
    return frames[0]["name"], site["name"], frame["name"], frame["line"]


@pytest.mark.parametrize("scenario", sorted(WHERE))
def test_recorded_fixture_is_where_the_readme_says(scenario):
    folder = record.CAPTURES / scenario
    meta = json.loads((folder / "scenario.json").read_text())
    assert meta["layout"] == {"tp": 1, "cp": 2, "pp": 2, "ep": 1} and meta["world_size"] == 4
    for rank, expected in WHERE[scenario].items():
        threads = json.loads((folder / f"rank{rank}.json").read_text())
        assert _where(threads, expected[2]) == expected, rank
        assert meta["where"][str(rank)]["state"] == "S", rank
    if scenario == TRACKER_LOOP:  # torchfrtrace: both pipeline groups miss stage 0 at seq 2, the world 2 and 3
        missing = {
            (e["group"].split(":")[1], e["seq"], tuple(e["missing_ranks"]))
            for e in meta["flight_recorder"]["torchfrtrace"]
        }
        assert missing == {
            ("PIPELINE_MODEL_PARALLEL_GROUP", 2, (0,)),
            ("PIPELINE_MODEL_PARALLEL_GROUP", 2, (1,)),
            ("default_pg", 3, (2, 3)),
        }
        assert sorted(p.name for p in (folder / "fr_gloo").glob("rank_*")) == [f"rank_{r}" for r in range(4)]
        bundle = json.loads((folder / "bundle.json").read_text())  # collect found the dumps where torch's env says
        assert sorted(r["rank"] for r in bundle["flight_recorder"]["ranks"]) == [0, 1, 2, 3]
