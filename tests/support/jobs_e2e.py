"""Shared helpers for end-to-end tests: run real torchrun/gloo jobs and the real ``mtpdiag`` CLI."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import unavailable
from mtpdiag.capture import procfs
from mtpdiag.capture.ray_job import AGENT_NOT_READY
from mtpdiag.fix.verify import launch
from mtpdiag.fix.verify.launch import Job, start_torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MTP_WORKER = os.path.join(ROOT, "examples", "mtp_cp_deadlock", "worker.py")
GATED_WORKER = os.path.join(ROOT, "examples", "gated_collectives", "worker.py")
HEALTHY_STEPS = os.path.join(ROOT, "tests", "support", "healthy_steps.py")  # its healthy loop, waiting for data
FR_WORKER = os.path.join(ROOT, "examples", "flight_recorder", "worker.py")  # the MTP reproducer + FR dumps
# A job whose host syncs spin (examples/nccl_behaviour --sync spin) runs with this environment: a thread that has
# spun for a second lowers itself to nice 19 (hostsync.c): a hung rank, not its start-up or its healthy steps. On
# a user's node each spinning rank has a core of its own and the node has cores to spare for mtpdiag; on a 2-core
# CI machine four spinners at normal priority took a third of both cores from every test beside them for minutes
# (CI-22: their fixture's set-up 133 s against the futex job's 33 s; a 4-rank gloo job beside them 141 s against
# 8.5 s idle). At nice 19 they still spin, are still runnable (state R) at the same line, and still take every
# cycle nothing else wants. The whole job at nice 19 (`nice -n 19 torchrun`, until CI-34) slowed its start-up and
# its steps to the hang too: the spinning run and gpu-hang tests took 68-112 s of a loaded run. A tool starved of
# CPU is tested in test_capture_under_load_e2e.
SPINNING_JOB_ENV = {"MTPDIAG_SPIN_NICE": "19"}


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m mtpdiag ARGS`` as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """The same entry point (mtpdiag.cli.main) in this process: no interpreter start-up per call."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from mtpdiag.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["mtpdiag", *args]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def run_json(*args: str, expect: int = 1) -> dict:
    result = run_cli(*args, "--json")
    assert result.returncode == expect, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


@contextmanager
def hung_job(script: str, args: list[str], tmp_path, nproc: int = 4, env: dict | None = None):
    """A real job that has stopped making progress; killed (every descendant) on exit."""
    job = start_torchrun(script, args, nproc, env=env, log_path=str(tmp_path / "job.log"))
    try:
        job.wait_until_stuck(quiet_s=2.5, timeout=180)
        yield job
    finally:
        job.kill()


def wait_for_log(path, needle: str, timeout: float, job: Job | None = None) -> None:
    """Until ``needle`` is in the log at ``path``; fails at once when ``job`` has exited instead."""
    deadline = time.monotonic() + timeout
    path = Path(path)
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        if job is not None and job.proc.poll() is not None:
            raise AssertionError(f"the job exited ({job.proc.returncode}) before {needle!r} appeared in {path}")
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared in {path}")


_wait_for_log = wait_for_log  # the name the older tests import


def require_private_network() -> None:
    """Skip unless jobs may run in their own network namespace (root, and ``unshare --net`` allowed);
    in CI (``CI`` set) fail instead: there the network-loss reproducer must run."""
    if os.geteuid() != 0:
        reason = "needs root for unshare --net / nsenter"
    else:
        try:
            probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=30)
            reason = None if probe.returncode == 0 else f"unshare --net refused: {probe.stderr.strip()}"
        except FileNotFoundError:
            reason = "unshare (util-linux) is not installed"
    if reason is not None:
        unavailable(reason)


def by_rank(report: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in report["ranks"]}


def worker_pids(job: Job) -> dict[int, int]:
    return {int((procfs.read_env(p) or {})["RANK"]): p for p in job.workers()}


def session_members(sessions: set[int]) -> list[int]:
    """The live processes of these sessions (a job started with ``start_new_session`` leads one)."""
    members = []
    for pid in procfs.all_pids():
        stat = procfs.read_stat(pid)
        if stat is not None and stat.session in sessions and stat.state != "Z":
            members.append(pid)
    return members


def end_sessions(sessions: set[int], also: set[int] = frozenset()) -> list[int]:
    """SIGKILL every process of the sessions, ``also`` and every descendant of them; what is left (should be none).

    Everything is stopped before anything is killed, so a raylet cannot start a worker in between; and the
    sessions must stay empty for a second, so that a process a dying ``ray start`` was still forking (seen: a
    log monitor, orphaned with the head's RANK) is found too.
    """
    for _ in range(5):
        pids = set(session_members(sessions)) | {p for p in also if procfs.read_stat(p)}
        pids |= {d for p in list(pids) for d in procfs.descendants(p)}
        if not pids:
            time.sleep(1.0)
            if not session_members(sessions):
                return []
            continue
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            (s := procfs.read_stat(p)) is not None and s.state != "Z" for p in pids
        ):
            time.sleep(0.1)
    return session_members(sessions)


def free_port() -> int:
    """A free TCP port on the loopback (for a Ray head, a rendezvous)."""
    return free_ports(1)[0]


# Where a test's servers listen: above Ray's worker ports (10002-19999 by default) and below the kernel's ephemeral
# range (32768-60999 by default), which nothing hands out by itself: a port chosen there stays free until the server
# binds it, while one the kernel chose can be handed to the next bind to port 0 or the next connection out: gloo's
# listeners and connections (21 process groups a rank), Ray's own components (random ports above one the kernel gave).
OWN_PORTS_FROM = 20000


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports, chosen at random from ``OWN_PORTS_FROM`` up to the ephemeral range (the
    kernel's choice where there is no room). Each stays bound until all are chosen (CI-42: a Ray head's dashboard
    and client server got the same one, and `ray start` refused it)."""
    low = _ephemeral_ports_from()
    own = range(OWN_PORTS_FROM, max(low, OWN_PORTS_FROM))
    candidates = random.sample(own, k=min(64, len(own)))
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == count:
                break
            sock = socket.socket()
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        while len(socks) < count:
            socks.append(socket.socket())
            socks[-1].bind(("", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _ephemeral_ports_from() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def wait_for_listener(port: int, timeout: float, context: Callable[[], str]) -> None:
    """Until something accepts a connection on 127.0.0.1:``port``: `ray start` returns before the servers it started
    listen. Else fail with ``context()`` (the server's log), which says why it does not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on port {port} after {timeout}s ({exc}): {context()}") from None
        time.sleep(0.5)


def ray_client_server_log(ray_tmp: str) -> Callable[[], str]:
    """What the Ray Client server of the head started with ``--temp-dir=ray_tmp`` wrote (the end of it)."""

    def tail() -> str:
        logs = Path(ray_tmp) / "session_latest" / "logs"
        texts = [(p.name, p.read_text(errors="replace").strip()) for p in sorted(logs.glob("ray_client_server*"))]
        return " | ".join(f"{name}: {' / '.join(text.splitlines()[-6:])}" for name, text in texts if text) or (
            f"no ray_client_server log in {logs}"
        )

    return tail


def wait_until_quiet(pids: list[int], quiet_s: float = 2.5, timeout: float = 120.0) -> None:
    """Until no actor's main thread has used CPU, or been runnable or in the kernel, for ``quiet_s``: a job of Ray
    actors hangs (``launch.wait_until_quiet``, as ``Job.wait_until_stuck``); an actor that exits fails it."""

    def all_alive() -> None:
        ticks = [procfs.main_thread_ticks(p) for p in pids]
        assert None not in ticks, f"an actor exited: {ticks}"

    launch.wait_until_quiet(pids, quiet_s, timeout, still_on=all_alive)


@dataclass(frozen=True)
class RayVerlHang:
    """A shape of examples/ray_verl's hang (verl #5895): its sizes, and where each rank waits (see
    examples/mtp_cp_deadlock/README.md)."""

    cp: int
    pp: int
    waits: dict[int, tuple[str, str]]  # rank -> (op, function)
    entered: int  # the cp == 0 rank in the MTP loss all_reduce
    absent: int  # its cp == 1 peer, which never joins

    @property
    def world(self) -> int:
        return len(self.waits)

    @property
    def layout(self) -> tuple[int, int, int, int]:
        """(tp, cp, dp, pp)."""
        return (1, self.cp, self.world // (self.cp * self.pp), self.pp)

    def overrides(self, nnodes: int = 1) -> list[str]:
        """The driver's Hydra overrides: the sizes, and the world spread over ``nnodes`` nodes."""
        return [
            f"actor_rollout_ref.actor.megatron.context_parallel_size={self.cp}",
            f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={self.pp}",
            f"trainer.n_gpus_per_node={self.world // nnodes}",
            f"trainer.nnodes={nnodes}",
        ]


# cp 2, pp 2 on four actors: the pipeline's p2p too (the multi-node cluster test spreads it over two nodes).
RAY_VERL_CP2_PP2 = RayVerlHang(
    cp=2,
    pp=2,
    waits={
        0: ("send", "send_forward"),
        1: ("all_gather", "ring_attention"),
        2: ("all_reduce", "MTPLossLoggingHelper.reduce_loss_in_tracker"),
        3: ("all_gather", "ring_attention"),
    },
    entered=2,
    absent=3,
)
# cp 2 on two actors: the smallest world with the bug, for the tests of how a Ray job is deployed and found
# (each actor imports torch and megatron-core: two fewer a job is ~10 CPU-s of a CI that is CPU-bound).
RAY_VERL_CP2 = RayVerlHang(
    cp=2,
    pp=1,
    waits={
        0: ("all_reduce", "MTPLossLoggingHelper.reduce_loss_in_tracker"),
        1: ("all_gather", "ring_attention"),
    },
    entered=0,
    absent=1,
)


def check_ray_verl_hang(report: dict, hang: RayVerlHang) -> None:
    """The diagnosis of examples/ray_verl's hang of shape ``hang``, the layout from its driver."""
    assert report["world_size"] == hang.world
    layout = report["layout"]
    assert (layout["tp"], layout["cp"], layout["dp"], layout["pp"]) == hang.layout, layout
    assert "command line" in report["layout_source"], report["layout_source"]
    ranks = by_rank(report)
    for rank, (op, function) in hang.waits.items():
        view = ranks[rank]
        assert (view["state"], view["op"], view["site"]["function"]) == ("collective", op, function), view
        # The stack is the actor's: Ray's task loop calls the WorkerDict method that trains.
        assert any(f["function"].endswith("update_actor") for f in report["stacks"][view["stack"]]), rank
    assert report["verdict"] == "problem"
    finding = report["findings"][0]
    assert (finding["id"], finding["ranks"]) == ("mtp-cp-gated-reduce", [hang.entered, hang.absent])
    (root,) = [m for m in report["mismatches"] if m["role"] == "root"]
    assert (root["group"], root["entered"], root["absent"], root["gate"]) == (
        "dp_cp",
        [hang.entered],
        [hang.absent],
        {"cp": 0},
    )


def listening_ports(pid: int) -> set[int]:
    """The TCP ports (v4 and v6) on which process ``pid`` listens, from its socket fds and /proc/net/tcp*."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # TCP_LISTEN, owned by one of its fds
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def run_watching_ports(
    cmd: list[str], env: dict, cwd: str, timeout: float
) -> tuple[subprocess.CompletedProcess, set[int]]:
    """Run ``cmd``; its result, and every TCP port it listened on while it ran (sampled every 50 ms)."""
    seen: set[int] = set()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd) as proc:
        result: dict[str, str] = {}

        def drain() -> None:
            result["out"], result["err"] = proc.communicate(timeout=timeout)

        reader = threading.Thread(target=drain)
        reader.start()
        while reader.is_alive():
            seen |= listening_ports(proc.pid)
            reader.join(0.05)
    return subprocess.CompletedProcess(cmd, proc.returncode, result.get("out", ""), result.get("err", "")), seen


# The environment of the Ray clusters the tests start: no usage report; the dashboard's modules given five
# minutes to start instead of Ray's 30 s (a loaded 2-core machine was seen to miss it: "Module MetricsHead
# failed to start. Timeout after 30.0 seconds", and then no job server); and no idle workers started ahead of the
# first driver's tasks (Ray starts one per CPU, ~1 CPU-s each, and most were never used: the actors' runtime_env
# needs workers of their own). Workers still start for every task and stay idle after it, as on a user's cluster.
RAY_TEST_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "300",
    "RAY_prestart_worker_first_driver": "0",
    # Ray's own telemetry, which mtpdiag reads none of: each node's dashboard agent gathers every worker's process
    # stats every 5 s and records metrics every 5 s. Once a minute, an idle one-node head took 1.5 CPU-s in 30 s
    # instead of 2.6-3.0 (Ray 2.49, these 2-core machines).
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
    "METRICS_RECORD_INTERVAL_S": "60",
}

# What Ray's job server answers while its agent on the head is still starting (``ray start`` returns before it
# is up): the words mtpdiag's own capture job tries again on.
RAY_AGENT_NOT_READY = AGENT_NOT_READY


def submit_ray_job(argv: list[str], timeout: float = 180, **run: Any) -> subprocess.CompletedProcess:
    """``ray job submit`` (``argv``), tried again while the head's job agent is not up yet, as Ray asks."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **run)
        if done.returncode == 0 or RAY_AGENT_NOT_READY not in done.stdout + done.stderr:
            return done
        if time.monotonic() > deadline:
            return done
        time.sleep(2)
