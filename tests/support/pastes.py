"""Recorded pastes (tests/fixtures/pastes/, by tests/fixtures/record_pastes.py) and the mechanical ways a
person mangles them on the way into a ticket: reindented, CRLF, colour, prompts, log prefixes, files
joined into one, identical stacks grouped under several headers. Nothing here writes a stack by hand:
every variant is a transformation of a recorded file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Snapshot, replace

PASTES = Path(__file__).parent.parent / "fixtures" / "pastes"
FORMS = ("pyspy", "locals", "native", "faulthandler", "pystack", "pystack-native")


def scenarios() -> list[str]:
    return sorted(p.parent.name for p in PASTES.glob("*/scenario.json"))


def meta(scenario: str) -> dict:
    return json.loads((PASTES / scenario / "scenario.json").read_text())


def files(scenario: str, form: str) -> list[Path]:
    """The recorded rank files of one form, in rank order (a stopped rank has no faulthandler file)."""
    return sorted((PASTES / scenario).glob(f"rank*.{form}.txt"), key=lambda p: int(p.name[4 : p.name.index(".")]))


def rank_of(path: Path) -> int:
    return int(path.name[4 : path.name.index(".")])


def layout(scenario: str) -> ParallelLayout:
    m = meta(scenario)
    sizes = m["layout"]
    return ParallelLayout.for_world(
        m["world_size"], tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), pp=sizes.get("pp", 1), ep=sizes.get("ep", 1)
    )


def with_world_size(snapshot: Snapshot, size: int) -> Snapshot:
    """What ``analyze --world-size`` does for dumps that carry no WORLD_SIZE."""
    return replace(
        snapshot, captures=tuple(replace(c, env=replace(c.env, WORLD_SIZE=str(size))) for c in snapshot.captures)
    )


# ---------------------------------------------------------------- mangling, line by line

_LEAD = re.compile(r"^[ \t]+")


def reindent(text: str, style: str) -> str:
    """Leading whitespace as a chat client or editor leaves it: ``tabs`` (4 spaces → one tab), ``two``
    (halved), ``none`` (stripped)."""

    def fix(m: re.Match) -> str:
        width = len(m.group().expandtabs(4))
        return {"tabs": "\t" * (width // 4) + " " * (width % 4), "two": " " * (width // 2), "none": ""}[style]

    return "\n".join(_LEAD.sub(fix, line) for line in text.split("\n"))


def crlf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def coloured(text: str) -> str:
    """Every non-blank line wrapped in ANSI colour, as a terminal with colour on copies it."""
    return "\n".join(f"\x1b[1;32m{line}\x1b[0m" if line.strip() else line for line in text.split("\n"))


def prompted(text: str, command: str) -> str:
    """The paste starts at the shell prompt that ran the tool and ends at the next prompt."""
    return f"root@node-07:~# {command}\n{text.rstrip()}\nroot@node-07:~# \n"


def prefixed(text: str, prefix: str) -> str:
    """Each line behind a log prefix, as torch (``[rank3]:``) or a launcher writes them."""
    return "\n".join(f"{prefix}{line}" for line in text.rstrip("\n").split("\n")) + "\n"


def joined(paths: list[Path]) -> str:
    """Several files joined into one as ``head -n 1000 rank*.txt`` prints them."""
    return "\n".join(f"==> {p.name} <==\n{p.read_text().rstrip()}\n" for p in paths)


# ---------------------------------------------------------------- grouping identical stacks (py-spy text)

_THREAD = re.compile(r"^Thread \S+ \(")


def grouped(paths: list[Path], prefix_rank: bool = True) -> str:
    """py-spy text of several ranks with identical stacks deduplicated by hand: the ``Thread`` header of each
    rank (behind its ``[rankN]:`` prefix), then the stack they share once. Only the main thread is kept."""
    stacks: dict[str, list[str]] = {}
    for path in paths:
        header, frames = _main_thread(path.read_text())
        label = f"[rank{rank_of(path)}]: " if prefix_rank else ""
        stacks.setdefault(frames, []).append(label + header)
    return "\n".join("\n".join(headers) + "\n" + frames for frames, headers in stacks.items())


def _main_thread(text: str) -> tuple[str, str]:
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if _THREAD.match(line) and '"MainThread"' in line)
    end = next((i for i in range(start + 1, len(lines)) if _THREAD.match(lines[i]) or not lines[i].strip()), len(lines))
    return lines[start], "\n".join(lines[start + 1 : end]) + "\n"


def written(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text, newline="")
    return str(path)


def names(paths: list[Path]) -> list[str]:
    return [os.fspath(p) for p in paths]
