"""Finding and opening input files: directories walked, each file once, bytes read and decoded.

* Directories are walked recursively; there, only ``.json``, ``.txt``, ``.log``, ``.dump`` and ``.out``
  files are read (a named file is read whatever its name). A path that does not exist, or a directory
  with no such file, is an input error.
* A file is read once however often it is named (through a directory, a link or a hard link).
* In a directory, ``mtpdiag run``'s own records (``RUN_RECORDS``: its reports, its logs, a shared hang's
  ``nodes.json``) are not captures and are passed over, so ``analyze`` of a run or hang directory reads its
  bundles alone.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from mtpdiag.errors import InputError

DUMP_SUFFIXES = (".json", ".txt", ".log", ".dump", ".out")
RUN_RECORDS = frozenset(
    ("run.json", "hang.json", "nodes.json", "report.json", "report.txt", "events.log", "mtpdiag-errors.log")
)
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
            found = [(path, (info.st_dev, info.st_ino))]  # a named file is read whatever it is
        for file, key in found:
            if key not in seen:
                seen.add(key)
                out.append(file)
    return out


def _walk(directory: str) -> list[tuple[str, tuple[int, int]]]:
    """The capture files under ``directory``, sorted, with the (device, inode) they are told apart by: from
    the directory entries (no ``stat`` per file, which cost as much as reading 16k small files), except
    for links, which are followed."""
    found = []
    pending = [directory]
    while pending:
        root = pending.pop()
        try:
            device = os.stat(root).st_dev  # per directory: one may be a mount point
            entries = sorted(os.scandir(root), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            name = entry.name
            if name.startswith(".") or name in RUN_RECORDS:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.path)
                elif name.lower().endswith(DUMP_SUFFIXES) and entry.is_file():
                    if entry.is_symlink():
                        info = os.stat(entry.path)
                        found.append((entry.path, (info.st_dev, info.st_ino)))
                    else:
                        found.append((entry.path, (device, entry.inode())))
            except OSError:  # a dangling link, or gone since the listing
                continue
        pending += reversed(subdirs)
    return found


def read_bytes(path: str) -> bytes:
    """The file's bytes, without the BOM a Windows editor puts first; InputError naming it otherwise.

    One ``read`` of the size ``fstat`` gives, and more until the end of the file only when that read did not
    return exactly that size (the file grew since, a network file system read short, or the file is over the
    2 GiB one read returns): ``open()``'s file objects cost a quarter more, 5 ms over 2,048 host bundles."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            raw = os.read(fd, size + 1)
            if len(raw) != size:
                raw += b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        finally:
            os.close(fd)
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
