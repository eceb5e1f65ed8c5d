"""``--ray``: the job drivers from Ray's own records, for the layout their command lines name (#20).

verl's workers carry no sizes on their command lines; their driver does. A node's capture task finds drivers by
process relationships (``capture._HintReader``), which miss a driver started from another session than the one
that ran ``ray start`` (a second terminal, a Slurm step) or on another node. The cluster's GCS lists every job's
driver: its pid, its node's address and its entrypoint (the driver's command line, as Ray 2.49 records it). The driver
side (``ray_cluster``) reads that table and reduces each entrypoint to sizes at once; each node's capture task
gets the pids of the drivers on its node and reduces their command lines to sizes there. Argv never leaves.

Nothing here imports Ray: ``read_job_table`` is handed the connected ray module.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from mtpdiag.capture import procfs
from mtpdiag.layout import cmdline

# A job's StartTime is when its driver connected, after the process started; /proc's start time is whole seconds.
START_SLACK_S = 2.0
CLIENT_TABLE_TIMEOUT_S = 60.0
NOT_READ = "Ray's job table could not be read"
ON_THE_NODES = "the layout is looked for on the nodes only"


@dataclasses.dataclass(frozen=True)
class JobDriver:
    """One alive job's driver, as the GCS lists it: where it runs, and the sizes its entrypoint names."""

    job_id: str
    ip: str
    pid: int
    started_s: float  # the job's start, seconds since the epoch (0 when the GCS gave none)
    entrypoint_hints: dict[str, int]


def job_drivers(ray: Any, *, client: bool = False) -> tuple[list[JobDriver], list[str]]:
    """The drivers of the cluster's alive jobs but this connection's own, and a note when Ray cannot list them.

    A Ray Client connection (``ray://``, ``client``) has no GCS connection in this process: a task on the cluster
    reads the table there and hands back the drivers alone (``drivers_on_cluster``), never an entrypoint."""
    own = own_job_id(ray)
    if not client:
        rows, note = read_job_table(ray)
        return alive_drivers(rows, own), [note] if note else []
    try:
        task = ray.remote(drivers_on_cluster).options(num_cpus=0, max_retries=0, name="mtpdiag-job-table")
        found, note = ray.get(task.remote(own), timeout=CLIENT_TABLE_TIMEOUT_S)
        return [JobDriver(*fields) for fields in found], [note] if note else []
    except Exception as exc:  # the task failed, timed out, or answered in another shape (another mtpdiag there)
        return [], [f"{NOT_READ} ({type(exc).__name__}): {ON_THE_NODES}"]


def drivers_on_cluster(own_job: str) -> tuple[list[tuple[Any, ...]], str | None]:
    """Run as a task (a Ray worker has imported Ray and is connected to the GCS): ``alive_drivers`` there, as
    plain tuples, and ``read_job_table``'s note."""
    rows, note = read_job_table(sys.modules["ray"])
    return [dataclasses.astuple(d) for d in alive_drivers(rows, own_job)], note


def read_job_table(ray: Any) -> tuple[list[Mapping[str, Any]], str | None]:
    """The GCS's job table rows (``ray._private.state.jobs()``, which Ray does not promise to keep), and a note
    when they cannot be read: this Ray lacks the call, or this process is not connected to the GCS."""
    try:
        rows = ray._private.state.jobs()
    except Exception as exc:  # ImportError/AttributeError in another Ray, RaySystemError when not connected
        return [], f"{NOT_READ} ({type(exc).__name__}): {ON_THE_NODES}"
    if not isinstance(rows, list):
        return [], f"{NOT_READ} (not a list in this Ray): {ON_THE_NODES}"
    return [row for row in rows if isinstance(row, Mapping)], None


def own_job_id(ray: Any) -> str:
    """This connection's own job id (hex), never a job whose layout is wanted; "" when Ray does not say."""
    try:
        return str(ray.get_runtime_context().get_job_id() or "")
    except Exception:  # an older or a client runtime context
        return ""


def alive_drivers(rows: Iterable[Mapping[str, Any]], own_job: str) -> list[JobDriver]:
    """The drivers of the jobs that run, but mtpdiag's own; each entrypoint is reduced to its sizes here."""
    drivers = []
    for row in rows:
        job_id = str(row.get("JobID") or "")
        pid = _positive_int(row.get("DriverPid"))
        if row.get("IsDead", True) or not job_id or job_id == own_job or pid is None:
            continue
        drivers.append(
            JobDriver(
                job_id=job_id,
                ip=str(row.get("DriverIPAddress") or ""),
                pid=pid,
                started_s=(_positive_int(row.get("StartTime")) or 0) / 1000.0,
                entrypoint_hints=entrypoint_hints(str(row.get("Entrypoint") or "")),
            )
        )
    return sorted(drivers, key=lambda d: (d.started_s, d.job_id))


def entrypoint_hints(entrypoint: str) -> dict[str, int]:
    """The sizes a job's entrypoint names. Ray joins the driver's argv with ``subprocess.list2cmdline`` (and
    prefixes an interactive shell's); shell words read it back, and whitespace where its quotes do not parse."""
    try:
        argv = shlex.split(entrypoint)
    except ValueError:  # an unbalanced quote
        argv = entrypoint.split()
    return cmdline.layout_hints(argv)


def drivers_by_ip(drivers: Iterable[JobDriver]) -> dict[str, list[list[float]]]:
    """The [pid, job start] pairs of the drivers that run at each node address (``Node.ip``)."""
    out: dict[str, list[list[float]]] = {}
    for driver in drivers:
        if driver.ip:
            out.setdefault(driver.ip, []).append([driver.pid, driver.started_s])
    return out


def merged_entrypoint_hints(drivers: Iterable[JobDriver]) -> dict[str, int]:
    """Every alive driver's entrypoint sizes, the earliest job's first."""
    return cmdline.merge_hints(*(d.entrypoint_hints for d in drivers))


def node_driver_hints(drivers: Iterable[Iterable[float]], exclude: Collection[int] = ()) -> dict[str, int]:
    """On the drivers' node (the capture task): the sizes on the command lines of the listed drivers that still
    run. A pid whose process started after its job did is a later process that reuses it, and is not read."""
    sources = []
    for pid_value, job_started in drivers:
        pid = int(pid_value)
        started = procfs.start_time(pid)
        if pid in exclude or started is None or (job_started and started > job_started + START_SLACK_S):
            continue
        sources.append(cmdline.layout_hints(procfs.read_cmdline(pid) or []))
    return cmdline.merge_hints(*sources)


def _positive_int(value: object) -> int | None:
    """An int the GCS gave (a pid, a time in ms), else None for 0, a negative or a non-number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 0 else None
