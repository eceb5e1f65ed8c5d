"""Finding and opening input files: directories walked, each file once, bytes read and decoded.

* Directories are walked recursively; there, only ``.json``, ``.txt``, ``.log``, ``.dump`` and ``.out``
  files are read (a named file is read whatever its name). A path that does not exist, or a directory
  with no such file, is an input error.
* A file is read once however often it is named (through a directory, a link or a hard link).
"""

from __future__ import annotations

import errno
import os
import re
import stat

from mtpdiag.errors import InputError

DUMP_SUFFIXES = (".json", ".txt", ".log", ".dump", ".out")
_JSON_START = re.compile(rb'\s*([\[{])\s*(?:[\[{\]}"]|$)')
BOM = b"\xef\xbb\xbf"


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


def read_bytes(path: str) -> bytes:
    """The file's bytes, without the BOM a Windows editor puts first; InputError naming it otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return raw[3:] if raw.startswith(BOM) else raw


def decoded(raw: bytes, path: str) -> str:
    """The text of a file's bytes; InputError naming it when they are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (expected a bundle or a py-spy dump)") from None


def json_start(data: bytes | str) -> str:
    """``[`` or ``{`` when the bytes (or text) start as a JSON list or object would (``[{``, ``{"``), else "".
    ``[rank3]: Thread ...``, a log line, starts with ``[`` too."""
    if isinstance(data, str):
        data = data[:4096].encode("utf-8", "replace")
    m = _JSON_START.match(data, 0, 4096)
    return m[1].decode() if m else ""
