"""A GPU hang as mtpdiag's users meet it, through the real CLI: the verl MTP/CP bug on NCCL's CPU-side behaviour.

examples/nccl_behaviour runs the bug on an ``ncclcpu`` backend that behaves as ProcessGroupNCCL does: collectives
only queue work, and every rank blocks later at a host sync, a C call, spinning, polling every 1 ms or in a
futex. No rank has a torch.distributed frame on its stack. For each of the three modes, one live job:

* ``inspect`` never says ok and never exits 0 (the stacks alone: incomplete, exit 4, every rank at a host sync);
* ``watch`` calls the hang (exit 1), even while the main threads burn CPU;
* ``inspect --fr-dump`` asks the job for its Flight Recorder through its debug-info pipe and names the bug
  exactly: mtp-cp-gated-reduce on the DP×CP group, entered [2], absent [3] (exit 1);
* ``analyze --fr`` on those dumps alone gives the same answer.

Then cp2-dp2 (entered [0, 2], absent [1, 3]), the dumps the watchdog writes on its timeout, a healthy job with
3 s device steps that ``watch`` must not call hung for 30 s (10 steps, six stall windows), and ``--native`` on
the session's canonical gloo hang.

No timing is asserted: how long ``watch`` took after the job's last completed collective is printed.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from mtpdiag.fix.verify.launch import start_torchrun
from support.jobs_e2e import SPINNING_JOB_ENV, run_cli
from support.recorder import record

pytestmark = pytest.mark.e2e

WORKER = str(record.NCCL_WORKER)
SYNC_FUNCTIONS = {
    0: "_unscale_main_grads_and_check_for_nan",
    1: "_unscale_main_grads_and_check_for_nan",
    2: "collect_mtp_loss",
    3: "_unscale_main_grads_and_check_for_nan",
}
CP_PP = ["--cp", "2", "--pp", "2"]


def _start(tmp: Path, sync: str, layout: list[str], timeout_s: int = 600, gate: str = "buggy"):
    dumps, pipes = tmp / "fr", tmp / "pipes"
    dumps.mkdir()
    pipes.mkdir()
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(pipes / "rank_"),
    }
    args = [
        "--gate",
        gate,
        *layout,
        "--sync",
        sync,
        "--timeout-s",
        str(timeout_s),
        "--device-step-s",
        "0.3",
        "--no-abort",
    ]
    if sync == "spin":
        env |= SPINNING_JOB_ENV
    return start_torchrun(WORKER, args, 4, env=env, log_path=str(tmp / "job.log")), dumps


def _wait_at_host_syncs(ranks: dict[int, int], expected: dict[int, str], timeout: float = 240.0) -> None:
    """Until every main thread sits at its expected sync function twice in a row (py-spy, not mtpdiag)."""
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        try:
            at = {
                r: record.innermost(json.loads(record.py_spy_dump(pid, as_json=True, stopped=True))).get("function")
                or ""
                for r, pid in ranks.items()
            }
        except (RuntimeError, ValueError):
            at = {}
        matched = all(at.get(r, "").rsplit(".", 1)[-1] == f for r, f in expected.items())
        seen = seen + 1 if matched else 0
        if seen >= 2:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the ranks never all reached their host syncs: {at}")


def _json(result, code: int) -> dict:
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def _mtp(report: dict) -> dict:
    first = report["findings"][0]
    assert first["id"] == "mtp-cp-gated-reduce", first
    return first


def _last_progress_s(dumps: Path) -> float:
    """When the job last made progress, by its own Flight Recorder: the newest entry any rank created."""
    newest = 0
    for path in dumps.glob("rank_*"):
        with open(path, "rb") as f:
            dump = pickle.load(f)  # our own job's dumps, written a moment ago
        newest = max([newest] + [e.get("time_created_ns") or 0 for e in dump["entries"]])
    return newest / 1e9


@pytest.fixture(scope="module", params=["spin", "poll", "futex"])
def hung(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"gpu-hang-{request.param}")
    job, dumps = _start(tmp, request.param, CP_PP)
    try:
        ranks = record.worker_ranks(job)
        _wait_at_host_syncs(ranks, SYNC_FUNCTIONS)
        yield {"mode": request.param, "job": job, "dumps": dumps, "tmp": tmp}
    finally:
        job.kill()


def test_inspect_never_calls_a_gpu_hang_ok(hung):
    """No dumps yet (the watchdog's timeout is 10 minutes away): the stacks show host syncs only."""
    report = _json(run_cli("inspect", "--pid", str(hung["job"].pid), "--json"), 4)
    assert report["verdict"] == "incomplete"
    (finding,) = report["findings"]
    assert finding["id"] == "unexplained-wait" and finding["ranks"] == [0, 1, 2, 3]
    assert finding["details"]["waits"] == {"host_sync": [0, 1, 2, 3]}
    assert "Flight Recorder" in finding["remedy"] and "--fr-dump" in finding["remedy"]
    for view in report["ranks"]:
        assert (view["state"], view["op"], view["wait"]["kind"]) == ("waiting", None, "host_sync"), view
        assert view["site"]["function"].rsplit(".", 1)[-1] == SYNC_FUNCTIONS[view["rank"]]
        assert any(".item()" in e or ".cpu()" in e for e in view["wait"]["evidence"]), view["wait"]
    console = run_cli("inspect", "--pid", str(hung["job"].pid))
    assert console.returncode == 4 and console.stdout.startswith("INCOMPLETE: ")
    assert "OK" not in console.stdout.splitlines()[0]


def test_watch_calls_the_hang_while_main_threads_spin_or_poll(hung):
    started = time.time()
    result = run_cli("watch", "--pid", str(hung["job"].pid), "--json", "--out", str(hung["tmp"]), timeout=600)
    called = time.time()
    report = _json(result, 1)
    assert report["verdict"] == "problem" and report["progress"]["hang"] is True
    assert report["progress"]["stalled_for_s"] >= 5.0
    print(
        f"\nwatch ({hung['mode']}) called the hang {called - started:.1f} s after it started (the job was hung "
        f"already: its last Flight Recorder entry is {called - _last_progress_s_live(hung):.1f} s older than the call)"
    )


def _last_progress_s_live(hung) -> float:
    run_cli("inspect", "--pid", str(hung["job"].pid), "--fr-dump", "--json")
    return _last_progress_s(hung["dumps"])


def test_inspect_with_a_live_flight_recorder_dump_names_the_bug(hung):
    report = _json(run_cli("inspect", "--pid", str(hung["job"].pid), "--fr-dump", "--json"), 1)
    finding = _mtp(report)
    assert finding["ranks"] == [2, 3]
    (root,) = [m for m in report["mismatches"] if m["role"] == "root"]
    assert (root["group"], root["entered"], root["absent"], root["gate"]) == ("dp_cp", [2], [3], {"cp": 0})
    assert root["source"] == "flight-recorder" and root["seq"] == 1
    assert root["site"]["function"].endswith("reduce_loss_in_tracker")
    consequences = {(m["op"], tuple(m["entered"])) for m in report["mismatches"] if m["role"] == "consequence"}
    assert ("reduce_scatter_tensor", (3,)) in consequences  # the optimizer's reduce-scatter rank 3 ran on to
    assert all(v["wait"]["kind"] == "host_sync" for v in report["ranks"])
    assert hung["job"].proc.poll() is None  # asking for a dump stops nothing


def test_analyze_of_the_dumps_alone_gives_the_same_answer(hung):
    assert sorted(p.name for p in hung["dumps"].iterdir()) == [f"rank_{r}" for r in range(4)]
    report = _json(run_cli("analyze", "--fr", str(hung["dumps"] / "rank_"), *CP_PP, "--json"), 1)
    assert _mtp(report)["ranks"] == [2, 3]
    (root,) = [m for m in report["mismatches"] if m["role"] == "root"]
    assert (root["entered"], root["absent"]) == ([2], [3])
    assert [v["rank"] for v in report["ranks"]] == [0, 1, 2, 3] and all(v["stack"] is None for v in report["ranks"])


# ---------------------------------------------------------------- cp 2 x dp 2, and the watchdog's own dumps


def test_cp_dp_hang_named_from_the_watchdogs_dumps_and_log(tmp_path):
    """The watchdog's timeout dumps (not a live request): entered [0, 2], absent [1, 3] on DP×CP = the world."""
    job, dumps = _start(tmp_path, "futex", ["--cp", "2", "--pp", "1"], timeout_s=15)
    try:
        record.wait_for_dumps(dumps, 4, job)
        for report in (
            _json(run_cli("inspect", "--pid", str(job.pid), "--json"), 1),
            _json(run_cli("analyze", "--fr", str(dumps), "--cp", "2", "--json"), 1),
        ):
            assert _mtp(report)["ranks"] == [0, 1, 2, 3]
            (root,) = [m for m in report["mismatches"] if m["role"] == "root"]
            assert (root["group"], root["entered"], root["absent"], root["gate"]) == (
                "dp_cp",
                [0, 2],
                [1, 3],
                {"cp": 0},
            )
        log = _json(
            run_cli("analyze", "--log", str(tmp_path / "job.log"), "--cp", "2", "--world-size", "4", "--json"), 1
        )
        (root,) = [m for m in log["mismatches"] if m["role"] == "root"]
        assert (root["op"], root["entered"], root["absent"], root["source"]) == (
            "all_reduce",
            [0, 2],
            [1, 3],
            "watchdog-log",
        )
    finally:
        job.kill()


# ---------------------------------------------------------------- a healthy job


def test_watch_makes_no_false_call_on_a_healthy_job_with_3s_device_steps(tmp_path):
    """The host waits about 3 s at one sync line every step while collectives complete on the device.

    It waits in a futex: for a false call that is the stricter case (no CPU burnt, the stack unchanged, only the
    Flight Recorder moves), and it leaves the machine's cores to the tests beside it. A host that spins is the hang
    tests' case above: busy, yet stuck."""
    dumps, pipes = tmp_path / "fr", tmp_path / "pipes"
    dumps.mkdir()
    pipes.mkdir()
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_"), "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(pipes / "rank_")}
    log = tmp_path / "job.log"
    # cp 2 on two ranks: the host syncs are the same on each rank, and a rank's start-up costs ~4 CPU-s
    args = ["--healthy", "--cp", "2", "--pp", "1", "--device-step-s", "3", "--sync", "futex"]
    with start_torchrun(WORKER, args, 2, env=env, log_path=str(log)) as job:
        record._wait_for_log(str(log), "rank 0 step 1 ", job, timeout=240)
        # 30 s: ten device steps, six of watch's 5 s stall windows
        # --out: a false call's bundle goes to this test's directory, not to the repository the other tests read
        watch = ("watch", "--pid", str(job.pid), "--duration", "30", "--json", "--out", str(tmp_path))
        result = run_cli(*watch, timeout=400)
        report = _json(result, 0)
        assert report["progress"]["hang"] is False and report["verdict"] == "ok"
        assert report["progress"]["samples"] >= 4  # many device steps were seen (fewer samples on a loaded box)
        assert job.proc.poll() is None


# ---------------------------------------------------------------- --native on the gloo reproducer


def test_native_frames_do_not_change_the_gloo_finding(canonical_hang):
    """On the session's canonical hang (the gloo reproducer, cp 2, pp 2)."""
    job = canonical_hang.job
    plain = _json(run_cli("inspect", "--pid", str(job.pid), "--json"), 1)
    native = _json(run_cli("inspect", "--pid", str(job.pid), "--native", "--json", timeout=300), 1)
    assert [f["id"] for f in native["findings"]] == [f["id"] for f in plain["findings"]] == ["mtp-cp-gated-reduce"]
    assert [(v["rank"], v["op"], v["site"]) for v in native["ranks"]] == [
        (v["rank"], v["op"], v["site"]) for v in plain["ranks"]
    ]
    assert any(f.get("native") for stack in native["stacks"] for f in stack)
