"""A frame of a stack, and the place a rank waits at (``Site``): the units every stack is made of.

The readers share equal frames and equal stacks between ranks (``shared_frames``): a big job's ranks hold a
handful of stacks, so each is validated and built once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpdiag.model.fields import SchemaError, integer, obj, string


@dataclass(frozen=True)
class Frame:
    """One frame. ``file`` is a display path (site-packages-relative where possible).

    ``native`` marks a C/C++ frame (py-spy ``--native``, pystack ``--native``): evidence of what a rank
    waits on (``cudaStreamSynchronize``, ``futex``), never its call site.
    """

    function: str
    file: str
    line: int
    # Whitelisted integer arguments of torch.distributed frames (dst, src, group_dst, group_src, tag).
    args: tuple[tuple[str, int], ...] = ()
    native: bool = False

    def arg(self, name: str) -> int | None:
        for key, value in self.args:
            if key == name:
                return value
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "function": self.function}
        if self.args:
            out["args"] = dict(self.args)
        if self.native:
            out["native"] = True
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Frame":
        args = d.get("args") or {}
        if not isinstance(args, Mapping):
            raise SchemaError("frame args must be an object")
        native = d.get("native", False)
        if type(native) is not bool:
            raise SchemaError("field 'native' must be a boolean")
        return Frame(
            function=string(d, "function"),
            file=string(d, "file"),
            line=integer(d, "line"),
            args=tuple(sorted((str(k), integer(args, k)) for k in args)),
            native=native,
        )

    @staticmethod
    def from_dict_shared(d: Mapping[str, Any], seen: dict) -> "Frame":
        """``from_dict``, returning the Frame already read for an identical dict (same values, same
        types): the ranks of a big job share a few stacks, so this saves time and memory."""
        if not isinstance(d, dict):
            return Frame.from_dict(obj(d))
        args = d.get("args")
        line = d.get("line")
        try:
            native = d.get("native")
            # Each value with its type, as ``_shared_frames`` keys a whole stack: ``True == 1`` and hashes
            # alike, and a frame read first must not vouch for one that only compares equal to it.
            key = (d.get("function"), d.get("file"), line, type(line),
                   _args_key(args) if type(args) is dict else args, native, type(native))
            return seen[key]
        except TypeError:  # unhashable values: let from_dict say what is wrong
            return Frame.from_dict(d)
        except KeyError:
            frame = seen[key] = Frame.from_dict(d)
            return frame


@dataclass(frozen=True)
class Site:
    """Where a rank waits: the first frame outside torch.distributed and its wrappers."""

    file: str
    line: int
    function: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Site":
        return Site(file=string(d, "file"), line=integer(d, "line"), function=string(d, "function"))


def shared_frames(frames: list, seen: dict) -> tuple[Frame, ...]:
    """The Frames of a frames list, as the very tuple read before for an equal list.

    The ranks of a big job share a handful of stacks. Keying the whole list (its values and the type
    of each line, so ``true`` is never taken for ``1``) costs about a microsecond, and every rank
    after the first with that stack skips the validation of its frames; the analysis then meets the
    same tuple object again and again. Anything unusual takes the frame-by-frame path.
    """
    try:
        key = tuple([(f["function"], f["file"], f["line"], type(f["line"]),
                      _args_key(f["args"]) if len(f) > 3 and "args" in f else None,
                      _native_key(f["native"]) if len(f) > 3 and "native" in f else None) for f in frames])
        shared = seen.get(key)
    except (KeyError, TypeError, AttributeError):
        return tuple(Frame.from_dict_shared(f, seen) for f in frames)
    if shared is None:
        shared = seen[key] = tuple(Frame.from_dict_shared(f, seen) for f in frames)
    return shared


def _native_key(native: Any) -> bool:
    if type(native) is not bool:
        raise TypeError("frame native flag is not a boolean")
    return native


def _args_key(args: Any) -> tuple:
    if type(args) is not dict:
        raise TypeError("frame args are not an object")
    return tuple((k, v, type(v)) for k, v in args.items())
