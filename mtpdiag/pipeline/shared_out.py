"""``mtpdiag run`` across nodes, the I/O: the shared ``--out`` that every node's run writes its hangs into.

```
<out>/<node>/                  each node's run directory (run.json, events.log, fr/, its reports): as one node's
<out>/hang-<UTC time>/         one hang of the job, made by the first node that called it
    <node>.mtpdiag.json        each node's bundle: its ranks at the hang, with their Flight Recorder dumps
    <node>.report.md           the diagnosis of a node that called it, from its own ranks
    nodes.json                 the nodes whose bundles arrived (``multinode.HangNodes``), rewritten as they do
<out>/.mtpdiag-hang.lock/      held while a node picks or makes a hang directory and adds itself (mkdir is the
                               lock: atomic on every file system a cluster shares, NFS included)
```
A node that calls a hang joins the latest hang directory made within ``multinode.same_hang_window``, or makes
one; a node that sees a hang directory appear that it has no bundle in drops its ranks' bundle there too, so
that ``mtpdiag analyze <out>/hang-<time>/`` has every node. Errors here are logged in the node's run directory
and never stop the watching, nor the job.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpdiag.atomic import shared_mode, write_atomic
from mtpdiag.errors import InputError, NothingCaptured
from mtpdiag.model import Report, Snapshot
from mtpdiag.pipeline import multinode as mn
from mtpdiag.pipeline.run_dir import RunDir, utc
from mtpdiag.vocabulary.nodes import NodeRole

if TYPE_CHECKING:
    from mtpdiag.pipeline.watcher import Watcher

LOCK_NAME = ".mtpdiag-hang.lock"
LOCK_WAIT_S = 20.0  # the lock is held for a listing, a mkdir and two small writes: seconds at worst
LOCK_STALE_S = 120.0  # a lock this old was left by a node that died holding it


@contextlib.contextmanager
def locked(root: Path, wait_s: float = LOCK_WAIT_S, stale_s: float = LOCK_STALE_S) -> Iterator[None]:
    """Hold ``<root>/.mtpdiag-hang.lock`` (a directory: ``mkdir`` is atomic). TimeoutError after ``wait_s``."""
    lock = root / LOCK_NAME
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - lock.stat().st_mtime > stale_s:
                    lock.rmdir()
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock} was held by another node for over {wait_s:.0f} s") from None
            time.sleep(0.05)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.rmdir()


class SharedOut:
    """This node's side of the shared ``--out``: ``call`` when it calls a hang, ``look`` at every sample."""

    def __init__(self, root: Path, node: str, run_dir: RunDir, window: float, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.root, self.node, self.run_dir, self.window = root.absolute(), node, run_dir, window
        self.lock_wait_s = lock_wait_s
        self.started = time.time()
        self.handled: set[str] = set()  # hang directories this node has put its bundle in, or given up on

    # ------------------------------------------------------------------ this node called a hang

    def call(self, report: Report, headline: str, snapshot: Snapshot, report_path: Path) -> Path | None:
        """Put this node's bundle and diagnosis (``report``, whose first line is ``headline``; its console
        report at ``report_path``) in the hang directory it joins or makes. That directory, or None when the
        shared directory could not be written (said in the run's error log)."""
        try:
            with locked(self.root, self.lock_wait_s):
                now = time.time()
                name = mn.pick_hang(self.hangs(), self.node, now, self.window) or self._make(now)
                arrival = self._arrival(name, snapshot, NodeRole.CALLED, headline, report_path)
                self._deliver(name, snapshot, arrival, report)
        except OSError as exc:
            self.run_dir.error(exc, f"shared --out {self.root}")
            return None
        self.handled.add(name)
        self.run_dir.event(f"hang shared: this node's bundle is in {self.root / name} ({NodeRole.CALLED})")
        return self.root / name

    def hangs(self) -> list[mn.HangDir]:
        """The hang directories in the shared ``--out``, with the nodes that called into each."""
        found = []
        for name in os.listdir(self.root):
            created = mn.hang_time(name)
            if created is not None:
                found.append(mn.HangDir(name, created, mn.called_by(self._nodes(name))))
        return found

    def _make(self, now: float) -> str:
        for n in range(1, 1000):
            name = mn.hang_dir_name(now, n)
            try:
                (self.root / name).mkdir()
            except FileExistsError:
                continue
            return name
        raise FileExistsError(f"{self.root}: no free hang directory name for {utc(now)}")

    # ------------------------------------------------------------------ another node called one

    def look(self, watcher: Watcher, targets: list[Any]) -> list[Path]:
        """Hang directories that appeared since this run started and hold no bundle of this node: this node's
        ranks captured now and dropped into each (at most once per directory)."""
        try:
            sighted = self._sighted()
        except OSError:
            return []
        dropped = []
        for name in sighted:
            self.handled.add(name)  # once: a capture that fails is logged, not retried at every sample
            try:
                snapshot = self._capture(watcher, targets)
                with locked(self.root, self.lock_wait_s):
                    self._deliver(name, snapshot, self._arrival(name, snapshot, NodeRole.SAW), None)
            except (OSError, InputError, NothingCaptured) as exc:
                self.run_dir.error(exc, f"shared --out {self.root / name}")
                continue
            self.run_dir.event(f"another node called a hang: this node's bundle is in {self.root / name}")
            dropped.append(self.root / name)
        return dropped

    def _sighted(self) -> list[str]:
        since = self.started - mn.CLOCK_SKEW_S - 1.0  # names carry whole seconds
        return sorted(
            name
            for name in os.listdir(self.root)
            if name not in self.handled and (created := mn.hang_time(name)) is not None and created >= since
        )

    @staticmethod
    def _capture(watcher: Watcher, targets: list[Any]) -> Snapshot:
        from mtpdiag.pipeline import with_flight_recorder

        if not targets:
            raise NothingCaptured("no ranks of this node to capture")
        return with_flight_recorder(watcher.take_stacks(targets, False))

    # ------------------------------------------------------------------ writing, under the lock

    def _arrival(
        self,
        name: str,
        snapshot: Snapshot,
        role: NodeRole,
        headline: str = "",
        report_path: Path | None = None,
    ) -> mn.NodeArrival:
        ranks = tuple(sorted(c.rank for c in snapshot.captures if c.rank is not None))
        return mn.NodeArrival(
            node=self.node,
            role=role,
            at=utc(),
            ranks=ranks,
            bundle=mn.bundle_name(self.node),
            headline=headline,
            report=os.path.relpath(report_path, self.root / name) if report_path is not None else "",
        )

    def _deliver(self, name: str, snapshot: Snapshot, arrival: mn.NodeArrival, report: Report | None) -> None:
        """The bundle (and a caller's markdown report), then ``nodes.json``: a node is listed once its bundle is
        whole. A sighting after this node's own call changes nothing."""
        from mtpdiag.inputs.bundle import bundle_text

        where = self.root / name
        doc = self._nodes(name) or mn.new_nodes(name, self.node)
        updated = mn.with_arrival(doc, arrival)
        if updated is doc:
            return
        mode = shared_mode()
        write_atomic(where / arrival.bundle, bundle_text(snapshot), mode=mode)
        if report is not None:
            from mtpdiag.report import render

            write_atomic(where / f"{self.node}.report.md", render(report, "markdown"), mode=mode)
        write_atomic(where / mn.NODES_FILE, mn.nodes_text(updated), mode=mode)

    def _nodes(self, name: str) -> mn.HangNodes | None:
        try:
            return mn.read_nodes((self.root / name / mn.NODES_FILE).read_bytes())
        except OSError:
            return None
