"""ProcessGroupNCCL's watchdog and heartbeat monitor, for the emulated groups of one process.

* Watchdog (ProcessGroupNCCL::Watchdog::runLoop, every kWatchdogThreadSleepMillis = 100 ms): a work
  queued longer than its group's timeout is caught: it logs ``[Rank r] Watchdog caught collective
  operation timeout: WorkNCCL(...) ran for N milliseconds before timing out.``, "failure detected by
  watchdog ...", the failed collective's stack, and signals a dump to every rank through the store
  (broadcastDumpSignal). The work is not retired then: the timeout dump shows it ``scheduled`` and
  unretired. Only a watchdog that does not tear down retires it afterwards (retire_id): later dumps,
  through the pipe, show it retired and not completed.
* Monitor (HeartbeatMonitor::runLoop, every TORCH_NCCL_COORD_CHECK_MILSEC, default 1000 ms): on its own
  rank's signal or another rank's (the store key), it writes the Flight Recorder once to
  ``${TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE}<rank>``; a line written to
  ``${TORCH_NCCL_DEBUG_INFO_PIPE_FILE}<rank>.pipe`` dumps too, without stopping anything (DumpPipe).
* Then, as with TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (the default), the watchdog's exception ends the
  process: ``terminate called after throwing ...`` and SIGABRT. It first waits, like NCCL (which sleeps
  four times TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC), until every rank has dumped, or 15 s at most.
  ``ABORT = False`` (the worker's ``--no-abort``) or TORCH_NCCL_ASYNC_ERROR_HANDLING=0 keeps it hung.

The log lines go to stderr with a glog-style prefix; the watchdog's line is NCCL's text, the others
paraphrase what NCCL prints at the same moment.
"""

from __future__ import annotations

import datetime as _dt
import os
import stat
import sys
import threading
import time

from process_group import GROUPS, ProcessGroupNCCLOnCPU, WorkNCCL
from recorder import RECORDER, dump_path

ABORT = True
WATCHDOG_SLEEP_S = 0.1
SIGNAL_KEY = "ncclcpu/dump_signal"
DUMPED_KEY = "ncclcpu/dumped/"


def _env_ms(name: str, default: int) -> float:
    try:
        return int(os.environ.get(name, default)) / 1000.0
    except ValueError:
        return default / 1000.0


def log(level: str, rank: int, message: str) -> None:
    """A c10 log line as torch prints it, ``[rank2]:[E1130 17:20:01.123456789 <tid> ProcessGroupNCCL.cpp:<line>] ...``,
    without the source line number."""
    now = _dt.datetime.now()
    stamp = f"{level}{now:%m%d %H:%M:%S}.{now.microsecond:06d}000"
    line = f"[rank{rank}]:[{stamp} {threading.get_native_id()} ProcessGroupNCCL.cpp] {message}\n"
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), line.encode())  # one write per line, as glog: ranks share the job's log


class Monitor:
    """The watchdog and monitor of one process, started by its default group (local id 0)."""

    def __init__(self, default_group: ProcessGroupNCCLOnCPU):
        self.group = default_group
        self.rank = default_group.rank()
        self.world = default_group.size()
        self.store = default_group.store
        self.coord_check_s = _env_ms("TORCH_NCCL_COORD_CHECK_MILSEC", 1000)
        self.dump_wait_s = _env_ms("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", 15000)
        self.dump_on_timeout = os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1") not in ("0", "false", "False")
        self.abort = ABORT and os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3") != "0"
        self.signalled = False   # this rank's own timeout (shouldDump_)
        self.dumped = False
        self.failed: set[ProcessGroupNCCLOnCPU] = set()
        self.to_retire: list[tuple[float, ProcessGroupNCCLOnCPU, WorkNCCL]] = []
        self.abort_after: tuple[float, ProcessGroupNCCLOnCPU, WorkNCCL] | None = None
        self.pipe_fd, self.stopped = self._open_pipe(), threading.Event()  # stopped: stop() ends the thread
        self.thread = threading.Thread(target=self._run, name="emulated-nccl-watchdog", daemon=True)
        self.thread.start()

    def _open_pipe(self) -> int | None:
        """DumpPipe: mkfifo ``<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`` and read it without blocking."""
        stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
        if not stem or not RECORDER.enabled:
            return None
        path = f"{stem}{self.rank}.pipe"
        try:
            if os.path.exists(path) or os.path.islink(path):
                os.unlink(path)
            os.mkfifo(path, 0o666)
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                return None
            return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            log("W", self.rank, f"could not open the debug info pipe {path}: {exc}")
            return None

    def _pipe_requested(self) -> bool:
        if self.pipe_fd is None:
            return False
        try:
            return len(os.read(self.pipe_fd, 128)) > 0
        except BlockingIOError:
            return False
        except OSError:
            return False

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        next_coord = time.monotonic()
        while not self.stopped.is_set():
            self.stopped.wait(WATCHDOG_SLEEP_S)
            self._check_timeouts()
            now = time.monotonic()
            if now >= next_coord or self.signalled:
                next_coord = now + self.coord_check_s
                self._coordinate()
            if self.abort_after is not None:
                self._maybe_abort()
            elif self.to_retire:
                self._retire_timed_out()

    def _check_timeouts(self) -> None:
        """Every pending work is checked, as ProcessGroupNCCL's watchdog walks its whole work list: a job that
        lives on (no abort) times out, and later retires, each of them; one that aborts ends after the first."""
        for group in list(GROUPS):
            if group in self.failed and self.abort:
                continue  # the process is torn down after the dumps: the first timeout is the one logged
            with group.works_lock:
                pending = [w for w in group.works if not w.done and not w.timed_out]
            now = time.monotonic()
            for work in pending:
                ran_ms = int((now - work.started) * 1000)
                if ran_ms > work.timeout_ms:
                    self._caught(group, work, ran_ms)

    def _caught(self, group: ProcessGroupNCCLOnCPU, work: WorkNCCL, ran_ms: int) -> None:
        self.failed.add(group)
        work.timed_out = True
        # WorkNCCL::checkTimeout logs with WorkNCCL::logPrefix(), "[Rank <group rank>] ".
        message = (f"[Rank {group.rank()}] Watchdog caught collective operation timeout: {work.describe()} "
                   f"ran for {ran_ms} milliseconds before timing out.")
        log("E", self.rank, message)
        log("E", self.rank, f"{group.log_prefix()}failure detected by watchdog at work sequence id: {work.seq} "
                            f"PG status: last enqueued work: {group.status.last_enqueued}, "
                            f"last completed work: {group.status.last_completed}")
        if work.entry is not None:  # WorkNCCL::printTraceback, from the Flight Recorder entry
            frames = "\n".join(f"#{i} {f['name']} from {f['filename']}:{f['line']}"
                                for i, f in enumerate(work.entry.frames))
            log("E", self.rank, f"{group.log_prefix()}Stack trace of the failed collective: \n{frames}")
        # The work is not retired yet: the watchdog sleeps while every rank dumps, then throws
        # (TORCH_NCCL_ASYNC_ERROR_HANDLING=3). Only a watchdog that lives on reaches retire_id.
        self.to_retire.append((time.monotonic() + self.dump_wait_s if self.signalled or self.dump_on_timeout
                               else time.monotonic(), group, work))
        if self.dump_on_timeout and RECORDER.enabled and not self.signalled:
            self.signalled = True
            try:
                self.store.set(SIGNAL_KEY, str(self.rank))
            except Exception:  # noqa: BLE001 - the store may be gone; dump locally anyway
                pass
        if self.abort and self.abort_after is None:
            self.abort_after = (time.monotonic() + self.dump_wait_s, group, work)
            self._last_error = message

    def _retire_timed_out(self) -> None:
        """A watchdog that does not tear down (TORCH_NCCL_ASYNC_ERROR_HANDLING=0, or --no-abort) goes on
        once the dumps are written: the failed work counts as completed and is retired without having
        completed (retire_id), so later dumps show it retired and not completed."""
        now = time.monotonic()
        due = [item for item in self.to_retire if item[0] <= now or self.dumped]
        for item in due:
            _, group, work = item
            RECORDER.retire(work.entry)
            with group.works_lock:
                if work in group.works:
                    group.works.remove(work)
            self.to_retire.remove(item)

    def _coordinate(self) -> None:
        """The monitor's check: a dump on this rank's signal, another rank's, or a pipe request."""
        if self._pipe_requested():
            self._dump(f"{self.group.log_prefix()}Dump requested through the debug info pipe.", final=False)
        if self.dumped or not RECORDER.enabled:
            return
        status = self.group.status
        tail = (f" and we will try our best to dump the debug info. Last enqueued NCCL work: "
                f"{status.last_enqueued}, last completed NCCL work: {status.last_completed}.")
        if self.signalled:
            log("E", self.rank, f"{self.group.log_prefix()}First PG on this rank to signal dumping.")
            self._dump(f"{self.group.log_prefix()}Received a dump signal due to a collective timeout from this "
                       f"local rank{tail}", final=True)
            return
        try:
            if not self.store.check([SIGNAL_KEY]):
                return
            source = self.store.get(SIGNAL_KEY).decode()
        except Exception:  # noqa: BLE001 - NCCL logs "Failed to check the should dump flag on TCPStore"
            return
        log("E", self.rank, f"{self.group.log_prefix()}Observed flight recorder dump signal from another rank via "
                            "TCPStore.")
        self._dump(f"{self.group.log_prefix()}Received a dump signal due to a collective timeout from  rank "
                   f"{source}{tail}", final=True)

    def _dump(self, reason: str, final: bool) -> None:
        """dumpDebuggingInfo(). ``final``: the dump on a timeout signal, which every rank makes once."""
        path = dump_path(self.rank)
        log("E", self.rank, reason)
        log("I", self.rank, f"{self.group.log_prefix()}ProcessGroupNCCL dumping nccl trace to {path}")
        RECORDER.write(path, {g.name: g.pg_config() for g in GROUPS})
        log("I", self.rank, f"{self.group.log_prefix()}Flight Recorder trace successfully dumped.")
        if final:
            self.dumped = True
            try:
                self.store.set(f"{DUMPED_KEY}{self.rank}", path)
            except Exception:  # noqa: BLE001
                pass

    def _maybe_abort(self) -> None:
        deadline, group, work = self.abort_after
        if not self.dumped and self.signalled:
            return
        try:
            everyone = self.store.check([f"{DUMPED_KEY}{r}" for r in range(self.world)])
        except Exception:  # noqa: BLE001
            everyone = False
        if not everyone and time.monotonic() < deadline:
            return
        print("terminate called after throwing an instance of 'c10::DistBackendError'\n"
              f"  what():  {group.log_prefix()}Process group watchdog thread terminated with exception: "
              f"{self._last_error}", file=sys.stderr, flush=True)
        os.abort()


MONITOR: Monitor | None = None


def start(default_group: ProcessGroupNCCLOnCPU) -> Monitor:
    global MONITOR
    if MONITOR is None:
        MONITOR = Monitor(default_group)
    return MONITOR


def stop() -> None:
    """ProcessGroupNCCL's shutdown: the watchdog thread ends before the groups and their store go.

    A daemon thread still inside a store call while the interpreter exits is killed in C++, which aborts the
    process ("terminate called without an active exception") after a job that finished well.
    """
    global MONITOR
    if MONITOR is not None:
        MONITOR.stopped.set()
        MONITOR.thread.join()
        MONITOR = None
