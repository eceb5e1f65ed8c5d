"""examples/nccl_behaviour behaves as NCCL does on the CPU side: real torchrun jobs, real py-spy and /proc.

One hung job (cp 2, pp 2, buggy gate; ranks 0 and 2 spin, ranks 1 and 3 block in a futex) serves the
process-level checks; one healthy job shows the Flight Recorder moving while a host waits. The recorded
fixtures are checked against the same expectations without a job. Nothing here asserts on mtpdiag's
diagnosis, and nothing on timing.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from mtpdiag.capture import procfs
from mtpdiag.fix.verify.launch import start_torchrun
from support.recorder import record
from support.settle import settled

WORKER = record.NCCL_WORKER
# rank -> the source line of the host sync its main thread waits at (cp 2, pp 2, buggy gate)
SYNC_LINES = {
    0: "found_inf_flag = self.found_inf.item() > 0",
    1: "found_inf_flag = self.found_inf.item() > 0",
    2: 'metrics["mtp_1_loss"] = MTPLossLoggingHelper.tracker["values"].cpu().item()',
    3: "found_inf_flag = self.found_inf.item() > 0",
}
NCCL_NAMES = {"nccl:all_reduce", "nccl:all_gather", "nccl:_reduce_scatter_base", "nccl:all_reduce_barrier"}
P2P_NAMES = {"nccl:send", "nccl:recv", "nccl:coalesced"}  # pipeline stages only


def _main_thread(threads: list[dict]) -> dict:
    return next(t for t in threads if t["thread_name"] == "MainThread")


def _source(frame: dict) -> str:
    import linecache

    return linecache.getline(frame["filename"], frame["line"]).strip()


def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def _pipe_dump(pipes: Path, dumps: Path, rank: int, after_ns: int, timeout: float = 60.0) -> dict:
    """Ask rank ``rank`` for a live dump through its debug-info pipe; return the dump written after ``after_ns``."""
    with open(pipes / f"rank_{rank}.pipe", "w") as f:
        f.write("1\n")
    deadline = time.monotonic() + timeout
    path = dumps / f"rank_{rank}"
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns > after_ns:
            return _load(path)
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} wrote no dump within {timeout}s of the pipe request")


# ---------------------------------------------------------------- the recorded fixtures (no job)


FIXTURES = ["nccl_mtp_cp_pp_spin", "nccl_mtp_cp_pp_poll", "nccl_mtp_cp_pp_futex"]


@pytest.mark.parametrize("scenario", FIXTURES)
def test_recorded_host_syncs_are_the_innermost_frames(scenario):
    folder = record.CAPTURES / scenario
    for rank, line in SYNC_LINES.items():
        main = _main_thread(json.loads((folder / f"rank{rank}.json").read_text()))
        assert not any("torch/distributed/" in f["filename"] for f in main["frames"]), rank
        meta = json.loads((folder / "scenario.json").read_text())
        assert meta["where"][str(rank)]["main_thread"]["code"] == line
        native = _main_thread(json.loads((folder / f"rank{rank}.native.json").read_text()))
        # the shim's wait, under at most the libc call it sleeps in (clock_nanosleep, syscall)
        assert f"host_wait_{scenario.rsplit('_', 1)[1]}" in [f["name"] for f in native["frames"][:3]]


@pytest.mark.parametrize("scenario", FIXTURES + ["nccl_mtp_cp_dp_futex"])
def test_recorded_dumps_are_nccl_dumps_that_torchfrtrace_reads(scenario):
    folder = record.CAPTURES / scenario / "fr"
    dumps = [_load(folder / f"rank_{r}") for r in range(4)]
    assert {d["version"] for d in dumps} == {"2.10"}
    names = {e["profiling_name"].split(" ")[0] for d in dumps for e in d["entries"]}
    assert names >= NCCL_NAMES | (P2P_NAMES if "_pp_" in scenario else set())
    report = record.parse_torchfrtrace(record.run_torchfrtrace(folder))
    kinds = {(r["kind"], r["group"].split(":", 1)[1], r["collective"]) for r in report}
    assert ("errors", "DATA_PARALLEL_GROUP_WITH_CP", "nccl:_reduce_scatter_base") in kinds or (
        "errors",
        "DATA_PARALLEL_GROUP_WITH_CP",
        "nccl:all_reduce",
    ) in kinds
    absent = {2} if "_pp_" in scenario else {0, 2}
    world = next(r for r in report if r["group"].endswith(":INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"))
    assert (world["kind"], set(world["missing_ranks"])) == ("missing_ranks", absent)
    mismatch = next(r for r in report if r["kind"] == "errors")
    assert {c["error"] for c in mismatch["culprits"]} == {"COLLECTIVE_TYPE_MISMATCH"}
    assert {c["rank"] for c in mismatch["culprits"]} <= ({2, 3} if "_pp_" in scenario else {0, 1, 2, 3})


@pytest.mark.parametrize("scenario", FIXTURES + ["nccl_mtp_cp_dp_futex"])
def test_recorded_timeout_dumps_hold_the_failed_works_unretired_and_live_dumps_retired(scenario):
    """NCCL dumps during the watchdog's wait, before retire_id; a watchdog that lives on retires later."""
    folder = record.CAPTURES / scenario
    for r in range(4):
        at_timeout = [
            e
            for e in _load(folder / "fr" / f"rank_{r}")["entries"]
            if e["state"] != "completed" and e["profiling_name"] != "nccl:send" and e["profiling_name"] != "nccl:recv"
        ]
        assert at_timeout and not any(e["retired"] for e in at_timeout), r
        live = _load(folder / "fr_live" / f"rank_{r}")["entries"]
        failed = [e for e in live if e["retired"] and e["state"] != "completed"]
        assert failed and all(e["time_discovered_completed_ns"] is None for e in failed), r


def test_recorded_watchdog_log_has_nccls_timeout_line():
    log = (record.CAPTURES / "nccl_mtp_cp_pp_spin" / "fr" / "watchdog.log").read_text()
    assert (
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=_REDUCE_SCATTER_BASE, "
        "NumelIn=32, NumelOut=16, Timeout(ms)=10000) ran for " in log
    )


# ---------------------------------------------------------------- jobs of their own, before the hung job
# (pytest keeps a module fixture until the module ends: these run before ``hung`` starts, not beside its
# spinning ranks; the healthy host waits in a futex, since nothing here reads its CPU)


@pytest.mark.e2e
def test_without_no_abort_every_rank_dumps_then_the_job_aborts(tmp_path):
    """At cp 2 on two ranks (the bug's smallest world): both time out, dump and abort."""
    dumps = tmp_path / "fr"
    dumps.mkdir()
    log = tmp_path / "job.log"
    args = [
        "--gate",
        "buggy",
        "--cp",
        "2",
        "--pp",
        "1",
        "--sync",
        "futex",
        "--timeout-s",
        "5",
        "--device-step-s",
        "0.2",
    ]
    with start_torchrun(
        str(WORKER), args, 2, env={"TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_")}, log_path=str(log)
    ) as job:
        code = job.wait(300)
    text = log.read_text(errors="replace")
    assert code not in (None, 0), text[-2000:]
    assert "terminate called after throwing an instance of 'c10::DistBackendError'" in text
    assert "Signal 6 (SIGABRT)" in text
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0", "rank_1"]


# ---------------------------------------------------------------- a healthy job


@pytest.mark.e2e
def test_healthy_job_moves_its_flight_recorder_while_the_host_waits_at_one_line(tmp_path):
    dumps, pipes = tmp_path / "fr", tmp_path / "pipes"
    dumps.mkdir()
    pipes.mkdir()
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_"), "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(pipes / "rank_")}
    log = tmp_path / "job.log"
    with start_torchrun(
        str(WORKER),
        ["--healthy", "--cp", "1", "--pp", "2", "--device-step-s", "3", "--sync", "futex"],
        2,  # rank 0 (the first stage, which writes no metric) and its recorder are what is read
        env=env,
        log_path=str(log),
    ) as job:
        ranks = record.worker_ranks(job)
        record._wait_for_log(str(log), "rank 0 step 1 ", job, timeout=240)
        first = _pipe_dump(pipes, dumps, 0, after_ns=0)
        lines = set()
        for _ in range(3):
            main = _main_thread(json.loads(record.py_spy_dump(ranks[0], as_json=True)))
            lines.add(_source(main["frames"][0]))
            time.sleep(0.5)
        record._wait_for_log(str(log), "rank 0 step 3 ", job, timeout=240)
        second = _pipe_dump(pipes, dumps, 0, after_ns=(dumps / "rank_0").stat().st_mtime_ns)
        assert job.proc.poll() is None
    done = {k: v["last_completed_collective"] for k, v in first["pg_status"].items()}
    later = {k: v["last_completed_collective"] for k, v in second["pg_status"].items()}
    assert any(later[k] > done.get(k, -1) for k in later), (done, later)
    assert len(second["entries"]) > len(first["entries"])
    assert "found_inf_flag = self.found_inf.item() > 0" in lines  # rank 0's first host sync of each step


# ---------------------------------------------------------------- a live hung job


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    base = tmp_path_factory.mktemp("nccl-hung")
    dumps, pipes = base / "fr", base / "pipes"
    dumps.mkdir()
    pipes.mkdir()
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(pipes / "rank_"),
    }
    args = [
        "--gate",
        "buggy",
        "--cp",
        "2",
        "--pp",
        "2",
        "--sync",
        "spin,futex,spin,futex",
        "--timeout-s",
        "8",
        "--device-step-s",
        "0.4",
        "--no-abort",
    ]
    job = start_torchrun(str(WORKER), args, 4, env=env, log_path=str(base / "job.log"))
    try:
        ranks = record.worker_ranks(job)
        record.wait_for_dumps(dumps, 4, job)
        yield {"job": job, "ranks": ranks, "dumps": dumps, "pipes": pipes, "log": base / "job.log"}
    finally:
        job.kill()


@pytest.mark.e2e
def test_each_main_thread_waits_at_its_host_sync_line_outside_torch_distributed(hung):
    for rank, pid in hung["ranks"].items():

        def check(main: dict, rank: int = rank) -> None:
            assert _source(main["frames"][0]) == SYNC_LINES[rank], rank
            assert not any("torch/distributed/" in f["filename"] for f in main["frames"]), rank

        settled(lambda pid=pid: _main_thread(json.loads(record.py_spy_dump(pid, as_json=True))), check)


@pytest.mark.e2e
def test_spinning_host_syncs_burn_cpu_and_futex_waits_do_not(hung):
    pids = hung["ranks"]
    # 0 and 2 spin, 1 and 3 sleep in a futex (same job, same load). A spinner burns CPU whenever it has one; on a
    # loaded machine one can wait out a whole window for it (the stress run of 2026-12-06: rank 2 0.2% in 1.5 s,
    # rank 0 94%), so each rank's busiest of several windows counts, for up to a minute, and a sleeper must
    # stay idle in every one of them.
    used = {r: 0.0 for r in range(4)}

    def busiest_windows() -> dict[int, float]:
        for r in range(4):
            used[r] = max(used[r], record.main_thread_cpu_percent(pids[r], 1.5) or 0.0)
        return used

    def spinners_stand_out(busiest: dict[int, float]) -> None:
        assert min(busiest[0], busiest[2]) > 5 * max(busiest[1], busiest[3], 0.5), busiest

    settled(busiest_windows, spinners_stand_out, within_s=60)
    # The main thread's state, sampled: a futex sleeper is "S" nearly always (one sample of 'R' for rank 3 was
    # seen once: a wake-up between two waits, e.g. after a signal or a ptrace detach).
    samples = []
    for _ in range(20):
        samples.append({r: procfs.read_stat(pids[r]).state for r in (1, 3)})
        time.sleep(0.05)
    sleeping = {r: sum(s[r] == "S" for s in samples) for r in (1, 3)}
    assert min(sleeping.values()) >= 16, (sleeping, samples)


@pytest.mark.e2e
def test_the_watchdog_dumps_nccl_flight_records_and_logs_the_timeout(hung):
    dumps = [_load(hung["dumps"] / f"rank_{r}") for r in range(4)]
    for d in dumps:
        assert {"version", "pg_config", "comm_lib_version", "pg_status", "entries"} <= set(d)
        assert all(e["profiling_name"].startswith("nccl:") for e in d["entries"])
    rank2 = {e["profiling_name"] for e in dumps[2]["entries"] if e["process_group"][1] == "DATA_PARALLEL_GROUP_WITH_CP"}
    rank3 = {e["profiling_name"] for e in dumps[3]["entries"] if e["process_group"][1] == "DATA_PARALLEL_GROUP_WITH_CP"}
    assert (rank2, rank3) == ({"nccl:all_reduce"}, {"nccl:_reduce_scatter_base"})
    log = hung["log"].read_text(errors="replace")
    assert (
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=8000) ran for " in log
    )


@pytest.mark.e2e
def test_a_pipe_dump_after_the_timeout_shows_the_failed_work_retired_not_completed(hung):
    dump = _pipe_dump(hung["pipes"], hung["dumps"], 2, after_ns=(hung["dumps"] / "rank_2").stat().st_mtime_ns)
    failed = [e for e in dump["entries"] if e["retired"] and e["state"] != "completed"]
    assert [(e["profiling_name"], e["process_group"][1]) for e in failed] == [
        ("nccl:all_reduce", "DATA_PARALLEL_GROUP_WITH_CP")
    ]
    assert failed[0]["time_discovered_completed_ns"] is None
    assert hung["job"].proc.poll() is None  # the pipe dump stops nothing


@pytest.mark.e2e
def test_torchfrtrace_reads_the_live_dumps(hung):
    report = record.parse_torchfrtrace(record.run_torchfrtrace(hung["dumps"]))
    mismatch = next(r for r in report if r["kind"] == "errors")
    assert mismatch["group"].endswith(":DATA_PARALLEL_GROUP_WITH_CP")
    assert [c["error"] for c in mismatch["culprits"]] == ["COLLECTIVE_TYPE_MISMATCH"]
    assert mismatch["culprits"][0]["rank"] in (2, 3)
    missing = next(r for r in report if r["kind"] == "missing_ranks")
    assert (missing["group"].split(":", 1)[1], missing["missing_ranks"]) == (
        "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
        [2],
    )
