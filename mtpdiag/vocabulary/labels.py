"""The one formatter of rank lists and the one of coordinates, for every sentence and table of mtpdiag."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mtpdiag.vocabulary.groups import COORDINATES

# Coordinates shown whatever their size; the others (ep, dp) only where their size is above 1.
ALWAYS_SHOWN = ("tp", "cp", "pp")


def rank_list(
    ranks: Iterable[int],
    limit: int | None = None,
    *,
    runs: bool = False,
    sep: str = ", ",
    more: str = ", …",
    show: int | None = None,
) -> str:
    """Ranks as text, in the order given: ``0, 1, 5``; with ``runs``, consecutive ranks joined (``0-3, 5``).

    Past ``limit`` items (runs, with ``runs``), only the first ``show`` (default: ``limit``) are listed, then
    ``more``, in which ``{n}`` stands for the number of ranks: ``0, 1, … (40)`` with ``more=", … ({n})"``.
    """
    ranks = list(ranks)
    if runs:
        spans: list[list[int]] = []
        for r in ranks:
            if spans and r == spans[-1][1] + 1:
                spans[-1][1] = r
            else:
                spans.append([r, r])
        items = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    else:
        items = [str(r) for r in ranks]
    if limit is None or len(items) <= limit:
        return sep.join(items)
    return sep.join(items[: limit if show is None else show]) + more.format(n=len(ranks))


def _above_one(size: object) -> bool:
    """A parallel size (an int, or its text in a config) above 1."""
    return isinstance(size, (int, str)) and int(size or 1) > 1


def coords_label(
    coords: Mapping[str, int] | None,
    sizes: Mapping[str, object] | None = None,
    keys: Sequence[str] | None = None,
    sep: str = " ",
) -> str:
    """``tp0 cp1 pp1``: tp, cp and pp always, ep and dp when ``sizes`` says theirs is above 1; or exactly
    ``keys`` (``dp0 cp1 tp0`` for a grid column)."""
    if not coords:
        return ""
    if keys is None:
        keys = [k for k in COORDINATES if k in coords and (k in ALWAYS_SHOWN or (sizes and _above_one(sizes.get(k))))]
    return sep.join(f"{k}{coords[k]}" for k in keys)
