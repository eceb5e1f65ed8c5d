"""``mtpdiag run``'s run directory: what the job is launched with, and everything ``run`` writes.

```
<out>/run.json            the run: mtpdiag's version, the launcher's pid, the Flight Recorder settings (the lock:
                          a second run in the same directory is refused)
<out>/events.log          one line per thing the watcher saw: armed, slow, paused, hang, recovered, a rank exited
                          (``events.log.1`` holds the previous MiB: ``pipeline.run_files``)
<out>/mtpdiag-errors.log  mtpdiag's own errors, with their tracebacks (the job goes on untouched)
<out>/fr/rank_<R>         the Flight Recorder dumps (TORCH_FR_DUMP_TEMP_FILE), unless the user set their own
<out>/fr-pipe/rank_<R>.pipe  the debug-info pipes torch makes (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)
<out>/report.txt, report.json, report.md, report.html, bundle.json, hang.json   the first hang called
<out>/hang-<N>/...        a later hang (after the job recovered), the same files
<out>/recovered-<N>.txt   the job moved again after hang N (nothing written before is changed)
```
A run of one node of a multi-node job (``pipeline.multinode``) has all this in ``<out>/<node>/``; the hangs every
node shares are ``<out>/hang-<time>/`` (``pipeline.shared_out``).
The environment a run fills in is ``flight_recorder_env``'s, pure; the rest writes files.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from mtpdiag import __version__
from mtpdiag.atomic import shared_mode, write_atomic
from mtpdiag.errors import InputError
from mtpdiag.model import Report, Snapshot
from mtpdiag.pipeline.run_files import MAX_LOG_BYTES, append_bounded

LOCK = "run.json"

# Torch's Flight Recorder settings: 2,000 entries per rank (the README's advice; torch's default is 0, off),
# a dump when the watchdog times out, the dumps' prefix and the pipe through which a live dump is asked for.
FR_BUFFER_SIZE = "2000"


def flight_recorder_env(environ: Mapping[str, str], run_dir: str) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """What to add to the job's environment (the variables the user left unset, pointing into ``run_dir``),
    and those the user set, kept as they are: name -> (theirs, what mtpdiag would have set)."""
    wanted = {
        "TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": os.path.join(run_dir, "fr", "rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(run_dir, "fr-pipe", "rank_"),
    }
    added = {k: v for k, v in wanted.items() if not environ.get(k)}
    kept = {k: (environ[k], v) for k, v in wanted.items() if environ.get(k)}
    return added, kept


def utc(stamp: float | None = None) -> str:
    return (
        datetime.fromtimestamp(time.time() if stamp is None else stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[
            :-4
        ]
        + "Z"
    )


def default_dir() -> Path:
    """``./mtpdiag-run-<time>/``, or ``-2``, ``-3``… after it when a run started in the same second."""
    base = Path.cwd() / f"mtpdiag-run-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class RunDir:
    """The run directory, claimed for this run (``claim``), before the job starts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.hangs = 0
        self.max_log_bytes = MAX_LOG_BYTES  # events.log's and mtpdiag-errors.log's bound (pipeline.run_files)

    @classmethod
    def claim(cls, path: Path) -> RunDir:
        """Make the directory and take its lock (``run.json``, created exclusively). An input error, before the
        job starts, when it cannot be written or another run has it."""
        path = path.absolute()
        if path.exists() and not path.is_dir():
            raise InputError(f"--out {path} is a file, not a directory")
        try:
            for sub in ("", "fr", "fr-pipe"):
                (path / sub).mkdir(parents=True, exist_ok=True)
            fd = os.open(path / LOCK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise InputError(f"--out {path} already holds a run ({LOCK}): give each run its own directory") from None
        except OSError as exc:
            raise InputError(f"cannot write --out {path}: {exc.strerror or exc}") from None
        os.close(fd)
        return cls(path)

    def release(self) -> None:
        """Give the directory back (the job could not be started)."""
        try:
            (self.path / LOCK).unlink()
        except OSError:
            pass

    def describe(self, **fields: object) -> None:
        """``run.json``: what a later reader needs (never the command line: it may carry secrets)."""
        doc = {"schema": "mtpdiag.run/1", "tool_version": __version__, "started": utc(), **fields}
        (self.path / LOCK).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    def event(self, text: str) -> None:
        """One line in ``events.log``; never an error of its own."""
        try:
            append_bounded(self.path / "events.log", f"{utc()} {text}\n", self.max_log_bytes)
        except OSError:
            pass

    def error(self, exc: BaseException, where: str) -> Path:
        """mtpdiag's own error, with its traceback, in ``mtpdiag-errors.log``."""
        path = self.path / "mtpdiag-errors.log"
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            append_bounded(path, f"{utc()} {where}: {type(exc).__name__}: {exc}\n{trace}\n", self.max_log_bytes)
        except OSError:
            pass
        return path

    def write_hang(self, report: Report, snapshot: Snapshot, timing: dict[str, object]) -> Path:
        """The hang's files: in the run directory for the first hang, in ``hang-<N>/`` for a later one. Returns
        the console report's path. Nothing already written is replaced."""
        from mtpdiag.inputs.bundle import bundle_text
        from mtpdiag.report import json_report, render

        self.hangs += 1
        where = self.path if self.hangs == 1 else self.path / f"hang-{self.hangs}"
        where.mkdir(exist_ok=True)
        mode = shared_mode()
        files: dict[str, bytes | str] = {
            "bundle.json": bundle_text(snapshot),
            "report.json": bytes(json_report.document(report)),
            "report.md": render(report, "markdown"),
            "report.html": render(report, "html"),
            "hang.json": json.dumps(timing, indent=1) + "\n",
            "report.txt": render(report, "console", color=False, width=140),  # last: its presence says "done"
        }
        for name, data in files.items():
            if not (where / name).exists():
                write_atomic(where / name, data, mode=mode)
        return where / "report.txt"

    def write_recovered(self, text: str) -> Path:
        path = self.path / f"recovered-{self.hangs}.txt"
        if not path.exists():
            write_atomic(path, f"{utc()} {text}\n", mode=shared_mode())
        return path
