"""The part of ``--ray`` that runs on each node of a Ray cluster: capture this node's ranks, hand back a bundle.

``capture.ray_cluster`` runs ``capture_node`` as a Ray task pinned to every node. The task runs in a worker
process that the node's raylet started, so that raylet is its nearest raylet ancestor, and the node's ranks are
the ranked workers below it (``discover.workers_below``). A machine that hosts several Ray nodes therefore has
each rank captured once, by its own raylet's task. The task's own worker and its ancestors, and the mtpdiag
driver when it runs on this node, are never targets; Ray's agents, idle workers and the driver's ``TaskRunner``
carry the raylet's environment and are left out by discovery's rule.

Nothing here imports Ray, and everything crosses the object store as plain data (dicts, strings, numbers): a
node whose mtpdiag differs from the driver's still answers with a bundle (``mtpdiag.bundle/1``), never with
pickled mtpdiag classes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import msgspec

import mtpdiag
from mtpdiag.capture import capture, procfs, raylet_hints
from mtpdiag.capture.discover import workers_below
from mtpdiag.capture.flight_recorder import LiveProgress, with_dumps
from mtpdiag.capture.pyspy import find_pyspy
from mtpdiag.capture.ray_jobs import node_driver_hints
from mtpdiag.errors import MtpdiagError

REPLY_SCHEMA = "mtpdiag.ray-node/1"


def capture_node(request: dict[str, Any]) -> dict[str, Any]:
    """Capture the ranks below this task's raylet; the reply is plain data.

    ``request``: ``label`` (the host name the captures carry), ``mode`` (``stacks``, or ``cpu`` for ``watch``'s
    main-thread CPU reading alone), py-spy's ``native``, ``nonblocking``, ``timeout`` and ``native_timeout``,
    ``fr_dump`` and ``fr_wait`` (the Flight Recorder), ``fr_progress`` (``watch``: the ``LiveProgress.state`` the
    driver keeps, polled here), ``exclude`` ([pid, start time] pairs of the driver and its ancestors, for the
    node it runs on) and ``drivers`` ([pid, job start] of the job drivers Ray's job table places here). The reply
    holds ``bundle`` (None when the node runs no rank), ``cpu`` (pid -> ns), ``hints`` (the sizes on the command
    lines of the job drivers this node's raylet leads to), ``driver_hints`` (those of ``drivers``), ``notes``,
    ``unreadable`` (processes below the raylet whose environment could not be read), ``fr_progress`` (``moved``,
    ``age_s``: how long ago the newest collective seen completed, the new state of this node's ranks, and ``piped``:
    those with a debug-info pipe), or
    ``failure``: one line saying why nothing could be captured (py-spy missing, permission denied).
    """
    reply: dict[str, Any] = {"schema": REPLY_SCHEMA, "version": mtpdiag.__version__, "pid": os.getpid()}
    try:
        if request.get("mode") != "cpu":
            find_pyspy()  # said by every node that lacks it, ranks or not: its mtpdiag is installed without it
        raylet = own_raylet()
        if raylet is None:
            return {**reply, "failure": "the capture task's worker has no raylet among its ancestors"}
        exclude = still_running(request.get("exclude") or ())
        workers, unreadable = workers_below(raylet, exclude)
        reply.update(hints=raylet_hints(raylet, exclude), unreadable=unreadable)
        if request.get("mode") == "cpu":
            return {**reply, "cpu": {str(pid): procfs.main_thread_cpu_ns(pid) for pid in workers}}
        reply["driver_hints"] = node_driver_hints(request.get("drivers") or (), exclude)
        if not workers:
            return {**reply, "bundle": None}
        snapshot = capture(
            workers,
            native=bool(request.get("native")),
            nonblocking=bool(request.get("nonblocking")),
            timeout=float(request.get("timeout", 10.0)),
            native_timeout=float(request.get("native_timeout", 30.0)),
            host=str(request.get("label") or ""),
            exclude=exclude,
            require_any=False,
        )
        snapshot, notes = with_dumps(
            snapshot, request=bool(request.get("fr_dump")), wait_s=float(request.get("fr_wait", 10.0))
        )
        if request.get("fr_progress") is not None:  # watch: the Flight Recorder's progress signal, kept by the driver
            progress = LiveProgress(request["fr_progress"])
            at = progress.poll(snapshot.captures)
            ranks = {c.rank for c in snapshot.captures if c.rank is not None}
            reply["fr_progress"] = {
                "moved": at is not None,
                "age_s": None if at is None else max(0.0, time.time() - at),  # the node's clock stays here
                "ranks": sorted(ranks),
                "piped": sorted(progress.piped),
                "state": progress.state(ranks),
            }
    except MtpdiagError as exc:
        return {**reply, "failure": str(exc)}
    return {**reply, "bundle": msgspec.to_builtins(snapshot.stored()), "notes": list(notes)}


def own_raylet() -> int | None:
    """The raylet that started this process (its nearest raylet ancestor)."""
    return next((pid for pid in procfs.ancestors(os.getpid()) if procfs.is_raylet(pid)), None)


def identify(pids: Iterable[int]) -> list[list[float]]:
    """[pid, start time] of each process, so that another process of the same host can tell it from a later
    process that reuses its pid (or from a process of another pid namespace)."""
    return [[pid, started] for pid in pids if (started := procfs.start_time(pid)) is not None]


def still_running(identified: Iterable[Iterable[float]]) -> set[int]:
    """The pids of ``identify``'s pairs whose process is still the one identified."""
    out = set()
    for pid, started in identified:
        now = procfs.start_time(int(pid))
        if now is not None and abs(now - float(started)) < 0.05:
            out.add(int(pid))
    return out
