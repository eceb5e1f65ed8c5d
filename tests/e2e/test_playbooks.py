"""The playbooks cannot rot: every command they show runs here and prints what they show.

Each playbook's ``console`` blocks run in order against real jobs (the CPU reproducers under torchrun
and gloo), recorded captures and a copy of verl 0.7.1's engine, through the real ``mtpdiag`` CLI.
Jobs are started once, shared by every block that names them, and killed after their last block.
The convention is in ``playbooks/README.md``; parsing and matching are in ``playbook_runner.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtpdiag.fix.verify.launch import Job, start_torchrun
from support import playbook_runner as pr
from support.jobs_e2e import HEALTHY_STEPS, ROOT, worker_pids
from support.recorder import record

PLAYBOOKS_DIR = Path(ROOT) / "playbooks"
PLAYBOOKS = ("hang-triage.md", "mtp-cp-deadlock.md", "multi-node.md")  # the order they run in
NCCL_WORKER = os.path.join(ROOT, "examples", "nccl_behaviour", "worker.py")
CONFIG = os.path.join(ROOT, "tests", "fixtures", "configs", "ppo_megatron_cp2_pp2.yaml")
CAPTURE = os.path.join("tests", "fixtures", "captures", "mtp_cp_pp", "bundle.json")


def parsed(name: str) -> list[pr.Block]:
    path = PLAYBOOKS_DIR / name
    return pr.parse_playbook(path.read_text(), f"playbooks/{name}")


# ------------------------------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class JobSpec:
    """How to start a job a block names, and when it is ready to be looked at."""

    script: str
    args: tuple[str, ...]
    hung: bool  # ready once stuck; otherwise once it logs progress
    flight_recorder: bool = False
    pipe: bool = False  # the job has a debug-info pipe: its dumps come on request, not by themselves
    nproc: int = 4


# The verl #5895 hang (tp 1, cp 2, pp 2) through the Flight Recorder wrapper, which runs the reproducer unchanged
# and writes torch's FR dump per rank once collectives stop moving: the session's canonical hang
# (support/canonical_hang.py), read here as by the other tests that only read it.
CANONICAL_JOB = "mtp-hang"
JOBS = {
    # Data parallelism at any size: two ranks show progress as well as four. Its steps wait for their data
    # (support/healthy_steps.py) as a training job's do: a job that trains flat out takes a core a rank for as long
    # as `watch` watches it (CI's e2e tier is bound by CPU, docs/design.md).
    "healthy": JobSpec(
        HEALTHY_STEPS, ("--scenario", "healthy", "--steps", "0", "--log-every", "20"), hung=False, nproc=2
    ),
    # The same bug with NCCL's CPU-side behaviour (examples/nccl_behaviour): every rank ends at a host sync in a
    # futex; its Flight Recorder dumps come on request through the debug-info pipe.
    "gpu-hang": JobSpec(
        NCCL_WORKER,
        (
            "--gate",
            "buggy",
            "--cp",
            "2",
            "--pp",
            "2",
            "--sync",
            "futex",
            "--timeout-s",
            "900",
            "--device-step-s",
            "0.3",
            "--no-abort",
        ),
        hung=True,
        flight_recorder=True,
        pipe=True,
    ),
}


class JobPool:
    """Jobs started on first use and killed after the last block that needs them (or at the end); the canonical
    hang is the session's, neither started nor killed here."""

    def __init__(self, tmp: Path, uses: Counter, canonical) -> None:
        self.tmp, self.uses = tmp, uses
        self.canonical = (canonical.job, {"PID": str(canonical.pid), "FR": canonical.fr_prefix})
        self.running: dict[str, tuple[Job, dict[str, str]]] = {}

    def values(self, name: str) -> dict[str, str]:
        """Start ``name`` if needed; the placeholders it fills (``PID``, ``FR``)."""
        if name == CANONICAL_JOB:
            return self.canonical[1]
        if name not in JOBS:
            raise pr.PlaybookError(f"unknown job {name!r}: one of {sorted([CANONICAL_JOB, *JOBS])}")
        if name not in self.running:
            self.running[name] = self._start(name, JOBS[name])
        return self.running[name][1]

    def job(self, name: str) -> Job:
        return self.canonical[0] if name == CANONICAL_JOB else self.running[name][0]

    def done_with(self, name: str) -> None:
        self.uses[name] -= 1
        if self.uses[name] <= 0 and name in self.running:
            self.running.pop(name)[0].kill()

    def close(self) -> None:
        for job, _ in self.running.values():
            job.kill()
        self.running.clear()

    def _start(self, name: str, spec: JobSpec) -> tuple[Job, dict[str, str]]:
        folder = self.tmp / name
        folder.mkdir(exist_ok=True)
        env, values = {}, {}
        if spec.flight_recorder:
            env = record.recorder_env(folder)
            values["FR"] = env["TORCH_FR_DUMP_TEMP_FILE"]
        if spec.pipe:
            os.makedirs(folder / "pipes", exist_ok=True)
            env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] = str(folder / "pipes" / "rank_")
        log = folder / "job.log"
        job = start_torchrun(spec.script, list(spec.args), spec.nproc, env=env, log_path=str(log))
        try:
            if spec.hung:
                job.wait_until_stuck(quiet_s=2.5, timeout=240)
            else:
                job.wait_for_workers(timeout=240)
                _wait_for(lambda: " step " in log.read_text(errors="replace"), f"progress in {log}", 240)
        except BaseException:
            job.kill()
            raise
        values["PID"] = str(job.pid)
        return job, values


def _wait_for(ready, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def pool(tmp_path_factory, canonical_hang):
    uses = Counter(b.job for name in PLAYBOOKS for b in parsed(name) if b.executed and b.job)
    jobs = JobPool(tmp_path_factory.mktemp("playbook-jobs"), uses, canonical_hang)
    try:
        yield jobs
    finally:
        jobs.close()


def collect_as_nodes(job: Job, nodes: int, out: str, env: dict[str, str]) -> None:
    """What a per-node collector (srun, kubectl exec) leaves: one bundle per node, ranks split evenly."""
    by_rank = sorted(worker_pids(job).items())
    per = len(by_rank) // nodes
    for node in range(nodes):
        share = by_rank[node * per : (node + 1) * per]
        args = [arg for _, pid in share for arg in ("--pid", str(pid))]
        done = subprocess.run(
            [sys.executable, "-m", "mtpdiag", "collect", *args, "--host", f"node-{node}", "--out", out + os.sep],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------ the playbooks


def command_env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    env["PATH"] = pr.shim_dir(str(tmp / "bin"), sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def engine_copy(tmp: Path) -> str:
    """A writable copy of verl 0.7.1's engine in a site-packages-like tree (so its version is known)."""
    from support.verl_wheels import ENGINE, verl_root

    tree = tmp / "site-packages"
    shutil.copytree(verl_root("0.7.1"), tree)
    return str(tree / ENGINE)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.verl) if n == "mtp-cp-deadlock.md" else n for n in PLAYBOOKS]
)
def test_playbook_commands_print_what_the_playbook_shows(name, pool, tmp_path):
    blocks = [b for b in parsed(name) if b.executed]
    env = command_env(tmp_path)
    (tmp_path / "dir").mkdir()
    values = {"DIR": str(tmp_path / "dir"), "CONFIG": CONFIG, "REPO": ROOT, "HOST": socket.gethostname()}
    if any("<ENGINE>" in b.text for b in blocks):
        values["ENGINE"] = engine_copy(tmp_path)
    before = set(os.listdir(ROOT))
    failures, ran = [], 0
    for block in blocks:
        block_values = dict(values)
        if block.job:
            block_values.update(pool.values(block.job))
            if block.option("nodes"):
                collect_as_nodes(pool.job(block.job), int(block.option("nodes")), values["DIR"], env)
        try:
            outcomes = pr.run_block(block, block_values, env, ROOT)
        finally:
            if block.job:
                pool.done_with(block.job)
        ran += sum(not o.step.is_exit_code for o in outcomes)
        failures += [pr.describe(block, o) for o in outcomes if o.problems]
    assert not failures, f"{len(failures)} step(s) of playbooks/{name} differ from reality:\n\n" + "\n\n".join(failures)
    assert ran >= 3, "a playbook without commands to run"
    assert set(os.listdir(ROOT)) == before, "a playbook command left files in the repository"


# ------------------------------------------------------------------------------------------ structure


def test_every_playbook_parses_and_the_index_lists_it():
    found = sorted(p.name for p in PLAYBOOKS_DIR.glob("*.md") if p.name != "README.md")
    assert found == sorted(PLAYBOOKS)
    index = (PLAYBOOKS_DIR / "README.md").read_text()
    for name in PLAYBOOKS:
        assert f"]({name})" in index, name
        blocks = parsed(name)
        executed = [b for b in blocks if b.executed]
        assert len(executed) >= len(blocks) - len(executed), f"{name}: at least half the blocks must run in the tests"
        assert all(b.job in (None, CANONICAL_JOB, *JOBS) for b in executed), [b.job for b in executed]
    assert not [b for b in pr.parse_playbook(index, "README.md")]  # the index shows no commands


def mtpdiag_options() -> dict[str, set[str]]:
    """Each subcommand's options, from the CLI itself."""
    import typer.main

    from mtpdiag.cli import app

    group = typer.main.get_command(app)
    return {
        name: {o for p in cmd.params for o in p.opts if o.startswith("--")} | {"--help"}
        for name, cmd in group.commands.items()
    }


def unknown_options(text: str, options: dict[str, set[str]]) -> list[str]:
    """mtpdiag subcommands or options in ``text`` that the CLI does not have."""
    bad = []
    for sub, opts in pr.mtpdiag_calls(text):
        if sub not in options:
            bad.append(f"mtpdiag {sub}")
        bad += [f"mtpdiag {sub} {o}" for o in opts if sub in options and o not in options[sub]]
    return bad


def test_commands_that_are_not_run_still_use_real_subcommands_and_options():
    options = mtpdiag_options()
    for name in PLAYBOOKS:
        text = (PLAYBOOKS_DIR / name).read_text()
        shown = [b.text for b in parsed(name) if not b.executed]
        for block in shown:
            lines = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
            assert any(not ln.startswith("mtpdiag ") for ln in lines), f"{name}: run this block in the tests:\n{block}"
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        assert unknown_options("\n".join(shown + spans), options) == [], name
    # and the check itself can fail
    assert unknown_options("srun -N 2 mtpdiag collect --outdir /x\n`mtpdiag inspct --pid 1`", options) == [
        "mtpdiag collect --outdir",
        "mtpdiag inspct",
    ]


def github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_links_between_playbooks_resolve():
    anchors = {
        name: {github_anchor(h) for h in re.findall(r"^#+ (.+)$", (PLAYBOOKS_DIR / name).read_text(), re.M)}
        for name in (*PLAYBOOKS, "README.md")
    }
    for name in anchors:
        for target, anchor in re.findall(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)", (PLAYBOOKS_DIR / name).read_text()):
            assert target in anchors, (name, target)
            assert not anchor or anchor in anchors[target], (name, target, anchor)


# ------------------------------------------------------------------------------------------ the matcher


@pytest.fixture(scope="module")
def analyze_output() -> str:
    """Real output: mtpdiag analyzing a hang recorded from the MTP reproducer."""
    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "analyze", CAPTURE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    return done.stdout


HEADLINE = (
    "PROBLEM: MTP loss all_reduce on the DP×CP group [2, 3] entered only by cp == 0 ranks (rank 2); "
    "rank 3 (tp0 cp1 pp1) never joined (all_gather in ring_attention): verl #5895 deadlock"
)
FINDING = f"[mtp-cp-gated-reduce] {HEADLINE.removeprefix('PROBLEM: ')}"
SPLIT = (
    "- collective all_reduce at reduce_loss_in_tracker on the DP×CP group [2, 3]: entered by rank 2 "
    "(tp0 cp0 pp1); absent: rank 3 (tp0 cp1 pp1), which is at all_gather in ring_attention. "
    "Entered only where cp == 0: a condition that excludes cp > 0 gates this collective."
)
SHOWN = [HEADLINE, "...", FINDING, "...", SPLIT, "..."]


def test_matcher_accepts_real_output_wrapped_at_any_width(analyze_output):
    assert pr.output_problem(SHOWN, analyze_output, {}) is None
    rewrapped = "\n".join(textwrap.fill(line, 60, break_long_words=False) for line in analyze_output.splitlines())
    assert rewrapped != analyze_output
    narrow = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "analyze", CAPTURE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "100"},
        timeout=120,
    ).stdout
    assert narrow != analyze_output  # rich wrapped it differently
    assert pr.output_problem(SHOWN, narrow, {}) is None
    assert pr.output_problem(SHOWN, rewrapped, {}) is None


@pytest.mark.parametrize(
    "wrong,line",
    [
        (
            [HEADLINE, "...", FINDING.replace("mtp-cp-gated-reduce", "gated-collective"), "...", SPLIT, "..."],
            "[gated-collective]",
        ),
        ([HEADLINE, "...", FINDING, "...", SPLIT.replace("cp == 0", "cp == 1"), "..."], "Entered only where cp == 1"),
        ([HEADLINE.replace("PROBLEM", "OK"), "...", FINDING, "..."], "OK: MTP loss"),
        ([HEADLINE, FINDING, "..."], "[mtp-cp-gated-reduce]"),  # the layout line between them is not shown
    ],
)
def test_matcher_rejects_output_the_playbook_does_not_show(analyze_output, wrong, line):
    problem = pr.output_problem(wrong, analyze_output, {})
    assert problem is not None and line in problem, problem


def test_matcher_rejects_output_past_the_last_shown_line(analyze_output):
    problem = pr.output_problem(SHOWN[:-1], analyze_output, {})
    assert problem is not None and "goes on past" in problem


def test_placeholders_stand_for_their_values_or_any_number():
    out = "wrote /tmp/x/vm.mtpdiag.json (4 ranks) in 2.5 s by pid 4711\n"
    values = {"DIR": "/tmp/x", "HOST": "vm"}
    assert pr.output_problem(["wrote <DIR>/<HOST>.mtpdiag.json (<N> ranks) in <N> s by pid <PID>"], out, values) is None
    assert (
        pr.output_problem(
            ["wrote <DIR>/<HOST>.mtpdiag.json (<N> ranks) in <N> s by pid <PID>"], out, {"DIR": "/tmp/y", "HOST": "vm"}
        )
        is not None
    )
    with pytest.raises(pr.PlaybookError):
        pr.output_problem(["<ENGINE>"], out, values)
    with pytest.raises(pr.PlaybookError):
        pr.substitute("mtpdiag inspect --pid <PID>", values)
    assert pr.output_problem([], "", {}) is None and pr.output_problem([], "x", {}) is not None
    assert pr.output_problem(["..."], "", {}) is None


def _block(text: str) -> pr.Block:
    (block,) = pr.parse_playbook(f"```console\n{text}\n```\n", "t.md")
    return block


def test_runner_checks_exit_codes(tmp_path):
    env, cwd = command_env(tmp_path), ROOT
    wrong_code = _block(f"$ mtpdiag analyze {CAPTURE}\n...\n$ echo $?\n0")
    outcomes = pr.run_block(wrong_code, {}, env, cwd)
    assert outcomes[0].code == 1 and outcomes[0].problems == ()
    assert outcomes[1].problems == ("shown line not found where expected: '0'",)
    unshown_failure = pr.run_block(_block(f"$ mtpdiag analyze {CAPTURE}\n..."), {}, env, cwd)
    assert "exited 1" in unshown_failure[0].problems[0]
    usage_error = pr.run_block(_block("$ mtpdiag analyze /nonexistent\n...\n$ echo $?\n2"), {}, env, cwd)
    assert [o.problems for o in usage_error] == [(), ()]


@pytest.mark.parametrize(
    "text,error",
    [
        ("```bash\nmtpdiag inspect --all\n```\n", "code fence 'bash'"),
        ("<!-- run: mtp-hang -->\n\nsome prose\n```console\n$ true\n```\n", "must come right before"),
        ("```console\noutput first\n$ true\n```\n", "output before the first $ command"),
        ("```console\n$ echo $?\n0\n```\n", "with no command before it"),
        ("<!-- run: nodes=2 -->\n```console\n$ true\n```\n", "names a job first"),
        ("```console\n$ true\n", "unterminated"),
    ],
)
def test_parser_refuses_blocks_outside_the_convention(text, error):
    with pytest.raises(pr.PlaybookError, match=re.escape(error)):
        pr.parse_playbook(text, "t.md")


def test_parser_reads_commands_outputs_and_directives():
    (block,) = pr.parse_playbook(
        "<!-- run: mtp-hang nodes=2 -->\n```console\n$ mtpdiag analyze \\\n  <DIR>\n"
        "PROBLEM: x\n...\n$ echo $?\n1\n```\n",
        "t.md",
    )
    assert (block.job, block.option("nodes"), block.line) == ("mtp-hang", "2", 2)
    assert [(s.command, s.expected) for s in block.steps] == [
        ("mtpdiag analyze <DIR>", ("PROBLEM: x", "...")),
        ("echo $?", ("1",)),
    ]
