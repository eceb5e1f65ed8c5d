"""What ``run`` does when mtpdiag itself fails while watching (issue #21, item 7): the job goes on untouched, its
exit code comes back, and the error lands in ``<out>/mtpdiag-errors.log`` with its traceback.

The job is a real child process (a plain Python program); the Watcher is given a capture function that raises,
as the Watcher takes its capture as a parameter. Nothing of the job is a rank, so no py-spy runs.
"""

from __future__ import annotations

import subprocess
import sys

from mtpdiag.commands.run import OnHang, Supervisor
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.run_dir import RunDir
from mtpdiag.pipeline.watcher import Watcher


class CaptureBroke(RuntimeError):
    """A bug of mtpdiag's inside its capture."""


def test_an_error_of_mtpdiags_while_watching_leaves_the_job_alone_and_is_logged_with_its_traceback(tmp_path, capsys):
    marker = tmp_path / "finished"
    script = (
        f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('done'); raise SystemExit(7)"
    )
    run_dir = RunDir.claim(tmp_path / "run")
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        calls = []

        def broken_capture(targets, _busy):
            calls.append(targets)
            raise CaptureBroke("the capture fell over")

        supervisor = Supervisor(
            child, run_dir, LayoutOptions(), OnHang.KILL, 10.0, 1800.0, 0.2, False, 30.0, 10.0
        )  # --on-hang kill: the most a watcher could do to a job, were it to call a hang on its own error
        supervisor.watcher = Watcher(
            list_targets=lambda: [child.pid],
            take_stacks=broken_capture,
            layout=LayoutOptions(),
            interval=0.2,
            stall=10.0,
            arm_on_progress=True,
            spare=True,
        )
        code = supervisor.run()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code == 7  # the job's own exit code, passed through
    assert marker.read_text() == "done"  # it ran to its end
    assert len(calls) == 1 and not supervisor.watching  # the first error stopped the watching
    errors = (tmp_path / "run" / "mtpdiag-errors.log").read_text()
    assert "watcher: CaptureBroke: the capture fell over" in errors
    assert "Traceback (most recent call last):" in errors and "in broken_capture" in errors
    events = (tmp_path / "run" / "events.log").read_text()
    assert "job exited with code 7" in events and "hang" not in events
    said = capsys.readouterr().err
    assert "mtpdiag run: stopped watching after an error of mtpdiag's (CaptureBroke: the capture fell over)" in said
    assert "The job goes on." in said
