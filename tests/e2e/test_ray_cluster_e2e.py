"""End to end on a real multi-node Ray cluster on one machine: ``--ray`` captures every node through Ray itself.

As verl runs on a cluster: a head node without GPUs runs the driver (``ray start --head`` and, in the same
session, ``examples/ray_verl/driver.py`` with verl's Hydra overrides), and two GPU nodes, B and C, each
started by ``ray start --address`` in a session of its own and with an address of its own, as other machines
would be, run the ranks. The driver places the four ``WorkerDict`` actors as verl's ``RayResourcePool`` does
(``trainer.nnodes=2``: one STRICT_PACK placement group per node): ranks 0 and 1 on B, 2 and 3 on C. They run
real megatron-core MTP loss code on gloo and hang (verl #5895, cp=2 pp=2). Nothing on B or C names the
parallel sizes: the layout can only come from the driver on the head, through the cluster. Every node carries
a Kubeflow-style ``RANK``/``WORLD_SIZE``, which every Ray process there inherits, the capture tasks' own
workers included; the actors carry a canary secret in their environment.

The failure cases come last, in order, because they take the cluster apart: a fourth node whose mtpdiag lacks
the Ray capture, node B's raylet frozen, node B killed (ranks 2 and 3, on C, wait on each other only, so they
stay hung as the ranks of a job that lost a node do).

Every Ray process is ended by session at the end (never ``ray stop``, which would end every Ray cluster on the
machine, other users' included), and the test checks that none is left.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import unavailable
from mtpdiag.capture import procfs
from support.jobs_e2e import (
    RAY_TEST_ENV,
    RAY_VERL_CP2_PP2,
    ROOT,
    check_ray_verl_hang,
    end_sessions,
    free_ports,
    run_cli,
    run_watching_ports,
    wait_until_quiet,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

DRIVER = os.path.join(ROOT, "examples", "ray_verl", "driver.py")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
HANG = RAY_VERL_CP2_PP2  # cp 2, pp 2 on four actors, two a node
WORLD = HANG.world
NODE_ENV = {"RANK": "0", "WORLD_SIZE": "1"}  # a Kubeflow pod's: the raylet and all it starts inherit it
CANARY = "cnry-raycluster-41d7-wandb"
OVERRIDES = HANG.overrides(nnodes=2)
# What a node that could not be captured may be told with, depending on when Ray noticed it was gone.
NODE_GONE = ("did not finish within", "could not be placed", "the node died", "dead node")


@dataclass
class Cluster:
    address: str
    jobs: str  # the head's job server (the dashboard), http://127.0.0.1:PORT
    sessions: set[int]
    driver: int
    actors: dict[int, int]  # rank -> pid
    node_of: dict[int, str]  # rank -> Ray node id
    raylets: dict[str, int]  # node id -> raylet pid, of the nodes that run ranks
    node_sessions: dict[str, int]  # node id -> the session of its raylet, agents and actors
    env: dict[str, str]
    tmp: Path
    ray_tmp: str

    def ranks_on(self, node: str) -> list[int]:
        return sorted(r for r, n in self.node_of.items() if n == node)

    @property
    def lost(self) -> str:
        """The node the destructive tests take down: ranks 0 and 1 (node B)."""
        return self.node_of[0]

    @property
    def kept(self) -> str:
        """The node whose ranks (2 and 3) wait on each other and stay hung (node C)."""
        return self.node_of[2]


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        unavailable("ray not installed (requirements-ci.txt pins ray[default]; bash scripts/test.sh installs it)")


def _wait_for(ready, what: str, timeout: float, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.25)
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-8:]) if log else ""
    raise AssertionError(f"no {what} within {timeout} s {tail}")


def _line(log: Path, prefix: str) -> str | None:
    return next((ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(prefix)), None)


def _start_node(cluster: Cluster, ip: str, log: Path, *extra: str, env: dict | None = None) -> int:
    """``ray start --address`` in a session of its own, with an address of its own (as another machine); the
    session's id.

    Ray keeps one node address per host, the last ``ray start``'s, and a driver joins the cluster through
    the node at that address. On real machines the host you run mtpdiag on keeps its own; here it is put
    back to the head's, so that mtpdiag joins through the head (and survives what the tests do to the others).
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*RAY, "start", f"--address={cluster.address}", f"--node-ip-address={ip}", "--disable-usage-stats", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or cluster.env,
            cwd="/",
            start_new_session=True,
        )
    assert proc.wait(timeout=180) == 0, log.read_text(errors="replace")[-2000:]
    cached = Path(cluster.ray_tmp) / "session_latest" / "node_ip_address.json"
    cached.write_text(json.dumps({"node_ip_address": cluster.address.rpartition(":")[0]}))
    return proc.pid


def _raylet_of_session(session: int) -> int:
    (raylet,) = [
        p
        for p in procfs.all_pids()
        if (s := procfs.read_stat(p)) is not None and s.session == session and s.comm == "raylet"
    ]
    return raylet


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    _require_ray()
    tmp = tmp_path_factory.mktemp("ray-cluster")
    # Ray's unix socket paths live under its temp dir and must stay under 108 bytes: pytest's is too long.
    ray_tmp = tempfile.mkdtemp(prefix="mtpd-rc-", dir="/tmp")
    port, dashboard = free_ports(2)
    # Both nodes' Ray workers import this checkout's mtpdiag (the capture task runs there).
    env = {
        **os.environ,
        **NODE_ENV,
        **RAY_TEST_ENV,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    }
    log = tmp / "head.log"
    head = (
        f'set -e\n"{sys.executable}" -m ray.scripts.scripts start --head --port={port} '
        f"--num-cpus=1 --num-gpus=0 --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port={dashboard} "
        f"--disable-usage-stats --temp-dir={ray_tmp}\n"
        f'echo "head started"\nexec "$@" --address 127.0.0.1:{port}\n'
    )
    driver = [sys.executable, DRIVER, *OVERRIDES, "--gate", "buggy", "--worker-env", f"WANDB_API_KEY={CANARY}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", head, "bash", *driver],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    state = Cluster(
        address="",
        jobs=f"http://127.0.0.1:{dashboard}",
        sessions={proc.pid},
        driver=proc.pid,
        actors={},
        node_of={},
        raylets={},
        node_sessions={},
        env=env,
        tmp=tmp,
        ray_tmp=ray_tmp,
    )
    try:
        _wait_for(lambda: _line(log, "head started") or proc.poll() is not None, "head node", 180, log)
        # The head's address as Ray gives it (the host's address: Ray replaces 127.0.0.1 with it).
        started = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        told = re.search(r"ray start --address='([^']+)'", started)
        assert told, f"the head did not start ({proc.poll()=}): {' | '.join(started.strip().splitlines()[-12:])}"
        state.address = told.group(1)
        for name, ip in (("b", "127.0.0.2"), ("c", "127.0.0.3")):
            state.sessions.add(_start_node(state, ip, tmp / f"node-{name}.log", "--num-cpus=3", "--num-gpus=2"))
        ready = _wait_for(lambda: _line(log, "ready pids="), "ready line from the driver", 300, log)
        fields = dict(item.split("=", 1) for item in ready.split() if "=" in item)
        state.actors = {int(r): int(p) for r, p in (i.split(":") for i in fields["pids"].split(","))}
        state.node_of = {int(r): n for r, n in (i.split(":") for i in fields["nodes"].split(","))}
        for rank, pid in state.actors.items():
            state.raylets[state.node_of[rank]] = raylet = procfs.read_stat(pid).ppid
            state.node_sessions[state.node_of[rank]] = procfs.read_stat(raylet).session
        wait_until_quiet(list(state.actors.values()))
        yield state
    finally:
        proc.send_signal(signal.SIGTERM)  # the driver disconnects; the nodes stay until their sessions end
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        left = end_sessions(state.sessions, set(state.actors.values()))
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not left, f"processes of the Ray cluster survived: {left}"


# ------------------------------------------------------------------------------------------ helpers


def _cli(_cluster: Cluster, *args: str, cwd: str = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    if cwd != ROOT:  # this source tree, where mtpdiag is not installed (the driver's path only, not the nodes')
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )
    assert CANARY not in done.stdout and CANARY not in done.stderr, args
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def _cli_watching_ports(_cluster: Cluster, *args: str) -> tuple[subprocess.CompletedProcess, set[int]]:
    """``_cli``, and the TCP ports the command listened on while it ran."""
    done, ports = run_watching_ports(
        [sys.executable, "-m", "mtpdiag", *args], env={**os.environ, "COLUMNS": "200"}, cwd=ROOT, timeout=400
    )
    assert CANARY not in done.stdout and CANARY not in done.stderr, args
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done, ports


def _ray_python_processes(cluster: Cluster) -> set[int]:
    return {p for r in cluster.raylets.values() for p in procfs.descendants(r) if procfs.is_python(p)}


def _check_full_diagnosis(report: dict, cluster: Cluster) -> None:
    # Every rank once, each with its own actor's pid: no capture task, agent, driver or TaskRunner among them.
    assert sorted((v["rank"], v["pid"]) for v in report["ranks"]) == sorted(cluster.actors.items())
    hosts = {v["rank"]: v["host"] for v in report["ranks"]}
    for rank, node in cluster.node_of.items():  # each node's label, made unique by its id on one machine
        assert node[:8] in hosts[rank], (rank, hosts)
    assert len(set(hosts.values())) == 2
    check_ray_verl_hang(report, HANG)


def _check_node_missing(report: dict, stderr: str, cluster: Cluster, node: str) -> None:
    """The other node's ranks were captured; this node's show as not captured, with the node and why."""
    gone = cluster.ranks_on(node)
    assert sorted(v["rank"] for v in report["ranks"]) == sorted(set(cluster.actors) - set(gone))
    # A finding when a captured rank waits on them; otherwise a note (a partial capture is normal).
    found = [f["ranks"] for f in report["findings"] if f["id"] == "missing-rank"]
    listed = f"ranks {gone[0]}, {gone[1]} not captured" in " ".join(report["notes"])
    assert found == [gone] or (not found and listed), (report["findings"], report["notes"])
    said = [ln for ln in stderr.splitlines() if node[:8] in ln]
    assert said and any(reason in ln for ln in said for reason in NODE_GONE), stderr
    assert any(node[:8] in note for note in report["notes"]), (node, report["notes"], stderr)


# ------------------------------------------------------------------------------------------ the cluster works


def test_the_ranks_are_spread_over_the_gpu_nodes_as_verl_spreads_them(cluster):
    """What the other tests rely on, checked on the live processes."""
    assert sorted(cluster.actors) == list(range(WORLD))
    assert cluster.ranks_on(cluster.lost) == [0, 1] and cluster.ranks_on(cluster.kept) == [2, 3]
    sessions = set(cluster.node_sessions.values())
    assert len(sessions) == 2 and cluster.driver not in sessions  # the driver runs on the head, with no rank
    for rank, pid in cluster.actors.items():
        assert procfs.read_stat(pid).comm == "ray::WorkerDict"
        assert procfs.read_stat(pid).ppid == cluster.raylets[cluster.node_of[rank]]
        environ = dict(e.partition(b"=")[::2] for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e)
        assert environ[b"RANK"] == str(rank).encode() and environ[b"WANDB_API_KEY"] == CANARY.encode()
    # No process of the rank nodes' sessions names a parallel size: the sizes are on the head only.
    for pid in (p for p in procfs.all_pids() if (s := procfs.read_stat(p)) and s.session in sessions):
        assert not any("parallel_size" in a for a in procfs.read_cmdline(pid) or []), pid
    # Beside the actors, each raylet runs Ray's own Python processes with the node's RANK: never ranks.
    others = _ray_python_processes(cluster) - set(cluster.actors.values())
    assert len(others) >= 2 and all((procfs.read_env(p) or {}).get("RANK") == "0" for p in others), others


def test_inspect_ray_diagnoses_both_nodes_with_the_layout_from_the_driver(cluster):
    before = _ray_python_processes(cluster)
    # the first capture on a fresh install starts a Ray worker and imports mtpdiag cold on each node: more than
    # the default 60 s on a loaded 2-core CI machine
    done, ports = _cli_watching_ports(cluster, "inspect", "--ray", cluster.address, "--json", "--ray-timeout", "240")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "warning" not in done.stderr, done.stderr
    _check_full_diagnosis(json.loads(done.stdout), cluster)
    # A Ray driver listens for its tasks' replies (docs/design.md: the one opt-in exception); the probe sees it.
    assert ports, "no listening port seen: the probe of the job-server test below would prove nothing"
    # Ray ends the driver's job, and with it the workers that ran the capture tasks: nothing of ours stays.
    _wait_for(lambda: _ray_python_processes(cluster) <= before, "end of the capture tasks' workers", 60)


def test_inspect_ray_auto_finds_the_cluster_from_ray_address_and_prints_the_console_report(cluster):
    # --ray-timeout as the other captures here: CI-47's loaded run took more than the default 60 s for one node's
    # capture task, and said so in one line ("did not finish within 60 s ... --ray-timeout gives it longer")
    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "inspect", "--ray", "--ray-timeout", "240"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "COLUMNS": "200", "RAY_ADDRESS": cluster.address},
    )
    assert CANARY not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stdout.startswith(
        "PROBLEM: MTP loss all_reduce on the DP×CP group [2, 3] entered only by cp == 0 ranks (rank 2)"
    ), done.stdout[:600]
    assert "layout: tp=1 cp=2 ep=1 dp=1 pp=2 from command line" in done.stdout


def test_collect_ray_writes_one_bundle_that_analyze_reads(cluster, tmp_path):
    out = tmp_path / "bundles"
    out.mkdir()
    done = _cli(cluster, "collect", "--ray", cluster.address, "--out", str(out), "--ray-timeout", "240")
    assert done.returncode == 0, done.stderr[-3000:]
    (bundle,) = list(out.iterdir())
    assert bundle.name == f"ray-{socket.gethostname()}.mtpdiag.json"  # named for the node it joined through
    assert CANARY.encode() not in bundle.read_bytes()
    data = json.loads(bundle.read_text())
    # Node B's ranks carry the driver's sizes too, though nothing on node B names them.
    hints = {c["rank"]: c["layout_hints"] for c in data["captures"]}
    assert all(hints[r].get("cp") == 2 and hints[r].get("pp") == 2 for r in range(WORLD)), hints
    assert data.get("errors", []) == []  # a bundle leaves out fields at their default
    analyzed = run_cli("analyze", str(bundle), "--json")
    assert analyzed.returncode == 1, analyzed.stderr[-2000:]
    _check_full_diagnosis(json.loads(analyzed.stdout), cluster)


def test_watch_ray_calls_the_hang_and_saves_its_bundle(cluster, tmp_path):
    done = _cli(
        cluster,
        "watch",
        "--ray",
        cluster.address,
        "--interval",
        "1",
        "--stall",
        "3",
        "--duration",
        "120",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["progress"]["hang"] is True
    _check_full_diagnosis(report, cluster)
    (bundle,) = list(tmp_path.glob("mtpdiag-hang-*.json"))
    assert CANARY.encode() not in bundle.read_bytes()


def test_inspect_and_collect_through_the_job_server_open_no_port(cluster, tmp_path):
    """``--ray http://HEAD:8265``: the capture runs as a Ray job on the head; this side is an HTTP client only."""
    done, ports = _cli_watching_ports(cluster, "inspect", "--ray", cluster.jobs, "--json", "--ray-timeout", "240")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "warning" not in done.stderr, done.stderr
    _check_full_diagnosis(json.loads(done.stdout), cluster)
    assert ports == set(), ports
    # as inspect's: each capture job starts new Ray workers, which import mtpdiag cold (CI-18: over 60 s on a node)
    collected, ports = _cli_watching_ports(
        cluster, "collect", "--ray", cluster.jobs, "--out", str(tmp_path), "--ray-timeout", "240"
    )
    assert collected.returncode == 0 and ports == set(), (collected.stderr[-3000:], ports)
    (bundle,) = tmp_path.iterdir()
    assert sorted(c["rank"] for c in json.loads(bundle.read_text())["captures"]) == list(range(WORLD))
    # The capture jobs' logs on the head hold their replies, with no more than a bundle holds.
    logs = list(Path(cluster.ray_tmp).glob("session_latest/logs/job-driver-mtpdiag-capture-*.log"))
    assert len(logs) == 2 and not any(CANARY.encode() in log.read_bytes() for log in logs), logs


def test_watch_refuses_a_job_server_before_connecting():
    done = run_cli("watch", "--ray", "http://127.0.0.1:9", "--duration", "1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "needs a driver's connection" in done.stderr and "http://127.0.0.1:9" in done.stderr, done.stderr


def test_without_ray_nothing_imports_ray_and_the_local_capture_still_works(cluster):
    script = (
        "import sys\nfrom mtpdiag.cli import main\n"
        f"sys.argv = ['mtpdiag', 'inspect', '--pid', '{cluster.raylets[cluster.kept]}', '--json']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print(f'ray-imported={\"ray\" in sys.modules} code={code}', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.stderr.strip().splitlines()[-1] == "ray-imported=False code=1", done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert sorted(v["rank"] for v in report["ranks"]) == cluster.ranks_on(cluster.kept)


@pytest.mark.parametrize("command", ["inspect", "watch", "collect"])
def test_without_ray_installed_ray_is_one_line_naming_the_extra(command, tmp_path):
    script = (
        "import sys\nsys.modules['ray'] = None  # what Python does when ray is not installed\n"
        "from mtpdiag.cli import main\n"
        f"sys.argv = ['mtpdiag', '{command}', '--ray'] + {['--out', str(tmp_path)] if command == 'collect' else []}\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "pip install 'mtpdiag[ray]'" in done.stderr, done.stderr


def test_a_node_without_py_spy_says_what_to_install(tmp_path):
    """The capture task's own answer on a node whose Python has no py-spy beside it nor on PATH (run here, as a
    Ray worker of that node would run it: its interpreter is a link in a directory without py-spy)."""
    python = tmp_path / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    code = "from mtpdiag.capture.ray_node import capture_node; print(capture_node({'label': 'n'})['failure'])"
    done = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
        env={"PATH": str(tmp_path / "nothing"), "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "py-spy not found on PATH (pip install py-spy)"


# ----------------------------------------------------------------------------------------- failures (destructive, last)


def test_a_node_whose_mtpdiag_lacks_the_ray_capture_is_one_line_and_the_rest_is_diagnosed(cluster, tmp_path):
    """Node D runs an mtpdiag without ``capture.ray_node`` (an old release first on its Ray workers' path).

    The old release has a ``capture`` package, as every release has: an ``mtpdiag`` without one would let
    setuptools' editable finder (when this mtpdiag is installed with ``pip install -e``) resolve
    ``mtpdiag.capture`` from the new source tree, and node D would not be old at all.
    """
    old = tmp_path / "old-mtpdiag"
    (old / "mtpdiag" / "capture").mkdir(parents=True)
    (old / "mtpdiag" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (old / "mtpdiag" / "capture" / "__init__.py").write_text('"""Live capture, before --ray."""\n')
    env = {**cluster.env, "PYTHONPATH": str(old)}
    session = _start_node(cluster, "127.0.0.4", cluster.tmp / "node-d.log", "--num-cpus=0", env=env)
    cluster.sessions.add(session)
    node_d = _raylet_of_session(session)
    try:
        # From a directory without mtpdiag: Ray puts the driver's working directory on its workers' path.
        # --ray-timeout as the other captures here: CI-68's loaded run took more than the default 60 s for a GPU
        # node's capture task (the test took 65 s; ranks 2 and 3 not captured). Node D's task fails at once.
        inspect = ("inspect", "--ray", cluster.address, "--json", "--ray-timeout", "240")
        done = _cli(cluster, *inspect, cwd=str(tmp_path))
        assert done.returncode == 1 and done.stdout, done.stderr[-3000:]
        _check_full_diagnosis(json.loads(done.stdout), cluster)
        warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("mtpdiag: warning: node ")]
        assert len(warnings) == 1, done.stderr
        assert "No module named 'mtpdiag.capture.ray_node'" in warnings[0], warnings[0]
        assert "pip install 'mtpdiag==" in warnings[0]
    finally:
        assert end_sessions({session}, {node_d}) == []
        cluster.sessions.discard(session)


def test_a_node_whose_raylet_is_frozen_shows_its_ranks_as_not_captured(cluster):
    raylet = cluster.raylets[cluster.lost]
    os.kill(raylet, signal.SIGSTOP)
    try:
        # The frozen node's task never ends, so the capture lasts the whole --ray-timeout, and the other node's
        # task must end within it: 20 s (8 until now, which a loaded node's task start and py-spy could exceed).
        done = _cli(cluster, "inspect", "--ray", cluster.address, "--ray-timeout", "20", "--json")
    finally:
        os.kill(raylet, signal.SIGCONT)
    assert done.returncode == 1 and done.stdout, done.stderr[-3000:]
    _check_node_missing(json.loads(done.stdout), done.stderr, cluster, cluster.lost)


def test_a_killed_node_shows_its_ranks_as_not_captured(cluster):
    """The GCS lists the node alive for ~30 s after its raylet died; mtpdiag finds the raylet's port refused and
    says so at once, rather than sending it a task that Ray's threads retry at full CPU (a core for 15 s, seen)."""
    assert end_sessions({cluster.node_sessions[cluster.lost]}, {cluster.raylets[cluster.lost]}) == []
    done = _cli(cluster, "inspect", "--ray", cluster.address, "--ray-timeout", "30", "--json")
    assert done.returncode == 1 and done.stdout, done.stderr[-3000:]
    report = json.loads(done.stdout)
    _check_node_missing(report, done.stderr, cluster, cluster.lost)
    listed_dead = any("the cluster lists dead node" in note for note in report["notes"])  # the GCS was quicker
    assert listed_dead or "its raylet refuses connections at 127.0.0." in done.stderr, done.stderr[-3000:]
