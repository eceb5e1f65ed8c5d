"""Finding and opening input files: directories walked, each file once, bytes decoded, JSON parsed.

* Directories are walked recursively; there, only ``.json``, ``.txt``, ``.log``, ``.dump`` and ``.out``
  files are read (a named file is read whatever its name). A path that does not exist, or a directory
  with no such file, is an input error.
* A file is read once however often it is named (through a directory, a link or a hard link).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

from mtpdiag.errors import InputError

DUMP_SUFFIXES = (".json", ".txt", ".log", ".dump", ".out")
_JSON_START = re.compile(r'\s*([\[{])\s*(?:[\[{\]}"]|$)')


def expand(paths: list[str]) -> list[str]:
    """The files to read: directories walked, each file once (by device and inode, which a
    ``realpath`` per file found at several times the cost)."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    for path in paths:
        try:
            info = os.stat(path)
        except OSError as exc:
            why = "no such file or directory" if exc.errno == errno.ENOENT else f"cannot read ({exc.strerror or exc})"
            raise InputError(f"{path}: {why}") from None
        if stat.S_ISDIR(info.st_mode):
            found = _walk(path)
            if not found:
                raise InputError(f"{path}: no capture files ({', '.join(DUMP_SUFFIXES)}) in this directory")
        else:
            found = [(path, info)]  # a named file is read whatever it is
        for file, info in found:
            key = (info.st_dev, info.st_ino)
            if key not in seen:
                seen.add(key)
                out.append(file)
    return out


def _walk(directory: str) -> list[tuple[str, os.stat_result]]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(DUMP_SUFFIXES):
                continue
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
            except OSError:  # a dangling link, or gone since the walk
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((path, info))
    return found


def read_text(path: str) -> str:
    """The file's text (a BOM from a Windows editor is not content); InputError naming it otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (expected a bundle or a py-spy dump)") from None


def json_start(text: str) -> str:
    """``[`` or ``{`` when the text starts as a JSON list or object would (``[{``, ``{"``), else "".
    ``[rank3]: Thread ...``, a log line, starts with ``[`` too."""
    m = _JSON_START.match(text, 0, 4096)
    return m[1] if m else ""


def parse_json(text: str, path: str, what: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid or truncated JSON (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be {what}") from None
