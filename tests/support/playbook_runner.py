"""Run the commands a playbook shows and compare their output with the output it shows.

The convention (playbooks/README.md):

* A fenced block tagged ``console`` is executed. A line starting with ``$ `` is a command (a trailing
  ``\\`` continues it on the next line); the lines after it, up to the next command, are the output
  the reader should see (stdout and stderr, as a terminal interleaves them).
* In the shown output a line holding only ``...`` stands for any output (also none); every other line
  must appear, in order, with nothing unshown in between. Whitespace is compared collapsed, because
  the console report wraps long lines at the terminal's width, and the horizontal rules of tables
  count as one character, because they stretch with their cells.
* ``$ echo $?`` prints the exit code of the command before it. A command that is not followed by one
  must exit 0.
* Placeholders: in commands, ``<PID>``, ``<DIR>``, ``<ENGINE>``, ``<FR>``, ``<CONFIG>`` are replaced
  by values the test supplies. In output those, and ``<REPO>`` and ``<HOST>``, stand for their values;
  ``<PID>`` stands for any process id, ``<N>`` for any number (timings, counts) and ``<RECORDED>`` for
  the checkout a recorded fixture was made in (any absolute path).
* An HTML comment ``<!-- run: JOB key=value ... -->`` on the line before a block names the job the
  block runs against; what a job is, is the test's business.
* A block tagged ``sh not-executed`` needs what a test machine lacks (a cluster, a GPU, Ray). It is
  shown, not run; :func:`mtpdiag_calls` lets the test check the options its mtpdiag commands use.
  Any other fence is an error, so no command escapes the tests by accident.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

EXECUTED = "console"
NOT_EXECUTED = "sh not-executed"
ANY = "..."
EXIT_CODE = "echo $?"
PLACEHOLDER = re.compile(r"<(PID|N|DIR|ENGINE|FR|CONFIG|REPO|HOST|RECORDED)>")
# In shown output: placeholders that stand for a kind of value, not one value.
PATTERNS = {"PID": r"\d+", "N": r"\d+(?:\.\d+)?", "RECORDED": r"/[^\s:]*"}
_DIRECTIVE = re.compile(r"^<!--\s*run:\s*(.*?)\s*-->$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RULE = re.compile(r"([─━═┄┅┈┉╌╍])\1+")


class PlaybookError(ValueError):
    """A playbook that breaks the convention."""


@dataclass(frozen=True)
class Step:
    """One ``$ command`` and the output shown under it."""

    command: str
    expected: tuple[str, ...]
    line: int

    @property
    def is_exit_code(self) -> bool:
        return self.command == EXIT_CODE


@dataclass(frozen=True)
class Block:
    """A fenced block of a playbook."""

    path: str
    line: int
    executed: bool
    text: str
    job: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    steps: tuple[Step, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def option(self, key: str, default: str | None = None) -> str | None:
        return dict(self.options).get(key, default)


@dataclass(frozen=True)
class Outcome:
    """What one step printed, and how it differs from what the playbook shows."""

    step: Step
    command: str  # as run, placeholders replaced
    code: int | None
    output: str
    problems: tuple[str, ...] = field(default=())


# ------------------------------------------------------------------------------------------ parsing


def parse_playbook(text: str, path: str = "<playbook>") -> list[Block]:
    """Every fenced block of a playbook, with its directive and steps."""
    lines = text.splitlines()
    blocks, i, directive = [], 0, None
    while i < len(lines):
        stripped = lines[i].strip()
        match = _DIRECTIVE.match(stripped)
        if match:
            directive = (match.group(1), i + 1)
            i += 1
            continue
        if not stripped.startswith("```"):
            if stripped and directive is not None:
                raise PlaybookError(f"{path}:{directive[1]}: a run directive must come right before a ```console block")
            i += 1
            continue
        info, start = stripped[3:].strip(), i + 1
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise PlaybookError(f"{path}:{start}: unterminated code fence")
        body = lines[i + 1 : end]
        if info == EXECUTED:
            job, options = _directive(directive[0], path, directive[1]) if directive else (None, ())
            blocks.append(Block(path, start, True, "\n".join(body), job, options, _steps(body, start, path)))
        elif info == NOT_EXECUTED:
            if directive is not None:
                raise PlaybookError(f"{path}:{directive[1]}: a run directive before a block that is not executed")
            blocks.append(Block(path, start, False, "\n".join(body)))
        else:
            raise PlaybookError(
                f"{path}:{start}: code fence {info!r}: use ```{EXECUTED} (run by the tests) "
                f"or ```{NOT_EXECUTED} (needs a cluster or a GPU)"
            )
        directive, i = None, end + 1
    return blocks


def _directive(text: str, path: str, line: int) -> tuple[str, tuple[tuple[str, str], ...]]:
    words = text.split()
    if not words or "=" in words[0]:
        raise PlaybookError(f"{path}:{line}: a run directive names a job first: <!-- run: JOB key=value -->")
    options = []
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise PlaybookError(f"{path}:{line}: run directive option {word!r} is not key=value")
        options.append((key, value))
    return words[0], tuple(options)


def _steps(body: Sequence[str], first_line: int, path: str) -> tuple[Step, ...]:
    steps: list[Step] = []
    command: list[str] = []
    expected: list[str] = []
    line = 0
    for offset, raw in enumerate(body, start=first_line + 1):
        if command and command[-1].endswith("\\"):
            command[-1] = command[-1][:-1].rstrip()
            command.append(raw.strip())
            continue
        if raw.startswith("$ "):
            if command:
                steps.append(Step(" ".join(command), tuple(expected), line))
            command, expected, line = [raw[2:].strip()], [], offset
        elif not command:
            raise PlaybookError(f"{path}:{offset}: output before the first $ command")
        else:
            expected.append(raw.rstrip())
    if not command:
        raise PlaybookError(f"{path}:{first_line}: a ```{EXECUTED} block without a $ command")
    steps.append(Step(" ".join(command), tuple(expected), line))
    if steps[0].is_exit_code:
        raise PlaybookError(f"{path}:{steps[0].line}: $ {EXIT_CODE} with no command before it")
    return tuple(steps)


# ------------------------------------------------------------------------------------------ matching


def normalise(text: str) -> str:
    """Output as compared: no colour codes, table rules one character wide, whitespace collapsed."""
    return " ".join(_RULE.sub(r"\1", _ANSI.sub("", text)).split())


def expectation(expected: Sequence[str], values: Mapping[str, str]) -> re.Pattern:
    """A regex over normalised output for the shown output (``...`` lines and placeholders resolved)."""
    segments: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == ANY:
            segments.append([])
        else:
            segments[-1].append(line)
    opens_any, closes_any = not segments[0], not segments[-1]
    parts = [_segment(seg, values) for seg in segments if seg]
    if not parts:
        return re.compile(r"(?s).*" if len(segments) > 1 else r"")
    body = r"(?: .*?)? ".join(parts)
    return re.compile(("(?s)(?:.*? )?" if opens_any else "(?s)") + body + (r"(?: .*)?" if closes_any else ""))


def _segment(lines: Sequence[str], values: Mapping[str, str]) -> str:
    text = normalise("\n".join(lines))
    out, pos = [], 0
    for match in PLACEHOLDER.finditer(text):
        out.append(re.escape(text[pos : match.start()]))
        name = match.group(1)
        if name in PATTERNS:
            out.append(PATTERNS[name])
        elif name in values:
            out.append(re.escape(normalise(values[name])))
        else:
            raise PlaybookError(f"no value for <{name}> in the shown output")
        pos = match.end()
    out.append(re.escape(text[pos:]))
    return "".join(out)


def output_problem(expected: Sequence[str], actual: str, values: Mapping[str, str]) -> str | None:
    """None when ``actual`` is what the playbook shows; else which shown line is not there."""
    got = normalise(actual)
    if expectation(expected, values).fullmatch(got):
        return None
    # Find the first shown line that breaks the match, for a useful message.
    for n in range(1, len(expected) + 1):
        head = list(expected[:n])
        if head[-1].strip() == ANY:
            continue
        if not expectation([*head, ANY], values).fullmatch(got):
            return f"shown line not found where expected: {head[-1].strip()!r}"
    return "the output goes on past what the playbook shows (end the block with a '...' line if that is fine)"


# ------------------------------------------------------------------------------------------ running


def substitute(command: str, values: Mapping[str, str]) -> str:
    """A command with its placeholders replaced; a placeholder without a value is an error."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name == "N" or name not in values:
            raise PlaybookError(f"no value for <{name}> in command {command!r}")
        return values[name]

    return PLACEHOLDER.sub(value, command)


def run_block(
    block: Block, values: Mapping[str, str], env: Mapping[str, str], cwd: str, timeout: float = 600
) -> list[Outcome]:
    """Run each command of an executed block with bash and check it against the shown output."""
    outcomes: list[Outcome] = []
    last_code: int | None = None
    for index, step in enumerate(block.steps):
        following = block.steps[index + 1] if index + 1 < len(block.steps) else None
        if step.is_exit_code:
            command, code, output = EXIT_CODE, 0, f"{last_code}\n"
            last_code = 0  # as in a shell: the exit code of echo
        else:
            command = substitute(step.command, values)
            done = subprocess.run(
                ["bash", "-c", command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=dict(env),
                cwd=cwd,
                timeout=timeout,
            )
            code, output = done.returncode, done.stdout
            last_code = code
        problems = []
        mismatch = output_problem(step.expected, output, values)
        if mismatch:
            problems.append(mismatch)
        if not step.is_exit_code and code != 0 and not (following and following.is_exit_code):
            problems.append(f"exited {code}; show it with '$ {EXIT_CODE}' or make the command succeed")
        if "Traceback (most recent call last)" in output:
            problems.append("printed a Python traceback")
        outcomes.append(Outcome(step, command, code, output, tuple(problems)))
    return outcomes


def describe(block: Block, outcome: Outcome) -> str:
    """One failed step, for an assertion message."""
    shown = "\n".join(outcome.step.expected) or "(nothing)"
    return (
        f"{block.path}:{outcome.step.line}: $ {outcome.step.command}\n  "
        + "\n  ".join(outcome.problems)
        + f"\n--- the playbook shows:\n{shown}\n--- the command printed (exit {outcome.code}):\n"
        + outcome.output[-4000:]
    )


# ------------------------------------------------------------------------------------------ not executed


_MTPDIAG_CALL = re.compile(r"(?:^|[\s;|&(`'\"])mtpdiag\s+([a-z]+)([^;|&`'\"\n]*)")


def mtpdiag_calls(text: str) -> list[tuple[str, list[str]]]:
    """``(subcommand, [--options])`` of every mtpdiag command in a text (a block, or prose code spans)."""
    text = text.replace("\\\n", " ")
    # ``mtpdiag run [OPTIONS] -- COMMAND``: the options after the dashes are the job's
    calls = [(m.group(1), m.group(2).split(" -- ")[0]) for m in _MTPDIAG_CALL.finditer(text)]
    return [(sub, re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest)) for sub, rest in calls]


def shim_dir(path: str, python: str) -> str:
    """A directory with an ``mtpdiag`` that runs this interpreter's ``python -m mtpdiag``, to put first on PATH."""
    os.makedirs(path, exist_ok=True)
    shim = os.path.join(path, "mtpdiag")
    with open(shim, "w") as f:
        f.write(f'#!/bin/sh\nexec "{python}" -m mtpdiag "$@"\n')
    os.chmod(shim, 0o755)
    return path
