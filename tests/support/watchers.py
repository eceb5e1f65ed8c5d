"""The Watcher as the unit tests drive it: the capture and the ranks' listing given, a sample a second, and
watch's default 5 s stall window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.watcher import Watcher


def watcher_of(
    list_targets: Callable[[], list[Any]], take_stacks: Callable[..., Any], *, spare: bool = False
) -> Watcher:
    """``watch``'s Watcher (``spare``: ``run``'s) over ``list_targets()`` with ``take_stacks`` as its capture."""
    return Watcher(
        list_targets=list_targets, take_stacks=take_stacks, layout=LayoutOptions(), interval=1.0, stall=5.0, spare=spare
    )
