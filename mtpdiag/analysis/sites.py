"""Group ranks by where they are: the same op at the same call site."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from mtpdiag.model import RankView, Site, SiteGroup
from mtpdiag.vocabulary.waits import WaitKind


def group_sites(views: Iterable[RankView]) -> tuple[SiteGroup, ...]:
    """One SiteGroup per (op, site, wait kind) over ranked views, largest first, then by first rank."""
    groups: defaultdict[tuple[str | None, Site | None, WaitKind | None], list[int]] = defaultdict(list)
    for view in views:
        op = view.op
        if op is not None:  # the wait kind groups only ranks in no collective
            if view.rank is not None:
                groups[(op, view.site, None)].append(view.rank)
        elif view.site is not None and view.rank is not None:
            groups[(None, view.site, view.wait.kind if view.wait is not None else None)].append(view.rank)
    out = [
        SiteGroup(op=op, site=site, ranks=tuple(sorted(ranks)), wait=wait) for (op, site, wait), ranks in groups.items()
    ]
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.ranks[0])))
