"""Group ranks by where they are: the same op at the same call site."""

from __future__ import annotations

from typing import Iterable

from mtpdiag.model import RankView, Site, SiteGroup


def group_sites(views: Iterable[RankView]) -> tuple[SiteGroup, ...]:
    """One SiteGroup per (op, site) over ranked views, largest first, then by first rank."""
    groups: dict[tuple[str | None, Site | None], list[int]] = {}
    for view in views:
        if view.rank is None or view.site is None and view.op is None:
            continue
        groups.setdefault((view.op, view.site), []).append(view.rank)
    out = [SiteGroup(op=op, site=site, ranks=tuple(sorted(ranks))) for (op, site), ranks in groups.items()]
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.ranks[0])))
