"""Group ranks by where they are: the same op at the same call site."""

from __future__ import annotations

from collections.abc import Iterable

from mtpdiag.model import RankView, Site, SiteGroup


def group_sites(views: Iterable[RankView]) -> tuple[SiteGroup, ...]:
    """One SiteGroup per (op, site, wait kind) over ranked views, largest first, then by first rank."""
    groups: dict[tuple[str | None, Site | None, str | None], list[int]] = {}
    for view in views:
        if view.rank is None or view.site is None and view.op is None:
            continue
        wait = view.wait.kind if view.op is None and view.wait is not None else None
        groups.setdefault((view.op, view.site, wait), []).append(view.rank)
    out = [SiteGroup(op=op, site=site, ranks=tuple(sorted(ranks)), wait=wait)
           for (op, site, wait), ranks in groups.items()]
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.ranks[0])))
