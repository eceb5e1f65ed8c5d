"""examples/lookalikes: the tracker hangs on the pipeline group that look like the verl MTP/CP deadlock
behave as its README says, checked with real torchrun jobs, py-spy, /proc, the Flight Recorder dumps and
torchfrtrace; the recorded fixtures are checked against the same expectations without a job.

``aux-loss-sizes`` runs in the NCCL-behaviour mode only: gloo itself does not hang on unequal all_reduce
sizes (the rank with fewer elements aborts with ``gloo::EnforceNotMet``), while NCCL, and the ``ncclcpu``
backend, stall, and the Flight Recorder records both sizes at one sequence number.

The five hung jobs are started at once (their start-up and the watchdog's timeout overlap), and each is
killed after its own tests. Nothing here asserts on mtpdiag's diagnosis, and nothing on timing.
"""

from __future__ import annotations

import json
import linecache
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from mtpdiag.capture import procfs
from mtpdiag.fix.verify.launch import start_torchrun
from support.recorder import record
from support.settle import settled

WORKER = record.LOOKALIKES_WORKER
GLOO = ("lookalike_dsa_indexer_gloo", "lookalike_moe_lazy_tracker_gloo")
NCCL = ("lookalike_dsa_indexer_nccl", "lookalike_moe_lazy_tracker_nccl", "lookalike_aux_loss_sizes_nccl")
PP, DP_CP = "PIPELINE_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_WITH_CP"
WORLD = "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"  # megatron-core 0.16.1's grad-stats group: the world
# scenario -> (the tracker function that issues the pipeline all_reduce, as py-spy names it; its file)
SITES = {
    "dsa_indexer": (
        "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker",
        "megatron/core/transformer/experimental_attention_variant/dsa.py",
    ),
    "moe_lazy_tracker": ("reduce_aux_losses_tracker_across_ranks", "megatron/core/transformer/moe/moe_utils.py"),
    "aux_loss_sizes": ("reduce_aux_losses_tracker_across_ranks", "megatron/core/transformer/moe/moe_utils.py"),
}
FOUND_INF = "found_inf_flag = self.found_inf.item() > 0"
STAGE0, STAGE1 = (0, 1), (2, 3)
# scenario -> rank -> the elements of its pipeline all_reduce (absent: it issued none)
PP_SIZES = {
    "dsa_indexer": {2: 4, 3: 4},
    "moe_lazy_tracker": {2: 4, 3: 4},
    "aux_loss_sizes": {0: 14, 1: 14, 2: 15, 3: 15},
}


def _kind(scenario: str) -> str:
    return scenario.removeprefix("lookalike_").rsplit("_", 1)[0]


def _main(threads: list[dict]) -> list[dict]:
    return next(t for t in threads if t["thread_name"] == "MainThread")["frames"]


def _names(frames: list[dict]) -> list[str]:
    return [f["name"] for f in frames]


def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


# ---------------------------------------------------------------- expectations shared by fixtures and jobs


def check_gloo_rank(scenario: str, rank: int, threads: list[dict]) -> None:
    """Stage 0 waits in training_log's barrier, never having entered the tracker's collective; stage 1 waits
    in the tracker's pipeline all_reduce, called from megatron-core's own function."""
    frames = _main(threads)
    function, path = SITES[_kind(scenario)]
    if rank in STAGE0:
        assert _names(frames)[0] == "barrier" and "interval_time_elapsed" in _names(frames), (rank, _names(frames))
        assert function not in _names(frames), rank
    else:
        assert _names(frames)[0] == "all_reduce", (rank, _names(frames))
        site = next(f for f in frames if "torch/distributed/" not in f["filename"])
        assert (site["name"], site["filename"].endswith(path)) == (function, True), (rank, site)


def check_nccl_rank(
    rank: int, threads: list[dict], native: list[dict] | None = None, recorded: dict | None = None
) -> None:
    """Every host at iteration 2's found_inf.item(), outside torch.distributed; in C under --native. The line's
    code is read from the source a live rank runs, or for a fixture from what its ``scenario.json`` recorded
    (``recorded``: the rank's ``main_thread``; the source has moved on since, and may be elsewhere)."""
    frames = _main(threads)
    if recorded is None:
        code = linecache.getline(frames[0]["filename"], frames[0]["line"]).strip()
    else:
        assert (frames[0]["name"].rsplit(".", 1)[-1], frames[0]["line"]) == (
            recorded["function"].rsplit(".", 1)[-1],
            recorded["line"],
        ), (rank, frames[0], recorded)
        code = recorded["code"]
    assert code == FOUND_INF, (rank, frames[0])
    assert "train_step" in _names(frames) and "training_log" not in _names(frames), rank
    assert not any("torch/distributed/" in f["filename"] for f in frames), rank
    if native is not None:
        assert "host_wait_futex" in _names(_main(native))[:3], (rank, _names(_main(native))[:4])


def _collectives(dump: dict, desc: str) -> list[dict]:
    return [e for e in dump["entries"] if e["process_group"][1] == desc and not e["is_p2p"]]


def check_flight_recorder(scenario: str, dumps: dict[int, dict]) -> None:
    """The pipeline all_reduce at seq 1 (issued by megatron-core's tracker function) on the ranks and with
    the sizes the README says, never run; no disagreement on DP x CP; every rank in the world's found_inf
    all_reduce of iteration 2."""
    kind = _kind(scenario)
    function = SITES[kind][0].rsplit(".", 1)[-1]
    for rank, dump in dumps.items():
        world = _collectives(dump, WORLD)[-1]
        assert (world["profiling_name"], world["state"], world["input_sizes"]) == (
            "nccl:all_reduce",
            "scheduled",
            [[1]],
        ), rank
        pp = _collectives(dump, PP)
        if rank not in PP_SIZES[kind]:
            assert pp == [], (rank, [e["profiling_name"] for e in pp])
            continue
        [entry] = pp
        assert (entry["collective_seq_id"], entry["profiling_name"], entry["input_sizes"], entry["state"]) == (
            1,
            "nccl:all_reduce",
            [[PP_SIZES[kind][rank]]],
            "scheduled",
        ), rank
        assert function in [f["name"] for f in entry["frames"]], rank
    for members in (STAGE0, STAGE1):
        issued = [
            [(e["collective_seq_id"], e["profiling_name"], e["input_sizes"]) for e in _collectives(dumps[r], DP_CP)]
            for r in members
        ]
        assert issued[0] == issued[1], (members, issued)
    if kind == "aux_loss_sizes":  # the MTP reduce, pending on stage 1's DP x CP: both members issued it
        mtp = [
            [
                e
                for e in _collectives(dumps[r], DP_CP)
                if any(f["filename"].endswith("multi_token_prediction.py") for f in e["frames"])
            ]
            for r in (0, 1, 2, 3)
        ]
        assert [len(m) for m in mtp] == [0, 0, 1, 1]
        assert {m[0]["state"] for m in mtp[2:]} == {"scheduled"}


def check_torchfrtrace(scenario: str, text: str) -> None:
    """torchfrtrace names the pipeline groups, and no other group."""
    report = record.parse_torchfrtrace(text)
    assert {r["group"].split(":", 1)[1] for r in report} == {PP}, report
    assert {r["collective"] for r in report} == {"nccl:all_reduce"} and {r["seq"] for r in report} == {1}
    if _kind(scenario) == "aux_loss_sizes":
        assert [r["kind"] for r in report] == ["errors", "errors"]
        culprits = [c["rank"] for r in report for c in r["culprits"]]
        assert {c["error"] for r in report for c in r["culprits"]} == {"SIZE_OR_SYNTAX_MISMATCH"}
        # one culprit per pipeline group ([0, 2] and [1, 3]: the rank's parity); which member torchfrtrace
        # blames depends on the order it reads the files in
        assert sorted(c % 2 for c in culprits) == [0, 1], culprits
        assert "does not match found input sizes" in text and "'[[14]]'" in text and "'[[15]]'" in text
    else:
        assert sorted((r["kind"], tuple(r["missing_ranks"])) for r in report) == [
            ("missing_ranks", (0,)),
            ("missing_ranks", (1,)),
        ]


# ---------------------------------------------------------------- the recorded fixtures (no job)


@pytest.mark.parametrize("scenario", GLOO + NCCL)
def test_recorded_fixture_shows_each_rank_where_the_readme_says(scenario):
    folder = record.CAPTURES / scenario
    meta = json.loads((folder / "scenario.json").read_text())
    assert meta["layout"] == {"tp": 1, "cp": 2, "pp": 2, "ep": 1} and meta["world_size"] == 4
    assert meta["recorded_with"]["megatron-core"] == "0.16.1"
    for rank in range(4):
        threads = json.loads((folder / f"rank{rank}.json").read_text())
        assert meta["where"][str(rank)]["state"] == "S", rank
        if scenario in GLOO:
            check_gloo_rank(scenario, rank, threads)
        else:
            native = json.loads((folder / f"rank{rank}.native.json").read_text())
            check_nccl_rank(rank, threads, native, recorded=meta["where"][str(rank)]["main_thread"])


@pytest.mark.parametrize("scenario", NCCL)
def test_recorded_flight_recorder_and_torchfrtrace(scenario):
    folder = record.CAPTURES / scenario
    check_flight_recorder(scenario, {r: _load(folder / "fr" / f"rank_{r}") for r in range(4)})
    check_torchfrtrace(scenario, (folder / "fr" / "torchfrtrace.txt").read_text())
    meta = json.loads((folder / "scenario.json").read_text())
    assert meta["flight_recorder"]["torchfrtrace"] == record.parse_torchfrtrace(
        (folder / "fr" / "torchfrtrace.txt").read_text()
    )


@pytest.mark.parametrize("scenario", NCCL)
def test_recorded_watchdog_log_times_out_the_pipeline_all_reduce(scenario):
    log = (record.CAPTURES / scenario / "fr" / "watchdog.log").read_text()
    sizes = sorted(set(PP_SIZES[_kind(scenario)].values()))
    for n in sizes:
        assert (
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn={n}, "
            f"NumelOut={n}, Timeout(ms)=10000)" in log
        ), n
    if _kind(scenario) != "aux_loss_sizes":  # stage 0's stream: iteration 2's first send to stage 1
        assert "WorkNCCL(SeqNum=5, OpType=COALESCED, NumelIn=0, NumelOut=0, Timeout(ms)=10000)" in log


@pytest.mark.parametrize("scenario", GLOO + NCCL)
def test_recorded_bundle_is_the_same_job(scenario):
    """bundle.json is ``mtpdiag collect`` of the same four ranks; the NCCL ones carry the timeout dumps."""
    folder = record.CAPTURES / scenario
    bundle = json.loads((folder / "bundle.json").read_text())
    assert sorted(c["rank"] for c in bundle["captures"]) == [0, 1, 2, 3]
    assert {c["main_syscall"] for c in bundle["captures"]} == {"futex"}
    fr = bundle["flight_recorder"]
    if scenario in NCCL:
        assert sorted(r["rank"] for r in fr["ranks"]) == [0, 1, 2, 3]
        assert not any(e["retired"] for r in fr["ranks"] for e in r["entries"] if e["state"] != "completed")
    else:
        assert fr is None


@pytest.mark.parametrize(
    "scenario", ["nccl_mtp_cp_pp_spin", "nccl_mtp_cp_pp_poll", "nccl_mtp_cp_pp_futex", "nccl_mtp_cp_dp_futex"]
)
def test_the_mtp_twin_on_nccl_has_two_partly_entered_collectives(scenario):
    """What the look-alikes are told apart from (examples/nccl_behaviour): on DP x CP, seq 1 is the MTP
    all_reduce on the cp 0 ranks and the optimizer's reduce-scatter on the cp 1 ranks, which the gate sent
    ahead; on the world group the cp 1 ranks' found_inf all_reduce (seq 1) waits for the cp 0 ranks of the
    last stage, which never issue it. The grad-norm all_reduce after found_inf.item() is issued by no rank."""
    folder = record.CAPTURES / scenario / "fr"
    dumps = {r: _load(folder / f"rank_{r}") for r in range(4)}
    mtp_ranks = (2,) if "_pp_" in scenario else (0, 2)  # last stage, cp 0
    layout = json.loads((record.CAPTURES / scenario / "scenario.json").read_text())["layout"]
    last_stage = [r for r in range(4) if r // (4 // layout["pp"]) == layout["pp"] - 1]
    for rank, dump in dumps.items():
        dp_cp = [(e["collective_seq_id"], e["profiling_name"]) for e in _collectives(dump, DP_CP)]
        world = [(e["collective_seq_id"], e["profiling_name"], e["state"]) for e in _collectives(dump, WORLD)]
        if rank in mtp_ranks:
            assert (dp_cp, world) == ([(1, "nccl:all_reduce")], []), rank
        else:
            assert dp_cp == [(1, "nccl:_reduce_scatter_base")], rank
            assert world == [(1, "nccl:all_reduce", "scheduled")], rank
        if rank in last_stage:
            assert {e["state"] for e in _collectives(dump, DP_CP)} == {"scheduled"}, rank


# ---------------------------------------------------------------- the reproducers, live


# The control: with the tracker sized num_layers + mtp_num_layers on every stage (#3401), the same job on
# the same backend completes (NCCL's 10-minute watchdog timeout: a slow start-up is no hang).
FIXED = [
    "--scenario",
    "aux-loss-sizes",
    "--mode",
    "nccl",
    "--fixed",
    "--steps",
    "2",
    "--sync",
    "futex",
    "--device-step-s",
    "0.2",
]


class LiveJobs:
    """The five scenarios as recorded and the fixed control, started together (their start-ups and watchdog
    timeouts overlap). A scenario is waited for when first read (``ready``: its job, rank -> pid, its folder) and
    killed once its tests are done (``end``): a hung world left running costs about 7% of a core (each rank's 21
    gloo device loops wake 100 times a second), and five of them stood for the module's 213 s (CI-44)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.running: dict[str, dict] = {}
        try:
            self._start(tmp_path_factory)
        except BaseException:
            self.close()
            raise

    def _start(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        for name in GLOO + NCCL:
            scenario = record.SCENARIOS[name]
            folder = tmp_path_factory.mktemp(name)
            # six jobs start at once on a shared machine: a longer watchdog timeout than the fixtures' 10 s
            # keeps a slow start-up from timing out before the hang
            args = [
                ("20" if prev == "--timeout-s" else a)
                for prev, a in zip(("",) + scenario.worker_args, scenario.worker_args, strict=False)
            ]
            job = start_torchrun(
                str(scenario.script),
                args,
                scenario.nproc,
                env=record.scenario_env(scenario, str(folder)),
                log_path=str(folder / "job.log"),
            )
            self.running[name] = {"name": name, "job": job, "folder": folder}
        fixed_log = tmp_path_factory.mktemp("fixed") / "job.log"
        fixed = start_torchrun(str(WORKER), FIXED, 4, log_path=str(fixed_log))
        self.running["fixed"] = {"job": fixed, "log": fixed_log}

    def ready(self, name: str) -> dict:
        """The scenario once hung (the NCCL ones once every rank dumped), with ``ranks``: rank -> pid."""
        live = self.running[name]
        if "ranks" not in live:  # set once it has been waited for
            scenario, job = record.SCENARIOS[name], live["job"]
            ranks = record.worker_ranks(job)
            if scenario.flight_recorder:
                record.wait_for_dumps(record.fr_dir(live["folder"]), scenario.nproc, job)
            else:
                job.wait_until_stuck(quiet_s=3.0, timeout=240.0)
            live["ranks"] = ranks
        return live

    def end(self, name: str) -> None:
        live = self.running.pop(name, None)
        if live is not None:
            live["job"].kill()

    def close(self) -> None:
        for name in list(self.running):
            self.end(name)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    jobs = LiveJobs(tmp_path_factory)
    try:
        yield jobs
    finally:
        jobs.close()


@pytest.fixture(scope="module")
def scenario_job(request, live):
    """One scenario's hung job, for the tests parametrized with it (indirectly: module-scoped, so pytest runs each
    scenario's tests together); killed after them."""
    try:
        yield live.ready(request.param)
    finally:
        live.end(request.param)


@pytest.mark.e2e
@pytest.mark.parametrize("scenario_job", GLOO, indirect=True)
def test_gloo_stage_without_the_layers_waits_in_the_barrier_the_other_in_the_pipeline_all_reduce(scenario_job):
    scenario = scenario_job["name"]
    for rank, pid in scenario_job["ranks"].items():
        settled(
            lambda pid=pid: json.loads(record.py_spy_dump(pid, as_json=True)),
            lambda threads, rank=rank: check_gloo_rank(scenario, rank, threads),
        )
        _asleep_in_a_futex(rank, pid)
    assert scenario_job["job"].proc.poll() is None


def _asleep_in_a_futex(rank: int, pid: int) -> None:
    """The main thread is back asleep in a futex, not spinning: a rank py-spy has just let go (or that has just
    written its dump) can be running for a moment on a loaded machine."""

    def check(seen: tuple[str, str | None]) -> None:
        assert seen == ("S", "futex"), (rank, seen)

    settled(lambda: (procfs.read_stat(pid).state, procfs.main_thread_syscall(pid)), check, within_s=20)


@pytest.mark.e2e
@pytest.mark.parametrize("scenario_job", NCCL, indirect=True)
def test_nccl_every_host_at_the_next_iterations_host_sync(scenario_job):
    for rank, pid in scenario_job["ranks"].items():

        def read(pid: int = pid, rank: int = rank) -> tuple[list[dict], list[dict] | None]:
            native = json.loads(record.py_spy_dump(pid, as_json=True, native=True)) if rank in (0, 2) else None
            return json.loads(record.py_spy_dump(pid, as_json=True)), native

        settled(read, lambda seen, rank=rank: check_nccl_rank(rank, *seen))
        _asleep_in_a_futex(rank, pid)
        assert procfs.maps_cuda(pid) is False, rank
    log = (scenario_job["folder"] / "job.log").read_text(errors="replace")
    assert all(f"rank {r} iteration 1: training_log" in log for r in range(4))
    assert "iteration 2: training_log" not in log


@pytest.mark.e2e
@pytest.mark.parametrize("scenario_job", NCCL, indirect=True)
def test_nccl_flight_recorder_and_torchfrtrace(scenario_job):
    folder = record.fr_dir(scenario_job["folder"])
    check_flight_recorder(scenario_job["name"], {r: _load(folder / f"rank_{r}") for r in range(4)})
    check_torchfrtrace(scenario_job["name"], record.run_torchfrtrace(folder))


@pytest.mark.e2e
def test_gloo_refuses_the_size_mismatch_scenario():
    done = subprocess.run(
        [sys.executable, str(WORKER), "--scenario", "aux-loss-sizes", "--mode", "gloo"],
        capture_output=True,
        text=True,
        timeout=600,  # four ranks' start-up (torch, megatron) overran 120 s beside the spinning timing jobs
    )
    assert done.returncode == 2
    assert "gloo::EnforceNotMet" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.e2e
def test_the_fixed_size_mismatch_job_finishes(live):
    fixed = live.running["fixed"]
    code = fixed["job"].wait(240)
    text = fixed["log"].read_text(errors="replace")
    assert code == 0, text[-2000:]
    assert all(f"rank {r} done" in text for r in range(4))
