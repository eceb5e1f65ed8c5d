"""Score ``mtpdiag analyze`` on public hang incidents: right, partly, wrong, refused, or called ok.

Usage (from the repository root, the package installed):

    python benchmarks/accuracy/score.py                    # the table and the totals
    python benchmarks/accuracy/score.py --only ID [ID ...] # some incidents
    python benchmarks/accuracy/score.py --markdown docs/accuracy.md
    python benchmarks/accuracy/score.py --write-baseline   # record today's right cases (never drops one)

Each incident is a directory of ``incidents/`` with the text as posted and an ``incident.json`` (provenance,
the root cause the thread established, the expected diagnosis and the analyze arguments). The rules are in
``benchmarks/accuracy/README.md``; ``classify`` is the one place they are coded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
INCIDENTS = HERE / "incidents"
BASELINE = HERE / "baseline.json"
ROOT = HERE.parent.parent
RESULTS = ("right", "partly", "wrong", "refused", "called ok")
ANSWERED = (0, 1, 4)  # ok, problem, incomplete: every other exit code is a refusal
BLAMING = frozenset({"straggler", "frozen-rank", "missing-rank", "p2p-unmatched"})
TIMEOUT_S = 120


class Incident(NamedTuple):
    id: str
    path: Path
    meta: dict[str, Any]

    @property
    def expected(self) -> dict[str, Any]:
        return dict(self.meta.get("expected", {}))

    @property
    def args(self) -> list[str]:
        return [str(a) for a in self.meta.get("args", [])]


class Run(NamedTuple):
    code: int
    report: dict[str, Any] | None
    error: str  # the last stderr line when the run gave no report


class Score(NamedTuple):
    result: str  # one of RESULTS
    said: str  # what mtpdiag said, in one short line
    why: str  # which checks passed or failed


# ---------------------------------------------------------------- incidents and runs


def incidents(only: Sequence[str] = ()) -> list[Incident]:
    found = []
    for file in sorted(INCIDENTS.glob("*/incident.json")):
        meta = json.loads(file.read_text(encoding="utf-8"))
        if not only or file.parent.name in only:
            found.append(Incident(file.parent.name, file.parent, meta))
    return found


def run(incident: Incident, python: str = sys.executable) -> Run:
    """``python -m mtpdiag analyze ARGS --json`` in the incident's directory (its file names are relative)."""
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    command = [python, "-m", "mtpdiag", "analyze", *incident.args, "--json"]
    try:
        done = subprocess.run(
            command, cwd=incident.path, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return Run(-1, None, f"no answer within {TIMEOUT_S} s")
    lines = done.stderr.strip().splitlines()
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        report = None
    return Run(done.returncode, report, lines[-1] if lines else "")


# ---------------------------------------------------------------- what a report says


def root_split(report: dict[str, Any]) -> dict[str, Any] | None:
    """The split collective the report calls the root (else its first split)."""
    splits = report.get("mismatches") or []
    return next((m for m in splits if m.get("role") == "root"), splits[0] if splits else None)


def first_finding(report: dict[str, Any]) -> dict[str, Any] | None:
    findings = report.get("findings") or []
    return findings[0] if findings else None


def words(report: dict[str, Any]) -> str:
    """What the report's findings say to a person, lower-cased: their summaries and remedies (the notes, on
    what is missing from the input, are not a diagnosis and do not count)."""
    parts = [str(f.get(k) or "") for f in report.get("findings") or [] for k in ("summary", "remedy")]
    return " ".join(parts).lower()


def _site_text(site: dict[str, Any] | None) -> str:
    if not site:
        return ""
    return f"{site.get('function', '')} {site.get('file', '')}:{site.get('line', '')}"


def names_site(report: dict[str, Any], site: str) -> bool:
    """Whether the report places some rank at ``site`` (a function name or file:line, as a substring)."""
    where = [_site_text(s.get("site")) for s in report.get("sites") or []]
    where += [_site_text(m.get("site")) for m in report.get("mismatches") or []]
    return any(site in w for w in where) or site.lower() in words(report)


def said(report: dict[str, Any] | None, run_: Run) -> str:
    if report is None:
        return f"exit {run_.code}: {run_.error}"[:160]
    finding = first_finding(report)
    head = f"{report.get('verdict')}" + (f" [{finding.get('id')}]" if finding else "")
    split = root_split(report)
    if split:
        where = _site_text(split.get("site")).split(" ")[0]
        head += f" {split.get('op')} at {where} on {split.get('group')}, absent {split.get('absent')}"
    return head[:160]


# ---------------------------------------------------------------- the rules (README.md)


def problem_checks(expected: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, bool]]:
    """Each part of an expected problem that is stated, and whether the report's root matches it."""
    split = root_split(report) or {}
    finding = first_finding(report) or {}
    checks: list[tuple[str, bool]] = []
    if "site" in expected:
        hit = expected["site"] in _site_text(split.get("site")) if split else expected["site"] in words(report)
        checks.append(("site", hit))
    for side in ("entered", "absent"):
        if side in expected:
            checks.append((side, sorted(split.get(side) or []) == sorted(expected[side])))
    if "wait_site" in expected:
        checks.append(("wait site", names_site(report, expected["wait_site"])))
    if "group" in expected:
        checks.append(("group", split.get("group") == expected["group"]))
    if "finding" in expected:
        checks.append(("finding", finding.get("id") in _as_list(expected["finding"])))
    if "culprit_ranks" in expected:
        blamed = [set(f.get("ranks") or []) for f in report.get("findings") or [] if f.get("id") in BLAMING]
        want = set(expected["culprit_ranks"])
        checks.append(("culprits", want == set(split.get("absent") or []) or want in blamed))
    if "culprit_pids" in expected:
        checks.append(("culprit pids", blames_pids(report, expected["culprit_pids"])))
    return checks


def blames_pids(report: dict[str, Any], pids: Sequence[int]) -> bool:
    """Whether the report blames the processes ``pids`` (for pastes that name no rank): the ranks of a
    blaming finding or of the root's absent side are these pids, or the findings name the pids."""
    split = root_split(report) or {}
    blamed = {r for f in report.get("findings") or [] if f.get("id") in BLAMING for r in f.get("ranks") or []}
    blamed |= set(split.get("absent") or [])
    by_rank = {v.get("rank"): v.get("pid") for v in report.get("ranks") or []}
    named = {by_rank.get(r) for r in blamed}
    text = words(report)
    return set(pids) <= named or all(f"pid {p}" in text for p in pids)


def next_step_named(expected: dict[str, Any], report: dict[str, Any]) -> bool:
    text = words(report)
    return any(step.lower() in text for step in _as_list(expected.get("next_step", [])))


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _passed(checks: Iterable[tuple[str, bool]]) -> str:
    return ", ".join(f"{name} {'ok' if hit else 'no'}" for name, hit in checks)


def classify(expected: dict[str, Any], run_: Run) -> Score:
    """The score of one run against the expected diagnosis (the rules of README.md, in this order)."""
    report = run_.report
    if run_.code not in ANSWERED or report is None:
        return Score("refused", said(report, run_), "no report")
    verdict = report.get("verdict")
    if verdict == "ok":
        return Score("called ok", said(report, run_), "a hung job called ok")
    if expected.get("verdict") == "problem":
        return _against_problem(expected, report, run_)
    return _against_incomplete(expected, report, run_)


def _against_problem(expected: dict[str, Any], report: dict[str, Any], run_: Run) -> Score:
    if report.get("verdict") == "problem":
        checks = problem_checks(expected, report)
        hits = sum(hit for _, hit in checks)
        result = "right" if hits == len(checks) else "partly" if hits else "wrong"
        return Score(result, said(report, run_), _passed(checks))
    located = "site" in expected and names_site(report, expected["site"])
    helped = next_step_named(expected, report)
    result = "partly" if located or helped else "wrong"
    return Score(result, said(report, run_), f"incomplete where a problem is known; site named {located}")


def _against_incomplete(expected: dict[str, Any], report: dict[str, Any], run_: Run) -> Score:
    finding = first_finding(report) or {}
    if report.get("verdict") == "problem":
        if finding.get("id") in _as_list(expected.get("also_right", [])):
            return Score("right", said(report, run_), f"{finding.get('id')} is an accepted reading")
        split = root_split(report)
        plausible = "site" in expected and split is not None and expected["site"] in _site_text(split.get("site"))
        why = "a culprit stated where the evidence cannot name one"
        return Score("partly" if plausible else "wrong", said(report, run_), why + ("; at the right site" * plausible))
    located = "site" not in expected or names_site(report, expected["site"])
    helped = next_step_named(expected, report)
    result = "right" if located and helped else "partly"
    return Score(result, said(report, run_), f"next step named {helped}; site named {located}")


# ---------------------------------------------------------------- the table


def score_all(chosen: list[Incident], python: str, jobs: int) -> list[tuple[Incident, Score]]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(lambda i: run(i, python), chosen))
    return [(i, classify(i.expected, r)) for i, r in zip(chosen, runs, strict=True)]


def totals(scored: Sequence[tuple[Incident, Score]]) -> dict[str, int]:
    counts = dict.fromkeys(RESULTS, 0)
    for _, s in scored:
        counts[s.result] += 1
    return counts


_SHOWN = ("op", "site", "group", "entered", "absent", "finding", "culprit_ranks", "culprit_pids", "wait_site")


def _expected_text(expected: dict[str, Any]) -> str:
    if expected.get("verdict") == "problem":
        return "problem: " + ", ".join(f"{k.replace('_', ' ')} {expected[k]}" for k in _SHOWN if k in expected)
    return "incomplete" + (f" at {expected['site']}" if "site" in expected else "")


def _input_text(incident: Incident) -> str:
    if "--log" in incident.args:
        return "watchdog log"
    files = [a for a in incident.args if not a.startswith("-") and (incident.path / a).is_file()]
    return f"stacks, {len(files)} file{'s' if len(files) != 1 else ''}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def print_table(scored: Sequence[tuple[Incident, Score]]) -> None:
    for incident, s in scored:
        print(f"{s.result:>9}  {incident.id}")
        print(f"{'':>11}expected: {_expected_text(incident.expected)}")
        print(f"{'':>11}mtpdiag:  {s.said}")
        print(f"{'':>11}checks:   {s.why}")
    print("totals: " + ", ".join(f"{n} {k}" for k, n in totals(scored).items()) + f" (of {len(scored)})")


def _commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--", "mtpdiag") else "")


def markdown(scored: Sequence[tuple[Incident, Score]]) -> str:
    counts = totals(scored)
    rows = [
        f"| [{i.id}]({i.meta.get('source', {}).get('url', '')}) | {_input_text(i)} | "
        f"{_cell(_expected_text(i.expected))} | {_cell(s.said)} | **{s.result}** |"
        for i, s in scored
    ]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    return "\n".join(
        [
            f"Run on {when} at commit {_commit()}: `python benchmarks/accuracy/score.py --markdown docs/accuracy.md`.",
            "",
            "| incident | input | expected | mtpdiag said | score |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"**Totals** (of {len(scored)}): " + ", ".join(f"{n} {k}" for k, n in counts.items()) + ".",
            "",
        ]
    )


def write_markdown(path: Path, table: str) -> None:
    """Replace the text between the table markers of ``path`` (or write the table alone)."""
    start, end = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"
    old = path.read_text(encoding="utf-8") if path.exists() else f"{start}\n{end}\n"
    head, _, rest = old.partition(start)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{start}\n{table}{end}{tail}", encoding="utf-8")


# ---------------------------------------------------------------- the baseline


def read_baseline() -> dict[str, Any]:
    return json.loads(BASELINE.read_text(encoding="utf-8")) if BASELINE.exists() else {"right": []}


def unanswered(scored: Sequence[tuple[Incident, Score]], baseline: dict[str, Any]) -> list[str]:
    """Incidents refused or called ok that the baseline does not list as known failures of another part."""
    known = baseline.get("known_failures", {})
    return [i.id for i, s in scored if s.result in ("refused", "called ok") and i.id not in known]


def downgrades(scored: Sequence[tuple[Incident, Score]], baseline: dict[str, Any]) -> list[str]:
    """Incidents the baseline records as right that are no longer right (or no longer scored)."""
    now = {i.id: s.result for i, s in scored}
    return [i for i in baseline.get("right", []) if now.get(i, "missing") != "right"]


def write_baseline(scored: Sequence[tuple[Incident, Score]], drop: Sequence[str]) -> list[str]:
    """Record today's right cases on top of the baseline's. A case that was right and is not right now stays
    in the baseline unless named in ``drop``: returns those, and writes nothing while any is left."""
    baseline = read_baseline()
    lost = [i for i in downgrades(scored, baseline) if i not in drop]
    if lost:
        return lost
    right = {i.id for i, s in scored if s.result == "right"} | set(baseline.get("right", []))
    kept = sorted(right - set(drop))
    known = baseline.get("known_failures", {})
    BASELINE.write_text(json.dumps({"right": kept, "known_failures": known}, indent=1) + "\n", encoding="utf-8")
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=(), help="score these incident ids only")
    parser.add_argument("--markdown", type=Path, help="write the table into this file (between its markers)")
    parser.add_argument("--write-baseline", action="store_true", help="record the right cases in baseline.json")
    parser.add_argument("--drop", nargs="+", default=(), help="with --write-baseline: accept these downgrades")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs mtpdiag")
    parser.add_argument("--jobs", type=int, default=2, help="incidents analyzed at once")
    args = parser.parse_args(argv)
    scored = score_all(incidents(args.only), args.python, args.jobs)
    print_table(scored)
    if args.markdown:
        write_markdown(args.markdown, markdown(scored))
    if args.write_baseline:
        lost = write_baseline(scored, args.drop)
        if lost:
            print(f"not written: right in the baseline and not right now: {', '.join(lost)} (--drop ID to accept)")
            return 1
    baseline = read_baseline()
    lost = downgrades(scored, baseline) if not args.only else []
    bad = unanswered(scored, baseline)
    for what, ids in (("downgraded from the baseline", lost), ("refused or called ok", bad)):
        if ids:
            print(f"{what}: {', '.join(ids)}")
    return 1 if lost or bad else 0


if __name__ == "__main__":
    sys.exit(main())
