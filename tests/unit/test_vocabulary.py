"""The vocabulary is enforced: outside ``mtpdiag/vocabulary``, no comparison spells a contract word as a bare
string. ``view.state in ("stopped", "gone", "unreadable")`` is ``view.state in FROZEN_STATES``, and
``m.role == "root"`` is ``m.role == Role.ROOT``: a typo is then a NameError, and a renamed word is renamed
everywhere at once.

A contract word is the value of any ``StrEnum`` member of ``mtpdiag.vocabulary``. A comparison is any
``==``/``!=``/``in``/``not in`` (and a ``match`` case): a string literal among its operands, or among the
items of a tuple, list or set operand, is a finding when it equals a contract word. Text for people (a
sentence, a table cell, a dict of phrases) is not compared and is never flagged.

``ALLOWED`` lists the comparisons whose literal only happens to equal a contract word (another format's
word: the kernel's, torch's, Ray's), by file and literal, each with its reason.
"""

from __future__ import annotations

import ast
import enum
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import mtpdiag.vocabulary

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mtpdiag"

# (file under mtpdiag/, literal) -> why the literal is not the contract word it equals.
ALLOWED: dict[tuple[str, str], str] = {
    ("analysis/wait.py", "running"): "the kernel's word in /proc/PID/syscall (capture.procfs.main_syscall)",
    ("capture/procfs.py", "running"): "the kernel's word in /proc/PID/syscall",
    ("capture/ray_job.py", "error"): "a key of the capture job's reply",
    ("commands/apply.py", "not-applicable"): "an ApplyOutcome.action, not a CheckStatus",
    ("fix/verify/worker.py", "buggy"): "the verify worker runs in its own world and imports nothing of mtpdiag",
    ("inputs/flight_recorder/dump.py", "json"): "a Flight Recorder dump's own format (pickle or json)",
    ("inputs/flight_recorder/parse.py", "entries"): "a key of torch's Flight Recorder dump",
    ("inputs/flight_recorder/parse.py", "pg_config"): "a key of torch's Flight Recorder dump",
    ("inputs/flight_recorder/parse.py", "completed"): "an entry state torch's Flight Recorder writes",
    ("lint/groups.py", "mp"): "a token of a variable's name (mp_group), read by the linter",
    # TEMPORARY (#22): the pipeline is being rewritten on another branch; its words move to
    # OutputFormat there. Remove these once it has landed.
    ("pipeline/__init__.py", "console"): "temporary: the pipeline is being rewritten on another branch",
    ("pipeline/output.py", "json"): "temporary: the pipeline is being rewritten on another branch",
}


def contract_words() -> dict[str, list[str]]:
    """Every StrEnum member's value in ``mtpdiag.vocabulary``, with the members that spell it."""
    words: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(mtpdiag.vocabulary.__path__):
        module = importlib.import_module(f"mtpdiag.vocabulary.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, enum.Enum)
                and issubclass(obj, str)
                and obj.__module__ == module.__name__
            ):
                for member in obj:
                    words.setdefault(member.value, []).append(f"{obj.__name__}.{member.name}")
    return words


def _literals(node: ast.expr) -> Iterator[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _literals(item)


def compared_literals(source: str) -> Iterator[ast.Constant]:
    """The string literals a module compares something with."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from _literals(operand)
        elif isinstance(node, ast.MatchValue):
            yield from _literals(node.value)


def bare_words(words: dict[str, list[str]]) -> list[tuple[str, int, str]]:
    """(file under mtpdiag/, line, literal) of each comparison with a contract word, outside vocabulary/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith("vocabulary/"):
            continue
        for literal in compared_literals(path.read_text()):
            if literal.value in words:
                found.append((name, literal.lineno, literal.value))
    return found


def test_the_scan_sees_a_bare_comparison():
    source = 'if v.state in ("stopped", "gone"):\n    pass\nok = m.role == "root"\nmatch x:\n    case "tp": pass\n'
    assert [c.value for c in compared_literals(source)] == ["stopped", "gone", "root", "tp"]
    assert not list(compared_literals('text = "stopped"\nlabel = f"{state} root"\n'))


def test_no_comparison_spells_a_contract_word_outside_the_vocabulary():
    words = contract_words()
    assert {"stopped", "root", "dp_cp", "host_sync", "Z"} <= set(words)  # the scan reads the enums
    bare = [(name, line, value) for name, line, value in bare_words(words) if (name, value) not in ALLOWED]
    assert not bare, "compare with the vocabulary's enum member instead:\n" + "\n".join(
        f"  mtpdiag/{name}:{line}: {value!r} ({' or '.join(words[value])})" for name, line, value in bare
    )


def test_every_allowed_literal_is_still_there():
    """An entry of ``ALLOWED`` whose comparison is gone is removed, so the list stays the list of exceptions."""
    seen = {(name, value) for name, _, value in bare_words(contract_words())}
    assert not set(ALLOWED) - seen
