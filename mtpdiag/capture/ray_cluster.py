"""``--ray``: capture every node of a Ray cluster through Ray itself, with no pdsh and no shared filesystem.

The driver's side. ``RayCluster`` connects to the cluster as a Ray driver and lists its alive nodes; ``capture``
runs ``ray_node.capture_node`` on each of them as a task pinned there with a hard node-affinity strategy and no
CPU (a hung job holds every CPU it asked for), and waits for the replies up to one deadline. Each reply is a
node's bundle and travels through Ray's object store; the bundles are read and merged as ``analyze`` reads and
merges bundle files (``inputs.bundle``, ``inputs.merge``). A node whose task failed, timed out or could not be
placed is one line naming the node and why (mtpdiag or py-spy missing there: what to install); the nodes that
answered still make the result.

Ray is imported here only, and this module only with ``--ray``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mtpdiag
from mtpdiag.capture import own_lineage
from mtpdiag.capture.cluster_progress import ClusterProgress
from mtpdiag.capture.ray_address import answers, client_server, keep_loopback, refusing
from mtpdiag.capture.ray_jobs import drivers_by_ip, job_drivers, merged_entrypoint_hints
from mtpdiag.capture.ray_node import capture_node, identify
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures
from mtpdiag.inputs.bundle import snapshot_from_data
from mtpdiag.inputs.merge import check_world_sizes, merge
from mtpdiag.layout import cmdline
from mtpdiag.model import Snapshot, printable, replace

INSTALL_RAY = "pip install 'mtpdiag[ray]'"
CLIENT_ATTEMPTS = 3  # ray:// connections, see RayCluster._init
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Python's words for a missing module: quoted since 3.3, bare after ``python -m`` ("No module named mtpdiag")
_NO_MODULE = re.compile(r"No module named '?([\w.]+)")
_MTPDIAG_FRAME = re.compile(r'File "[^"]*/mtpdiag/[^"]*\.py"')


@dataclass(frozen=True)
class Node:
    """One node of the cluster, as its GCS lists it."""

    id: str
    ip: str
    hostname: str
    label: str  # the host name its captures carry: the hostname, made unique with the node id where it is not
    alive: bool = True
    death: str = ""
    raylet_port: int = 0  # the node manager's port (0: not listed)

    def describe(self) -> str:
        short = self.id[:8]
        return f"{self.label} ({self.ip})" if short in self.label else f"{self.label} ({self.ip}, node {short})"


@dataclass(frozen=True)
class ClusterCapture:
    """The merged snapshot of every node that answered, and one line per node that did not."""

    snapshot: Snapshot
    nodes: tuple[Node, ...]
    failed: tuple[str, ...] = ()  # "node X (ip, node id): why", one per node not captured (and dead nodes)
    notes: tuple[str, ...] = ()


class RayCluster:
    """A driver's connection to a Ray cluster (``address``: ``auto``, ``HOST:PORT`` or ``ray://…``)."""

    def __init__(self, address: str, timeout: float = 60.0) -> None:
        keep_loopback(address)  # before Ray reads its environment (ray_address)
        self.ray = import_ray()
        self.address = address
        self.timeout = timeout
        # While connected, Ray prints the cluster's error messages (a node marked dead, ...) on sys.stdout:
        # they go to stderr, so that stdout holds the report alone (--json) once this connection is closed.
        self._stdout, sys.stdout = sys.stdout, sys.stderr
        try:
            # ray.init retries a GCS address nothing answers at for ever, and a ray:// one for 30 s a try
            answers(client_server(address) if address.startswith("ray://") else gcs_address(address))
            self._init()
        except Exception as exc:  # ConnectionError (no cluster there), ValueError (a bad address), RuntimeError
            sys.stdout = self._stdout
            raise InputError(f"cannot connect to the Ray cluster at {address}: {one_line(exc)}") from None
        self._remote = self.ray.remote(capture_node)
        self.progress: ClusterProgress | None = None  # watch's Flight Recorder signal, once asked for
        self._driver_node = self.ray.get_runtime_context().get_node_id()
        # This process and its ancestors (below a raylet) run on the driver's node: never a rank or a layout hint.
        self._driver = identify(own_lineage())

    def _init(self) -> None:
        """``ray.init``. Ray Client (``ray://``) starts a server process on the head for each connection, and on
        a loaded head that start fails now and then ("Initialization failure from server"), or the server,
        which accepted the connection (``answers``), has not answered within Ray's 30 s ("ray client
        connection timeout", CI-23): tried again."""
        for attempt in range(1, CLIENT_ATTEMPTS + 1):
            try:
                self.ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
                return
            except ConnectionError as exc:  # ConnectionAbortedError is one
                if not self.address.startswith("ray://") or attempt == CLIENT_ATTEMPTS:
                    raise
                print(
                    f"mtpdiag: note: the Ray Client server at {self.address} could not start this connection "
                    f"({one_line(exc)}): trying again ({attempt + 1} of {CLIENT_ATTEMPTS})",
                    file=sys.stderr,
                )
                time.sleep(1.0)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect; Ray ends this driver's job, and with it the workers that ran its capture tasks."""
        if self.ray.is_initialized():
            self.ray.shutdown()
        sys.stdout = self._stdout

    def nodes(self) -> list[Node]:
        """Every node the cluster's GCS lists, alive ones first (the driver's own node first among them)."""
        listed = sorted(
            self.ray.nodes(),
            key=lambda n: (
                not n.get("Alive"),
                n.get("NodeID") != self._driver_node,
                n.get("NodeManagerAddress", ""),
                n.get("NodeID", ""),
            ),
        )
        names = [str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "unknown") for n in listed]
        alive = [name for name, n in zip(names, listed, strict=True) if n.get("Alive")]
        return [
            Node(
                id=str(n["NodeID"]),
                ip=str(n.get("NodeManagerAddress", "")),
                hostname=name,
                label=printable(name if alive.count(name) <= 1 else f"{name}/{str(n['NodeID'])[:8]}"),
                alive=bool(n.get("Alive")),
                death=printable(str(n.get("DeathReasonMessage") or "")),
                raylet_port=int(n.get("NodeManagerPort") or 0),
            )
            for name, n in zip(names, listed, strict=True)
        ]

    def track_progress(self) -> ClusterProgress:
        """From now on every capture also polls the ranks' Flight Recorder progress (``watch``)."""
        if self.progress is None:
            self.progress = ClusterProgress()
        return self.progress

    def capture(self, **options: Any) -> ClusterCapture:
        """Every alive node's ranks, merged; ``options`` as ``ray_node.capture_node`` takes them."""
        nodes = self.nodes()
        alive = [n for n in nodes if n.alive]
        if self.progress is not None:
            options["fr_progress"] = self.progress.state
        drivers, notes = job_drivers(self.ray, client=self.address.startswith("ray://"))  # Ray's job table
        replies, failed = self._run(alive, {"mode": "stacks", **options}, drivers_by_ip(drivers))
        if self.progress is not None:
            self.progress.update(replies.values())
        loaded, driver_hints, hints = [], [], []
        for node in alive:
            reply = replies.get(node.id)
            if reply is None:
                continue
            driver_hints.append(reply.get("driver_hints") or {})
            hints.append(reply.get("hints") or {})
            notes += [f"node {node.describe()}: {printable(str(n))}" for n in reply.get("notes") or ()]
            if reply.get("unreadable"):
                notes.append(
                    f"node {node.describe()}: the environment of {reply['unreadable']} process(es) "
                    "below the raylet could not be read (run mtpdiag as the job's user or as root)"
                )
            if reply.get("bundle") is not None:
                loaded.append(_node_captures(node, reply["bundle"]))
        check_world_sizes(loaded)
        _check_one_node_per_rank(loaded)
        snapshot = with_hints(
            merge(loaded, []), cmdline.merge_hints(*driver_hints, merged_entrypoint_hints(drivers), *hints)
        )
        # Named for the cluster, by the node mtpdiag joined it through (a bundle's file name, --out DIR).
        snapshot = replace(snapshot, host=f"ray-{alive[0].hostname}" if alive else "ray")
        failed += _dead_nodes_note(nodes, snapshot)
        snapshot = replace(snapshot, errors=(*snapshot.errors, *failed))
        return ClusterCapture(snapshot=snapshot, nodes=tuple(alive), failed=tuple(failed), notes=tuple(notes))

    def cpu(self) -> tuple[dict[tuple[str, int], int | None], tuple[str, ...]]:
        """(node id, pid) -> main-thread CPU ns of every rank in the cluster (``watch``), and the nodes that failed."""
        alive = [n for n in self.nodes() if n.alive]
        replies, failed = self._run(alive, {"mode": "cpu"})
        readings = {
            (node_id, int(pid)): ns
            for node_id, reply in replies.items()
            for pid, ns in (reply.get("cpu") or {}).items()
        }
        return readings, tuple(failed)

    def _run(
        self, nodes: list[Node], request: dict[str, Any], drivers: Mapping[str, list[list[float]]] | None = None
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Run the capture task on every node at once, each given the job drivers at its address; the replies by
        node id (each the task's raw dict, as Ray returned it), and a line per node that failed."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # A dead raylet is listed alive until the GCS's health checks fail (~30 s), while a task sent there keeps this
        # driver's Ray threads retrying at full CPU. Not through Ray Client: its clients need not reach the nodes.
        client = self.address.startswith("ray://")
        down = set() if client else refusing((n.ip, n.raylet_port) for n in nodes if n.raylet_port)
        failures = {
            n.id: f"node {n.describe()}: its raylet refuses connections at {n.ip}:{n.raylet_port} (the node died; Ray "
            "marks it dead once its health checks fail)"
            for n in nodes
            if (n.ip, n.raylet_port) in down
        }
        asked = [n for n in nodes if n.id not in failures]
        refs = []
        for node in asked:
            exclude = self._driver if node.id == self._driver_node else []
            here = (drivers or {}).get(node.ip, [])  # the job drivers Ray's job table places at its address
            strategy = NodeAffinitySchedulingStrategy(node_id=node.id, soft=False)
            try:
                refs.append(
                    self._remote.options(
                        scheduling_strategy=strategy,
                        num_cpus=0,
                        max_retries=0,
                        name="mtpdiag-capture",
                    ).remote({**request, "label": node.label, "exclude": exclude, "drivers": here})
                )
            except Exception as exc:  # a ray:// client server that cannot import mtpdiag fails here, not in a task
                raise InputError(
                    f"cannot submit the capture tasks to the Ray cluster at {self.address}: {why_failed(exc, self.ray)}"
                ) from None
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=self.timeout) if refs else ([], [])
        replies: dict[str, dict[str, Any]] = {}
        for node, ref in zip(asked, refs, strict=True):
            why, reply = None, None
            if ref not in ready:
                self.ray.cancel(ref, force=True)  # still queued, or stuck: end its worker
                why = (
                    f"the capture task did not finish within {self.timeout:g} s (the node is overloaded or "
                    "its raylet hangs; --ray-timeout gives it longer)"
                )
            else:
                try:
                    reply = self.ray.get(ref)
                except Exception as exc:  # the task's failure, as Ray raises it on the driver
                    why = why_failed(exc, self.ray)
            if why is None and not isinstance(reply, Mapping):
                why = (
                    f"the capture task answered {type(reply).__name__}, not a reply (mtpdiag there differs "
                    f"from this one: pip install 'mtpdiag=={mtpdiag.__version__}')"
                )
            elif why is None and isinstance(reply, Mapping) and reply.get("failure"):
                why = printable(str(reply["failure"]))
            if why is None and isinstance(reply, Mapping):
                replies[node.id] = dict(reply)
            else:
                failures[node.id] = f"node {node.describe()}: {why}"
        return replies, [failures[n.id] for n in nodes if n.id in failures]  # in the nodes' order


def import_ray() -> Any:
    """The ray module, or one line naming the extra that brings it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a diagnosis reports nothing to anyone
    try:
        import ray
    except ImportError as exc:
        raise InputError(f"--ray needs Ray, which this Python cannot import ({exc}): {INSTALL_RAY}") from None
    return ray


def gcs_address(address: str) -> str:
    """``HOST:PORT`` of the cluster's GCS: ``auto`` is RAY_ADDRESS, else the cluster ``ray start`` last started
    here (Ray's own lookup); ConnectionError when there is none."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return canonicalize_bootstrap_address_or_die(address)
    except ConnectionError:
        if address != "auto":
            raise
        raise ConnectionError("no Ray cluster runs here and RAY_ADDRESS is not set (give --ray HOST:PORT)") from None


def why_failed(exc: BaseException, ray: Any) -> str:
    """Why a node's capture task failed, in one line, with what to do about it."""
    errors = ray.exceptions
    missing = missing_mtpdiag(str(exc))
    if missing:
        return (
            f"mtpdiag cannot run there (No module named '{missing}'): pip install "
            f"'mtpdiag=={mtpdiag.__version__}' into the Python that the node's Ray workers run"
        )
    if isinstance(exc, errors.TaskUnschedulableError):
        return f"the capture task could not be placed on it ({one_line(exc)})"
    if isinstance(exc, (errors.NodeDiedError, errors.LocalRayletDiedError)):
        return f"the node died during the capture ({one_line(exc)})"
    if isinstance(exc, errors.WorkerCrashedError):
        return "the capture task's worker died before it answered"
    if isinstance(exc, errors.RuntimeEnvSetupError):
        return f"the capture task's runtime environment could not be set up ({one_line(exc)})"
    if isinstance(exc, errors.RayTaskError):
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
        what = f"{type(cause).__name__}: {one_line(cause)}" if cause is not None else one_line(exc)
        return f"the capture task failed ({what})"
    return f"the capture task failed ({type(exc).__name__}: {one_line(exc)})"


def one_line(exc: BaseException) -> str:
    """The last meaningful line of an exception's text, bounded."""
    return last_line(str(exc))


def last_line(text: str) -> str:
    """The last meaningful line of a text that may hold a traceback and colour codes (Ray's errors, a Ray
    job's log), bounded; "" for a text without one."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("ray::", "Traceback", "File ", "^"))] or lines or [""]
    return printable(lines[-1])[:300]


def missing_mtpdiag(text: str) -> str | None:
    """The mtpdiag module that a text (an error, a log) says Python could not import, else None."""
    text = _ANSI.sub("", text)
    for found in _NO_MODULE.finditer(text):
        if found.group(1).split(".")[0] == "mtpdiag":
            return found.group(1)
    return None


def missing_dependency(text: str) -> str | None:
    """The module that a traceback in a text (an error, a log) says mtpdiag's own code could not import (one of
    its dependencies), else None."""
    text = _ANSI.sub("", text)
    found = _NO_MODULE.findall(text)
    return found[-1] if found and _MTPDIAG_FRAME.search(text) else None


def with_hints(snapshot: Snapshot, hints: dict[str, int]) -> Snapshot:
    """Every capture with the job drivers' sizes after its own: a node without the driver has none of its own."""
    if not hints:
        return snapshot
    captures = tuple(
        replace(c, layout_hints=dict(sorted(cmdline.merge_hints(dict(c.layout_hints), hints).items())))
        for c in snapshot.captures
    )
    return replace(snapshot, captures=captures)


def _node_captures(node: Node, bundle: Any) -> FileCaptures:
    """A node's reply read as ``analyze`` reads a bundle file; each capture's source names the node."""
    where = f"ray node {node.describe()}"
    if isinstance(bundle, dict):
        for item in bundle.get("captures") or ():
            if isinstance(item, dict):
                item["source"] = where
    snapshot = snapshot_from_data(bundle, where)
    return FileCaptures(where, snapshot.captures, snapshot, form="bundle")


def _check_one_node_per_rank(loaded: list[FileCaptures]) -> None:
    """A rank on two nodes means two jobs that both set RANK: their diagnosis would mix them up."""
    owner: dict[int, FileCaptures] = {}
    for item in loaded:
        for c in item.captures:
            if c.rank is None:
                continue
            first = owner.setdefault(c.rank, item)
            if first is not item:
                raise InputError(
                    f"rank {c.rank} runs on two nodes ({first.path.removeprefix('ray node ')} and "
                    f"{item.path.removeprefix('ray node ')}): the cluster runs more than one ranked job"
                )


def _dead_nodes_note(nodes: list[Node], snapshot: Snapshot) -> list[str]:
    """When ranks are missing, the nodes the cluster lists as dead may be where they ran."""
    dead = [n for n in nodes if not n.alive]
    world = snapshot.world_sizes[-1] if snapshot.world_sizes else None
    captured = {c.rank for c in snapshot.captures if c.rank is not None}
    if not dead or world is None or len(captured) >= world:
        return []
    first = dead[0]
    why = f": {first.death}" if first.death else ""
    more = f" and {len(dead) - 1} more" if len(dead) > 1 else ""
    return [
        f"{world - len(captured)} of {world} ranks were on no node that answered; the cluster lists dead "
        f"node {first.describe()}{why}{more}"
    ]
