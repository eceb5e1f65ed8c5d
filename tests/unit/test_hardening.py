"""Every class of bad input, through the real CLI (``python -m mtpdiag``): one stderr line, the documented exit
code (2 input error, 3 nothing captured), no traceback, and partial results kept where there are any.

Live targets are small ``python -c`` programs with RANK/WORLD_SIZE in their environment (workers as far as
mtpdiag can tell; no torch), so the file runs fast. Privileges are taken away rather than granted: the tests
run as root, and ``setpriv --bounding-set=-cap`` runs mtpdiag (or a target) without the capability that
would let root through (CAP_SYS_PTRACE, CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH). ``chattr +i`` makes a file
that even root cannot write. docs/hardening.md maps each input class to its test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.captures import scenario_dir

from mtpdiag.capture import procfs
from mtpdiag.model import STATE_STOPPED

REPO = Path(__file__).resolve().parents[2]
MTP = Path(scenario_dir("mtp_cp_pp"))
SLEEP = "import time; time.sleep(300)"
NON_DUMPABLE = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(300)"  # PR_SET_DUMPABLE
REPORT_STATES = {"collective", "waiting", "running", "stopped", "gone", "unreadable"}


def mtpdiag(*args: str, prefix: tuple[str, ...] = (), python: str = sys.executable,
            env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter, optionally behind a wrapper such as ``setpriv``."""
    return subprocess.run([*prefix, python, "-m", "mtpdiag", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or dict(os.environ), cwd=REPO)


def one_error_line(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The run failed with ``code`` and exactly one ``mtpdiag: error:`` line that holds ``words``."""
    assert done.returncode == code, (done.returncode, done.stdout[-1000:], done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpdiag: error: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert done.stdout == ""
    return lines[0]


def partial_report(done: subprocess.CompletedProcess, *words: str) -> dict:
    """A report was printed (exit 1: a problem, or 4: ranks stuck for reasons the evidence cannot give; never 0
    with a rank unread) and stderr is one ``mtpdiag: warning:`` line holding ``words``."""
    assert done.returncode in (1, 4), (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpdiag: warning: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return json.loads(done.stdout)


def needs_root_and(tool: str) -> None:
    if os.geteuid() != 0 or shutil.which(tool) is None:
        pytest.skip(f"needs root and {tool}")


def without_cap(*caps: str) -> tuple[str, ...]:
    """``setpriv`` arguments that drop ``caps`` from the bounding set: root keeps uid 0 but not their power."""
    return ("setpriv", "--bounding-set=" + ",".join(f"-{c}" for c in caps))


@pytest.fixture
def start():
    """Start processes for a test; every one (and its descendants) is SIGKILLed afterwards."""
    procs: list[subprocess.Popen] = []

    def run(*cmd: str, env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        for pid in [*procfs.descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)


def ranked(start, rank: int, world: int, code: str = SLEEP, prefix: tuple[str, ...] = ()) -> int:
    """A Python worker (RANK/WORLD_SIZE set) running ``code``; returns its pid once it is in the interpreter."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
    proc = start(*prefix, sys.executable, "-c", code, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stat = procfs.read_stat(proc.pid)
        if stat and procfs.is_python(proc.pid) and (procfs.read_env(proc.pid) or {}).get("RANK") == str(rank):
            time.sleep(0.5)  # past start-up, into its code
            return proc.pid
        time.sleep(0.05)
    raise AssertionError(f"pid {proc.pid} never became a ranked Python process")


# ------------------------------------------------------------------------------------------ live targets


def test_nonexistent_pid(start):
    gone = start("true")
    gone.wait(timeout=30)
    one_error_line(mtpdiag("inspect", "--pid", str(gone.pid)), 2, f"pid {gone.pid} does not exist")


def test_non_python_pid(start):
    sleeper = start("sleep", "300")
    one_error_line(mtpdiag("inspect", "--pid", str(sleeper.pid), "--json"), 2,
                   f"pid {sleeper.pid} is not a Python process")


def test_ptrace_denied_is_nothing_captured_with_the_reason(start):
    """mtpdiag without CAP_SYS_PTRACE against a non-dumpable root worker: py-spy is refused (exit 3)."""
    needs_root_and("setpriv")
    worker = ranked(start, 0, 1, NON_DUMPABLE)
    one_error_line(mtpdiag("inspect", "--pid", str(worker), prefix=without_cap("sys_ptrace")), 3,
                   "could not capture any of 1 target", "permission denied", "CAP_SYS_PTRACE")


def test_ptrace_denied_on_one_rank_keeps_the_other(start):
    """The readable rank (started with the same reduced capabilities) is reported; the other is unreadable."""
    needs_root_and("setpriv")
    denied = ranked(start, 0, 2, NON_DUMPABLE)
    readable = ranked(start, 1, 2, prefix=without_cap("sys_ptrace"))
    done = mtpdiag("inspect", "--pid", str(denied), "--pid", str(readable), "--json",
                   prefix=without_cap("sys_ptrace"))
    report = partial_report(done, "1 of 2 ranks not captured", "rank 0", "permission denied")
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[0]["state"] == "unreadable" and "permission denied" in ranks[0]["error"]
    assert ranks[1]["state"] == "waiting" and report["stacks"][ranks[1]["stack"]][-1]["function"] == "<module>"
    assert ranks[1]["wait"]["kind"] == "sleep"  # time.sleep: /proc says clock_nanosleep, the line calls sleep()
    assert report["verdict"] == "incomplete"


CHURN = """
import os, random, subprocess, sys, time
CHILD = "import random, time; time.sleep(random.uniform(0.3, 2.0))"
workers = {}
while True:
    for rank in range(4):
        if rank not in workers or workers[rank].poll() is not None:
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4")
            workers[rank] = subprocess.Popen([sys.executable, "-c", CHILD], env=env)
    time.sleep(0.05)
"""


def test_workers_exiting_mid_capture_are_gone_or_left_out(start):
    """A launcher whose 4 ranked workers keep exiting after a random short time: capture it repeatedly.
    Each run reports the ranks it saw (a rank that exited is "gone", named on stderr), or fails with one
    line; never a crash."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    launcher = start(sys.executable, "-c", CHURN, env=env)
    time.sleep(2)
    reports = 0
    for _ in range(6):  # about one run in six catches a worker exiting between discovery and its dump
        done = mtpdiag("inspect", "--pid", str(launcher.pid), "--json", "--timeout", "10")
        assert "Traceback" not in done.stderr
        assert done.returncode in (0, 1, 2, 3, 4), done.stderr
        if done.returncode in (2, 3):  # every worker exited between discovery and the dump
            one_error_line(done, done.returncode)
            continue
        reports += 1
        report = json.loads(done.stdout)
        missing = [r for r in report["ranks"] if r["state"] in ("gone", "unreadable")]
        assert {r["state"] for r in report["ranks"]} <= REPORT_STATES
        assert all("exited" in r["error"] for r in missing if r["state"] == "gone")
        if missing:
            partial_report(done, f"{len(missing)} of {len(report['ranks'])} ranks not captured")
        else:
            assert done.stderr == ""
    assert reports >= 1  # the launcher always has workers: most runs must produce a report


def test_frozen_rank_is_captured_as_stopped_and_left_stopped(start):
    worker = ranked(start, 0, 1)
    os.kill(worker, signal.SIGSTOP)
    for flags in (["--nonblocking"], []):  # without the flag, a stopped target is read non-blocking anyway
        done = mtpdiag("inspect", "--pid", str(worker), "--json", *flags)
        # A stopped rank alone: stuck, and nothing else captured to say why: incomplete, exit 4, never 0
        assert done.returncode == 4 and done.stderr == "", (flags, done.returncode, done.stderr)
        report = json.loads(done.stdout)
        (rank,) = report["ranks"]
        assert rank["state"] == "stopped" and report["stacks"][rank["stack"]][-1]["function"] == "<module>", flags
        assert report["verdict"] == "incomplete" and report["findings"][0]["id"] == "unexplained-wait"
        assert procfs.read_stat(worker).state == STATE_STOPPED  # mtpdiag never resumes a rank a user stopped


def _venv_without_pyspy(tmp_path: Path) -> tuple[str, dict]:
    """An interpreter whose directory has no py-spy (a venv over this one's packages) and a PATH without it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "py-spy")))
    env = dict(os.environ, PATH=path)
    assert shutil.which("py-spy", path=path) is None
    assert not (venv / "bin" / "py-spy").exists()
    return python, env


def test_py_spy_missing(start, tmp_path):
    python, env = _venv_without_pyspy(tmp_path)
    worker = ranked(start, 0, 1)
    one_error_line(mtpdiag("inspect", "--pid", str(worker), python=python, env=env), 2,
                   "py-spy not found on PATH", "pip install py-spy")
    bundle = tmp_path / "b.json"
    one_error_line(mtpdiag("collect", "--pid", str(worker), "--out", str(bundle), python=python, env=env), 2,
                   "py-spy not found")
    assert not bundle.exists()


# ------------------------------------------------------------------------------------------ files


def _truncated(tmp_path: Path, source: Path, name: str) -> Path:
    text = source.read_text()
    target = tmp_path / name
    target.write_text(text[: len(text) // 2])
    return target


def test_truncated_json_dump(tmp_path):
    cut = _truncated(tmp_path, MTP / "rank0.json", "rank0.json")
    one_error_line(mtpdiag("analyze", str(cut)), 2, str(cut), "invalid or truncated JSON")


def test_truncated_json_among_good_dumps_keeps_the_others(tmp_path):
    cut = _truncated(tmp_path, MTP / "rank0.json", "rank0.json")
    done = mtpdiag("analyze", str(cut), *(str(MTP / f"rank{r}.json") for r in (1, 2, 3)), "--json",
                   "--cp", "2", "--pp", "2")
    report = partial_report(done, "1 input(s) skipped", "rank0.json", "truncated JSON")
    states = {r["rank"]: r["state"] for r in report["ranks"]}
    assert sorted(r for r, s in states.items() if s != "gone") == [1, 2, 3]
    assert any(f["id"] == "mtp-cp-gated-reduce" for f in report["findings"])  # still diagnosed
    assert any("truncated JSON" in n for n in report["notes"])


def test_truncated_bundle(tmp_path):
    cut = _truncated(tmp_path, MTP / "bundle.json", "host.mtpdiag.json")
    one_error_line(mtpdiag("analyze", str(cut), "--json"), 2, str(cut), "invalid or truncated JSON")


def test_garbage_text_file(tmp_path):
    garbage = tmp_path / "notes.txt"
    garbage.write_text("the job hung again\nno idea why\n")
    one_error_line(mtpdiag("analyze", str(garbage)), 2, str(garbage), "not a py-spy dump")


def test_binary_file(tmp_path):
    blob = tmp_path / "core.dump"
    blob.write_bytes(bytes(range(256)) * 4)
    one_error_line(mtpdiag("analyze", str(blob)), 2, str(blob), "not a text file")


def test_empty_directory(tmp_path):
    one_error_line(mtpdiag("analyze", str(tmp_path)), 2, str(tmp_path), "no capture files")


def test_missing_path(tmp_path):
    one_error_line(mtpdiag("analyze", str(tmp_path / "nowhere")), 2, "no such file or directory")


def test_unreadable_file(tmp_path):
    """Owned by nobody, mode 0600, read by root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH."""
    needs_root_and("setpriv")
    dump = tmp_path / "rank0.json"
    shutil.copyfile(MTP / "rank0.json", dump)
    os.chown(dump, 65534, 65534)
    dump.chmod(0o600)
    one_error_line(mtpdiag("analyze", str(dump), prefix=without_cap("dac_override", "dac_read_search")), 2,
                   str(dump), "cannot read", "Permission denied")


def _bundle_with(tmp_path: Path, name: str, world_size: str) -> Path:
    data = json.loads((MTP / "bundle.json").read_text())
    for capture in data["captures"]:
        capture["env"]["WORLD_SIZE"] = world_size
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_bundle_in_which_no_rank_was_readable_is_nothing_captured(tmp_path):
    data = json.loads((MTP / "bundle.json").read_text())
    for capture in data["captures"]:
        capture.update(threads=[], state="unreadable", error="py-spy timed out after 10s")
    path = tmp_path / "all-unreadable.mtpdiag.json"
    path.write_text(json.dumps(data))
    one_error_line(mtpdiag("analyze", str(path)), 3, "all 4 ranks in them were unreadable", "timed out")


def test_bundle_of_a_newer_schema(tmp_path):
    data = json.loads((MTP / "bundle.json").read_text())
    data["schema"] = "mtpdiag.bundle/2"
    path = tmp_path / "future.mtpdiag.json"
    path.write_text(json.dumps(data))
    one_error_line(mtpdiag("analyze", str(path)), 2, "mtpdiag.bundle/2", "reads mtpdiag.bundle/1", "upgrade")


def test_bundles_whose_world_sizes_conflict(tmp_path):
    other = _bundle_with(tmp_path, "other-host.mtpdiag.json", "8")
    one_error_line(mtpdiag("analyze", str(MTP / "bundle.json"), str(other)), 2, "world sizes differ",
                   str(MTP / "bundle.json"), str(other))


def test_world_size_beyond_what_mtpdiag_handles(tmp_path):
    huge = _bundle_with(tmp_path, "huge.mtpdiag.json", "999999999")
    one_error_line(mtpdiag("analyze", str(huge)), 2, "world size 999999999", "more than mtpdiag handles")


def test_duplicate_ranks():
    one_error_line(mtpdiag("analyze", str(MTP / "rank0.json"), str(MTP / "rank0.txt")), 2,
                   "rank 0 is in two files", "rank0.json", "rank0.txt")


def test_layout_that_does_not_divide_the_world_size():
    dumps = [str(MTP / f"rank{r}.json") for r in range(4)]  # raw JSON dumps carry no layout hints
    one_error_line(mtpdiag("analyze", *dumps, "--cp", "3", "--world-size", "4"), 2,
                   "does not divide the world size 4")


def test_a_layout_without_a_world_size_assumes_the_smallest_world_and_says_so():
    """Dumps without WORLD_SIZE are a partial capture as far as anyone knows: cp 3 with ranks 0-3 is a world of
    at least 6, not an error; the report says what it assumed and which ranks it did not see."""
    dumps = [str(MTP / f"rank{r}.json") for r in range(4)]
    done = mtpdiag("analyze", *dumps, "--cp", "3", "--json")
    report = json.loads(done.stdout)
    assert report["world_size"] == 6 and report["layout"]["cp"] == 3
    assert "6 assumed" in report["layout_source"] and "--world-size" in report["layout_source"]
    assert any("4 of 6 ranks captured" in n for n in report["notes"]) or \
        any(f["id"] == "missing-rank" and f["ranks"] == [4, 5] for f in report["findings"])


def test_layout_flag_that_contradicts_the_targets_command_line():
    one_error_line(mtpdiag("analyze", str(MTP / "bundle.json"), "--cp", "3"), 2, "layout conflict", "--cp 3",
                   "--context-parallel-size 2")


def test_control_characters_from_a_file_never_reach_the_terminal(tmp_path):
    """A bundle someone handed over, with an escape sequence (retitle the terminal), a bell and a bidi
    override in a function name, and a clear-screen and a newline in an error: all replaced on reading."""
    data = json.loads((MTP / "bundle.json").read_text())
    (site,) = [f for f in data["captures"][1]["threads"][0]["frames"] if f["function"] == "ring_attention"]
    site["function"] = "ring_attention\x1b]0;pwned\x07\u202e"
    data["captures"][0]["threads"] = []
    data["captures"][0]["error"] = "py-spy failed\x1b[2J\nsecond line"
    path = tmp_path / "handed-over.mtpdiag.json"
    path.write_text(json.dumps(data))
    for fmt in ([], ["--markdown"], ["--json"]):
        done = mtpdiag("analyze", str(path), *fmt)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
        for bad in ("\x1b", "\x07", "\u202e"):
            assert bad not in done.stdout + done.stderr, (fmt, repr(bad))
        assert "pwned" in done.stdout  # the name is still shown, only its control characters are not
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("mtpdiag: warning: 1 of 4 ranks not captured") and "second line" in line


# ------------------------------------------------------------------------------------------ apply


@pytest.fixture
def engine_071(tmp_path) -> Path:
    from support.verl_wheels import verl_engine_file

    target = tmp_path / "engine" / "transformer_impl.py"
    target.parent.mkdir()
    shutil.copyfile(verl_engine_file("0.7.1"), target)
    return target


GATE = "        if self.model_config.mtp.enable and self.is_mp_src_rank_with_outputs():\n"


def test_apply_refuses_an_unknown_code_shape(engine_071):
    """The MTP gate split into two nested ifs: affected, but not a shape apply rewrites."""
    text = engine_071.read_text()
    assert text.count(GATE) == 1
    engine_071.write_text(text.replace(GATE, "        if self.model_config.mtp.enable:\n"
                                             "          if self.is_mp_src_rank_with_outputs():\n"))
    mangled = engine_071.read_bytes()
    one_error_line(mtpdiag("apply", "--path", str(engine_071)), 2, "left unchanged", "fix it by hand")
    assert engine_071.read_bytes() == mangled
    assert [p.name for p in engine_071.parent.iterdir()] == [engine_071.name]  # no backup, no temp file


def test_apply_refuses_an_immutable_file(engine_071):
    """``chattr +i``: not even root may write it (chmod 0444 would not stop root)."""
    needs_root_and("chattr")
    original = engine_071.read_bytes()
    if subprocess.run(["chattr", "+i", str(engine_071)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem does not support chattr +i")
    try:
        one_error_line(mtpdiag("apply", "--path", str(engine_071)), 2, str(engine_071), "read-only",
                       "not changed")
    finally:
        subprocess.run(["chattr", "-i", str(engine_071)], check=True)
    assert engine_071.read_bytes() == original
    assert [p.name for p in engine_071.parent.iterdir()] == [engine_071.name]


def test_apply_refuses_an_unreadable_file(engine_071):
    """Owned by nobody, mode 0600, and mtpdiag without the DAC override capabilities."""
    needs_root_and("setpriv")
    original = engine_071.read_bytes()
    os.chown(engine_071, 65534, 65534)
    engine_071.chmod(0o600)
    one_error_line(mtpdiag("apply", "--path", str(engine_071),
                           prefix=without_cap("dac_override", "dac_read_search")), 2, "not readable")
    assert engine_071.read_bytes() == original
    assert [p.name for p in engine_071.parent.iterdir()] == [engine_071.name]


def test_a_bundle_with_unknown_layout_hints_is_an_input_error(tmp_path):
    """Found by the fuzzer: layout hints {"a": 1} in a handed-over bundle raised a ValueError (internal error)."""
    data = json.loads((MTP / "bundle.json").read_text())
    data["captures"][0]["layout_hints"] = {"a": 1}
    path = tmp_path / "foreign.mtpdiag.json"
    path.write_text(json.dumps(data))
    one_error_line(mtpdiag("analyze", str(path)), 2, "unknown keys ['a']")
