"""Which frames of a stack are torch, plumbing or the stdlib, and which one is the call site.

A stack is read innermost frame first. Its innermost run of library frames (torch, and decorator plumbing
such as functools/contextlib/typing) is the *torch block*; the call site of a rank blocked in a collective is
the first frame outside that block, and the call site of a running rank is its innermost frame outside the
libraries and the stdlib's internals. The stack reading of the analysis and the Flight Recorder reader use
this one rule, so a site named from a dump and one named from a stack are the same site.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

_PACKAGE_ROOTS = ("/site-packages/", "/dist-packages/")
# Files whose frames are plumbing between a collective and the code that called it.
_WRAPPER_FILES = ("/functools.py", "/contextlib.py", "/typing_extensions.py", "/typing.py")
# Stdlib modules whose frames are never the interesting part of a running rank's stack.
_STDLIB_INTERNALS = frozenset(
    {
        "threading",
        "queue",
        "selectors",
        "socket",
        "subprocess",
        "multiprocessing",
        "concurrent",
        "asyncio",
        "contextlib",
        "functools",
        "runpy",
        "ssl",
        "http",
        "urllib",
        "logging",
        "tempfile",
    }
)
# Locals kept from a capture: only these, only from frames under torch/distributed/, only as integers.
KEPT_ARGS = ("dst", "src", "group_dst", "group_src", "tag")
_TORCH_DISTRIBUTED = "torch/distributed/"
_INT_LITERAL = re.compile(r"-?[0-9]{1,19}")  # ASCII and bounded: int() refuses 5000 digits


class FrameLike(Protocol):
    """A frame or a site: read-only, so frozen records fit."""

    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def function(self) -> str: ...


F = TypeVar("F", bound=FrameLike)


def display_path(filename: str) -> str:
    """A path relative to site-packages/dist-packages when it is installed there, else as given."""
    for root in _PACKAGE_ROOTS:
        cut = filename.rfind(root)
        if cut >= 0:
            return filename[cut + len(root) :]
    return filename


def short_name(function: str) -> str:
    """``MTPLossLoggingHelper.reduce_loss_in_tracker`` -> ``reduce_loss_in_tracker``."""
    return function.rsplit(".", 1)[-1]


def kept_args(file: str, locals_: Iterable[tuple[str, str | None]]) -> tuple[tuple[str, int], ...]:
    """The whitelisted integer locals of a torch.distributed frame; every other local is dropped."""
    if not (file.startswith(_TORCH_DISTRIBUTED) or "/" + _TORCH_DISTRIBUTED in file):
        return ()
    out = {}
    for name, repr_ in locals_:
        if name in KEPT_ARGS and isinstance(repr_, str) and _INT_LITERAL.fullmatch(repr_.strip()):
            out[name] = int(repr_.strip())
    return tuple(sorted(out.items()))


def slash_path(file: str) -> str:
    """``file`` with forward slashes and one leading slash, so suffix tests need no special cases."""
    return "/" + file.replace("\\", "/").lstrip("/")


def is_torch_distributed(frame: FrameLike) -> bool:
    return "/torch/distributed/" in slash_path(frame.file)


def is_wrapper(frame: FrameLike) -> bool:
    """torch itself, or decorator plumbing: never the call site a person wants to see."""
    path = slash_path(frame.file)
    return "/torch/" in path or path.endswith(_WRAPPER_FILES)


def is_stdlib_internal(frame: FrameLike) -> bool:
    path = slash_path(frame.file)
    if "/site-packages/" in path or "/dist-packages/" in path:
        return False
    parts = path.strip("/").split("/")
    for i, part in enumerate(parts):  # ".../lib/python3.11/threading.py" -> "threading"
        if part.startswith("python3") and i + 1 < len(parts):
            parts = parts[i + 1 :]
            break
    head = parts[0].removesuffix(".py") if parts else ""
    return head in _STDLIB_INTERNALS


def is_plumbing(path: str) -> bool:
    """Frames between a wait and its caller: the stdlib and torch's Python layers (``path`` slashed)."""
    stdlib = "/lib/python3" in path and "/site-packages/" not in path and "/dist-packages/" not in path
    return "/torch/" in path or stdlib or path.endswith(("/functools.py", "/contextlib.py", "/typing_extensions.py"))


def torch_block_end(frames: Sequence[FrameLike]) -> int:
    """The length of the stack's innermost run of torch and plumbing frames."""
    end = 0
    while end < len(frames) and is_wrapper(frames[end]):
        end += 1
    return end


def call_site_frame(frames: Sequence[F]) -> F | None:
    """The frame a person wants to see (see the module's rule); None for an empty stack."""
    if not frames:
        return None
    end = torch_block_end(frames)
    if any(is_torch_distributed(f) for f in frames[:end]):
        return frames[end] if end < len(frames) else frames[end - 1]
    return next((f for f in frames if not is_wrapper(f) and not is_stdlib_internal(f)), frames[0])
