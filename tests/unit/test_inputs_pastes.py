"""Every paste form read from its real recording, and every mangled variant read the same as the original.

The recordings are real hung jobs (tests/fixtures/record_pastes.py): py-spy text (plain, --locals,
--native), py-spy --subprocesses of the torchrun agent, faulthandler, pystack (plain, --native). The
variants are made here, mechanically, from those files: reindented, CRLF, colour, prompt lines, log
prefixes, joined into one file, identical stacks grouped. A variant must give the same captures (same
ranks, same frames) and, through ``diagnose`` with the scenario's layout, the same findings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpdiag.analysis import diagnose
from mtpdiag.inputs import load_paths, read_inputs
from mtpdiag.vocabulary.stacks import KEPT_ARGS
from support import pastes as P

SCENARIOS = P.scenarios()
pytestmark = pytest.mark.skipif(not SCENARIOS, reason="no recorded pastes (run tests/fixtures/record_pastes.py)")
CASES = [(s, f) for s in SCENARIOS for f in P.FORMS]


def _captures(snapshot) -> dict:
    """rank -> (pid, threads as (name, frames)): what 'the same captures' means."""
    return {c.rank: (c.pid, tuple((t.name, t.frames) for t in c.threads)) for c in snapshot.captures}


def _findings(snapshot, scenario: str) -> list:
    report = diagnose(P.with_world_size(snapshot, P.meta(scenario)["world_size"]), P.layout(scenario))
    return [(f.id, f.ranks) for f in report.findings]


def _python_frames(capture) -> list:
    return [(f.function, f.line) for f in capture.main_thread.frames if not f.native]


# ---------------------------------------------------------------- each recorded form


@pytest.mark.parametrize("scenario,form", CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_each_recorded_form_reads_every_rank_with_frames(scenario, form):
    paths = P.files(scenario, form)
    meta = P.meta(scenario)
    snapshot = load_paths(P.names(paths))
    assert [c.rank for c in snapshot.captures] == [P.rank_of(p) for p in paths]
    failed = {int(name[4 : name.index(".")]) for name in meta.get("failed_captures", {}) if f".{form}." in name}
    for c in snapshot.captures:
        if c.rank in failed:  # a real failed capture (py-spy --native on the SIGSTOPped rank)
            assert c.state == "unreadable" and c.error and not c.threads
            continue
        assert c.state == "unknown" and c.error is None and c.main_thread.frames
        if form != "faulthandler":  # faulthandler names no pid; the others name the real one
            assert c.pid == meta["pids"][str(c.rank)]
        native = [f for f in c.main_thread.frames if f.native]
        assert bool(native) == form.endswith("native")
        assert all(not f.file.endswith(".py") for f in native)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_forms_agree_on_the_python_frames(scenario):
    """py-spy, faulthandler and pystack of the same hung ranks: same lines, innermost first, whatever the
    order each tool prints (pystack innermost last) and whether it interleaves C frames."""
    plain = {c.rank: c for c in load_paths(P.names(P.files(scenario, "pyspy"))).captures}
    for form in P.FORMS[1:]:
        for c in load_paths(P.names(P.files(scenario, form))).captures:
            if not c.threads:
                continue  # a failed capture: test_each_recorded_form_reads_every_rank_with_frames
            assert [line for _, line in _python_frames(c)] == [line for _, line in _python_frames(plain[c.rank])], (
                form,
                c.rank,
            )
            # pystack and faulthandler print bare names where py-spy prints qualified ones
            assert [f.split(".")[-1] for f, _ in _python_frames(c)] == [
                f.split(".")[-1] for f, _ in _python_frames(plain[c.rank])
            ], (form, c.rank)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_locals_keep_only_the_whitelisted_torch_arguments(scenario):
    for c in load_paths(P.names(P.files(scenario, "locals"))).captures:
        for t in c.threads:
            for f in t.frames:
                assert not f.args or "torch/distributed/" in f.file
                assert f.args is None or {name for name, _ in f.args.items()} <= set(KEPT_ARGS)


def test_the_send_peer_is_read_from_locals_and_kept_when_merged_with_the_native_dump(tmp_path):
    """``py-spy dump --locals`` then ``--native`` of one pid pasted into one file: one process, the native
    stack (it interleaves both), the dst of the send kept from the Python dump, and a note saying so."""
    scenario = "mtp_cp_pp"
    rank0 = [p for p in P.files(scenario, "locals") if P.rank_of(p) == 0][0]
    native = [p for p in P.files(scenario, "native") if P.rank_of(p) == 0][0]
    both = P.written(tmp_path, "rank0.txt", rank0.read_text() + "\n" + native.read_text())
    inputs = read_inputs([both])
    (capture,) = inputs.snapshot.captures
    assert capture.rank == 0 and any(f.native for f in capture.main_thread.frames)
    send = next(f for f in capture.main_thread.frames if f.function == "send")
    assert send.arg("dst") == 2
    assert (
        len(inputs.notes) == 1 and "native" in inputs.notes[0] and str(P.meta(scenario)["pids"]["0"]) in inputs.notes[0]
    )
    alone = load_paths([str(native)]).captures[0]
    assert [f for f in capture.main_thread.frames if f.native] == [f for f in alone.main_thread.frames if f.native]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_agents_subprocess_dump_gives_the_workers_not_the_agent(scenario):
    meta = P.meta(scenario)
    snapshot = load_paths([str(P.PASTES / scenario / "agent.txt")])
    plain = {c.pid: c for c in load_paths(P.names(P.files(scenario, "pyspy"))).captures}
    assert sorted(c.pid for c in snapshot.captures) == sorted(meta["pids"].values())
    assert meta["agent_pid"] not in {c.pid for c in snapshot.captures}
    for c in snapshot.captures:
        assert c.main_thread.frames == plain[c.pid].main_thread.frames
        assert dict(c.layout_hints) == {k: v for k, v in meta["layout"].items() if v > 1}


# ---------------------------------------------------------------- mangled variants, one file per rank


def _command(path) -> str:
    """The command that printed a recorded file, as its prompt line shows it (the real pid)."""
    form = path.name.split(".")[1]
    pid = P.meta(path.parent.name)["pids"][str(P.rank_of(path))]
    return {
        "pyspy": f"py-spy dump --pid {pid}",
        "locals": f"py-spy dump --locals --pid {pid}",
        "native": f"sudo py-spy dump --native -p {pid}",
        "pystack": f"pystack remote {pid}",
        "pystack-native": f"pystack remote --native {pid}",
        "faulthandler": f"kill -USR1 {pid}; cat /tmp/faulthandler-{pid}.txt",
    }[form]


LINEWISE = {
    "tabs": lambda text, _path: P.reindent(text, "tabs"),
    "two-spaces": lambda text, _path: P.reindent(text, "two"),
    "no-indent": lambda text, _path: P.reindent(text, "none"),
    "crlf": lambda text, _path: P.crlf(text),
    "colour": lambda text, _path: P.coloured(text),
    "prompt": lambda text, path: P.prompted(text, _command(path)),
    "torch-prefix": lambda text, path: P.prefixed(text, f"[rank{P.rank_of(path)}]: "),
    "all-at-once": lambda text, path: P.crlf(P.coloured(P.reindent(P.prompted(text, _command(path)), "two"))),
}
VARIANT_CASES = [(s, f, v) for s, f in CASES for v in LINEWISE]


@pytest.mark.parametrize("scenario,form,variant", VARIANT_CASES, ids=[f"{s}-{f}-{v}" for s, f, v in VARIANT_CASES])
def test_a_mangled_paste_reads_as_the_recording(tmp_path, scenario, form, variant):
    paths = P.files(scenario, form)
    original = load_paths(P.names(paths))
    mangled = [P.written(tmp_path, p.name, LINEWISE[variant](p.read_text(), p)) for p in paths]
    again = load_paths(mangled)
    assert _captures(again) == _captures(original)
    assert _findings(again, scenario) == _findings(original, scenario)


# ---------------------------------------------------------------- several ranks in one file

JOINABLE = [(s, f) for s, f in CASES]


@pytest.mark.parametrize("scenario,form", JOINABLE, ids=[f"{s}-{f}" for s, f in JOINABLE])
def test_rank_files_joined_into_one_paste_read_as_the_separate_files(tmp_path, scenario, form):
    paths = P.files(scenario, form)
    original = load_paths(P.names(paths))
    one = P.written(tmp_path, "ticket.txt", P.joined(paths))
    again = load_paths([one])
    assert _captures(again) == _captures(original)
    assert _findings(again, scenario) == _findings(original, scenario)


@pytest.mark.parametrize("scenario,form", JOINABLE, ids=[f"{s}-{f}" for s, f in JOINABLE])
def test_a_joined_paste_of_torch_prefixed_logs_reads_as_the_separate_files(tmp_path, scenario, form):
    paths = P.files(scenario, form)
    text = "".join(P.prefixed(p.read_text(), f"[rank{P.rank_of(p)}]: ") + "\n" for p in paths)
    again = load_paths([P.written(tmp_path, "job.log", text)])
    assert _captures(again) == _captures(load_paths(P.names(paths)))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_grouped_stacks_give_one_capture_per_header_with_the_stack(tmp_path, scenario):
    paths = P.files(scenario, "pyspy")
    original = load_paths(P.names(paths))
    grouped = load_paths([P.written(tmp_path, "grouped.txt", P.grouped(paths))])
    main = {c.rank: (c.pid, c.main_thread.frames) for c in original.captures}
    assert {c.rank: (c.pid, c.main_thread.frames) for c in grouped.captures} == main
    assert _findings(grouped, scenario) == _findings(original, scenario)
    unnamed = load_paths([P.written(tmp_path, "grouped-no-ranks.txt", P.grouped(paths, prefix_rank=False))])
    assert sorted(((c.pid, c.main_thread.frames) for c in unnamed.captures), key=lambda v: v[0]) == sorted(
        main.values(), key=lambda v: v[0]
    )


# ---------------------------------------------------------------- bare frame lines


def _frame_lines(text: str, pattern: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if re.search(pattern, line)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_top_frames_pasted_without_a_header_are_read(tmp_path, scenario):
    """The first frames of a recorded dump, alone, in each shape people copy them."""
    for form, pattern, keep in (
        ("pyspy", r"^\s+\S.* \(.*:\d+\)$", lambda lines: lines[:3]),
        ("faulthandler", r'^\s+File ".*", line \d+ in ', lambda lines: lines[:3]),
        ("pystack", r"\(Python\) File ", lambda lines: lines[-3:]),
    ):
        plain = {c.rank: c for c in load_paths(P.names(P.files(scenario, form))).captures}
        for path in P.files(scenario, form):
            lines = keep(_frame_lines(path.read_text(), pattern))
            if form == "pystack":  # a traceback's shape: innermost last, 'File "f.py", line 12, in f'
                lines = [line.replace("(Python) ", "") for line in lines]
            snippet = P.written(
                tmp_path,
                f"rank{P.rank_of(path)}-{form}.txt",
                f"top frames of rank {P.rank_of(path)}:\n" + "\n".join(lines) + "\n",
            )
            (capture,) = load_paths([snippet]).captures
            whole = [f for f in plain[P.rank_of(path)].main_thread.frames if not f.native]
            assert capture.rank == P.rank_of(path) and capture.main_thread.frames == tuple(whole[:3]), (form, path)


# ---------------------------------------------------------------- public pastes (benchmarks/accuracy/incidents)

INCIDENTS = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy" / "incidents"


def _incident_file(incident: str, name: str) -> str:
    """A paste as posted publicly; its source and what was trimmed are in the incident's incident.json."""
    return str(INCIDENTS / incident / name)


def test_a_tools_own_prefixed_line_before_the_first_dump_names_its_rank():
    """sglang's watchdog logs '[date TP0] Pyspy dump for PID N:' and then py-spy's own, unprefixed, text
    (whose process title, sglang::scheduler_None, names no rank): the line leads into the first process."""
    (capture,) = load_paths([_incident_file("sglang-4257-tp0-watchdog-pyspy", "tp0.log")]).captures
    assert capture.rank == 0 and capture.pid == 2696393 and capture.error is None
    assert [f.function for f in capture.main_thread.frames[:3]] == ["wait", "get", "resolve_batch_result"]
    assert len(capture.threads) == 4


def test_stacked_log_prefixes_are_all_taken_off_and_the_one_next_to_the_text_names_the_rank():
    """'[date] worker-0 >> [rank0]:   File ...': a runner's prefixes in front of torch's, then indentation."""
    (capture,) = load_paths([_incident_file("deepspeed-7044-zero2-traceback-prefixed", "worker0.log")]).captures
    assert capture.rank == 0
    assert [(f.function, f.line) for f in capture.main_thread.frames] == [  # innermost first
        ("allreduce_bucket", 1502),
        ("allreduce_and_copy_with_multiple_ranks", 1012),
        ("allreduce_and_scatter", 1039),
        ("average_tensor", 1131),
    ]
    assert capture.main_thread.frames[0].file == "deepspeed/runtime/zero/stage_1_and_2.py"


def test_a_traceback_indented_behind_torchs_rank_prefix_is_frame_lines():
    (capture,) = load_paths([_incident_file("deepspeed-7568-fp16-scheduler-traceback", "rank3.log")]).captures
    assert capture.rank == 3
    assert capture.main_thread.frames[0].function == "allreduce_and_copy_with_multiple_ranks"
    assert capture.main_thread.frames[-1].function == "independent_gradient_partition_epilogue"


def test_code_with_a_shift_is_not_a_log_prefix_but_a_runner_name_is():
    from mtpdiag.inputs.lines import clean_lines

    assert [(line.prefix, line.body) for line in clean_lines("x >> 2\nnode-3 >> Thread 7 (idle)")] == [
        ("", "x >> 2"),
        ("node-3 >>", "Thread 7 (idle)"),
    ]
