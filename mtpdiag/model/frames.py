"""A frame of a stack, its kept arguments, and the place a rank waits at (``Site``): the units every stack is
made of. Frozen and hashable, so a stack (a tuple of frames) is a dict key: the report's stack table and the
analysis key each distinct stack by its value.
"""

from __future__ import annotations

from collections.abc import Iterable

from mtpdiag.model.fields import Record


class FrameArgs(Record, frozen=True, omit_defaults=True, forbid_unknown_fields=False):
    """The whitelisted integer arguments of a torch.distributed frame (``vocabulary.stacks.KEPT_ARGS``); the
    JSON is ``{"dst": 2, "group_dst": 1}``. Any other argument is never read."""

    dst: int | None = None
    group_dst: int | None = None
    group_src: int | None = None
    src: int | None = None
    tag: int | None = None

    def items(self) -> tuple[tuple[str, int], ...]:
        """The arguments that are set, by name."""
        return tuple((name, value) for name in self.__struct_fields__ if (value := getattr(self, name)) is not None)

    @staticmethod
    def of(pairs: Iterable[tuple[str, int]]) -> FrameArgs | None:
        """The arguments of ``(name, value)`` pairs (``kept_args``'s), or None when there are none."""
        kept = dict(pairs)
        return FrameArgs(**kept) if kept else None


class Frame(Record, frozen=True, kw_only=True, cache_hash=True):
    """One frame. ``file`` is a display path (site-packages-relative where possible).

    ``native`` marks a C/C++ frame (py-spy ``--native``, pystack ``--native``): evidence of what a rank
    waits on (``cudaStreamSynchronize``, ``futex``), never its call site.
    """

    file: str
    line: int
    function: str
    args: FrameArgs | None = None
    native: bool = False

    def arg(self, name: str) -> int | None:
        return getattr(self.args, name, None) if self.args is not None else None


class Site(Record, frozen=True, cache_hash=True):
    """Where a rank waits: the first frame outside torch.distributed and its wrappers."""

    file: str
    line: int
    function: str


Stack = tuple[Frame, ...]  # innermost first
