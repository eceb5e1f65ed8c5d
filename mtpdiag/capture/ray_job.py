"""``--ray http://HEAD:8265``: the cluster capture run as a Ray job, submitted through the head's job server.

``ray_cluster`` joins the cluster as a Ray driver, and a Ray driver listens on a port of its own for the replies
of its tasks. Here this process is only an HTTP client of the dashboard's job API, as ``ray job submit`` is, and
opens no port: it submits ``python -m mtpdiag.capture.ray_job`` as a job, which runs on the head as one more
driver of the cluster, captures every node exactly as ``--ray auto`` does there, and prints its result as one
line of the job's log. This side reads that line from the log and stops the job if it overruns. It is how a
cluster is reached from outside it (KubeRay: ``kubectl port-forward svc/HEAD-svc 8265``).

The job's Python is the one Ray runs its workers with (the raylet's ``--python_worker_command``, a venv's
Python where Ray runs from one), so mtpdiag must be installed there, as on every node. Its log, on the head,
holds what a bundle holds and nothing more.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from dataclasses import asdict
from typing import Any

from mtpdiag.capture.ray_cluster import (
    INSTALL_RAY,
    ClusterCapture,
    Node,
    import_ray,
    last_line,
    missing_dependency,
    missing_mtpdiag,
    one_line,
)
from mtpdiag.errors import InputError, MtpdiagError, NothingCaptured
from mtpdiag.model import printable

REPLY = "mtpdiag-ray-job-reply "  # the prefix of the job's one line of result in its log
START_S = 120.0  # how long the job may take beyond --ray-timeout: scheduling, start-up, joining the cluster
POLL_S = 0.5
# What the job server answers while its agent on the head is still starting (Ray says: try again later).
AGENT_NOT_READY = "No available agent to submit job"
# The job runs in the Python that Ray runs its workers with: the raylet's --python_worker_command (Ray's own
# sys.executable). The job supervisor's /proc/PID/exe is not it: in a venv it resolves to the base interpreter,
# which has neither mtpdiag nor its dependencies, and Ray rewrites its workers' argv. So the supervisor's
# interpreter (any Python) runs this stdlib-only step, which finds the raylet above it and executes that Python.
WORKER_PYTHON = """
import os, shlex, sys
def worker_python(pid):
    for _ in range(4):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            stat = open(f"/proc/{pid}/stat", "rb").read()
        except OSError:
            break
        for arg in argv:
            if arg.startswith(b"--python_worker_command="):
                return shlex.split(arg.split(b"=", 1)[1].decode())[0]
        pid = int(stat.rsplit(b")", 1)[1].split()[1])
    return sys.executable
python = worker_python(os.getppid())
os.execv(python, [python, "-m", "mtpdiag.capture.ray_job", *sys.argv[1:]])
"""
# sh -c runs the entrypoint; its parent is the job supervisor, a Ray worker.
ENTRYPOINT = '"$(readlink /proc/$PPID/exe)" -c {bootstrap} {request}'


def job_server(address: str) -> str | None:
    """The job server's URL when ``--ray ADDRESS`` names one (``http(s)://``, or ``auto`` with such a
    RAY_ADDRESS, as ``ray job submit`` reads it); None for a driver connection."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
    return address if address.startswith(("http://", "https://")) else None


class RayJobCluster:
    """The cluster behind a Ray job server: ``capture`` as ``RayCluster.capture``, run as a job on the head."""

    def __init__(self, address: str, timeout: float = 60.0) -> None:
        import_ray()  # the one-line error naming the extra when Ray is missing
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:  # ray without [default]: no job client
            raise InputError(f"--ray {address} needs Ray's job client ({exc}): pip install 'ray[default]'") from None
        self.address = address
        self.timeout = timeout
        self.submitted: list[str] = []
        try:
            self.client = JobSubmissionClient(address)
        except Exception as exc:  # ConnectionError, or a RuntimeError naming the HTTP status
            raise InputError(f"cannot reach the Ray job server at {address}: {one_line(exc)}") from None

    def __enter__(self) -> RayJobCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop a capture job still running (an interrupt, an overrun): it never outlives this command."""
        for job in self.submitted:
            try:
                if not self.client.get_job_status(job).is_terminal():
                    self.client.stop_job(job)
            except Exception:  # noqa: BLE001 - the server went away: nothing is left to stop there either
                pass

    def capture(self, **options: Any) -> ClusterCapture:
        """Every alive node's ranks, captured by a job on the head; failures as ``RayCluster.capture`` has them."""
        job = f"mtpdiag-capture-{uuid.uuid4().hex[:12]}"
        request = json.dumps({"timeout": self.timeout, "options": options}, separators=(",", ":"))
        self._submit(job, ENTRYPOINT.format(bootstrap=shlex.quote(WORKER_PYTHON), request=shlex.quote(request)))
        self.submitted.append(job)
        status = self._wait(job)
        logs = self._logs(job)
        reply = _reply(logs)
        if reply is None:
            raise NothingCaptured(
                f"the capture job {job} on {self.address} ended {status} without a result: "
                f"{_why(logs)} (ray job logs {job})"
            )
        if "error" in reply:
            kind = NothingCaptured if reply.get("kind") == NothingCaptured.__name__ else InputError
            raise kind(f"on the cluster behind {self.address}: {printable(str(reply['error']))}")
        return _cluster_capture(reply, f"ray job {job}")

    def _submit(self, job: str, entrypoint: str) -> None:
        """Submit the capture job; while the head's job agent is still starting (a cluster just started), Ray
        answers "No available agent to submit job, please try again later": so it is tried again, up to START_S."""
        deadline = time.monotonic() + START_S
        while True:
            try:
                self.client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=job,
                    entrypoint_num_cpus=0,
                    metadata={"submitted_by": "mtpdiag"},
                )
                return
            except Exception as exc:  # noqa: BLE001 - the server refused it: say why in one line
                if AGENT_NOT_READY not in str(exc) or time.monotonic() > deadline:
                    raise InputError(
                        f"the Ray job server at {self.address} did not take the capture job: {one_line(exc)}"
                    ) from None
            time.sleep(POLL_S)

    def _wait(self, job: str) -> str:
        deadline = time.monotonic() + self.timeout + START_S
        while True:
            status = self.client.get_job_status(job)
            if status.is_terminal():
                return str(status.value)
            if time.monotonic() > deadline:
                self.client.stop_job(job)
                raise NothingCaptured(
                    f"the capture job {job} did not finish within {self.timeout + START_S:g} s "
                    f"({status.value}; stopped; ray job logs {job} says why)"
                )
            time.sleep(POLL_S)

    def _logs(self, job: str) -> str:
        try:
            return str(self.client.get_job_logs(job))
        except Exception as exc:  # noqa: BLE001
            raise NothingCaptured(f"cannot read the log of the capture job {job}: {one_line(exc)}") from None


def _reply(logs: str) -> dict[str, Any] | None:
    line = next((ln for ln in reversed(logs.splitlines()) if ln.startswith(REPLY)), None)
    if line is None:
        return None
    try:
        reply = json.loads(line[len(REPLY) :])
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _why(logs: str) -> str:
    """The log's last meaningful line; a missing mtpdiag on the head said as what to install."""
    if missing_mtpdiag(logs):
        return (
            "the Python of the head's Ray job server has no mtpdiag: pip install 'mtpdiag[ray]' into the "
            "Python that runs Ray on every node"
        )
    if module := missing_dependency(logs):
        return (
            f"the Python that runs Ray on the head has mtpdiag but not its dependency {module}: "
            "pip install 'mtpdiag[ray]' into the Python that runs Ray on every node"
        )
    return last_line(logs) or "its log is empty"


def _cluster_capture(reply: dict[str, Any], where: str) -> ClusterCapture:
    from mtpdiag.inputs.bundle import snapshot_from_json

    try:
        snapshot = snapshot_from_json(str(reply["bundle"]).encode(), where)
        nodes = tuple(Node(**n) for n in reply.get("nodes") or ())
    except (KeyError, TypeError) as exc:
        raise InputError(
            f"{where}: a reply this mtpdiag does not read ({exc}): the head runs another mtpdiag version"
        ) from None
    return ClusterCapture(
        snapshot=snapshot,
        nodes=nodes,
        failed=tuple(map(str, reply.get("failed") or ())),
        notes=tuple(map(str, reply.get("notes") or ())),
    )


# ------------------------------------------------------------------------------------ the job's side


def run_job(request: dict[str, Any]) -> dict[str, Any]:
    """On the head, as the job's driver: ``--ray auto``'s capture, as the reply ``capture`` reads."""
    from mtpdiag.capture.ray_cluster import RayCluster
    from mtpdiag.inputs.bundle import bundle_text

    try:
        with RayCluster("auto", float(request.get("timeout", 60.0))) as cluster:
            result = cluster.capture(**dict(request.get("options") or {}))
    except MtpdiagError as exc:
        return {"error": str(exc), "kind": type(exc).__name__}
    return {
        "bundle": bundle_text(result.snapshot),
        "nodes": [asdict(n) for n in result.nodes],
        "failed": list(result.failed),
        "notes": list(result.notes),
    }


def main(argv: list[str]) -> int:
    try:
        request = json.loads(argv[0])
    except (IndexError, ValueError):
        print(
            f"usage: python -m mtpdiag.capture.ray_job REQUEST-JSON (run by --ray http://…; {INSTALL_RAY})",
            file=sys.stderr,
        )
        return 2
    reply = run_job(request)
    print(REPLY + json.dumps(reply, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
