"""Call sites whose process group we know from the code, not from guessing.

When a collective is entered by only some ranks, the layout alone cannot always say which group it
ran on (a DP×CP group with dp=1 has the same members as the CP group). Megatron, verl and our
reproducer use fixed groups at well-known call sites; this table names them.

A row names its function by qualified name (``MTPLossLoggingHelper.reduce_loss_in_tracker``, what
py-spy 0.4 reports on Python >= 3.11 as ``co_qualname``) and, for the metric helpers, by the end of
its file path. A site matches a row when its file ends with the row's path and its function is the
qualified name, a qualified name ending in it (``Outer.<locals>.f``), or -- where only the short name
is known (py-spy on Python < 3.11, Flight Recorder frames) -- the bare short name in that file. A
short name alone never matches a method of another class: ``DSAIndexerLossLoggingHelper.
reduce_loss_in_tracker`` is the DeepSeek indexer's loss, on the pipeline group, and not the MTP reduce.

Rows are tried in order, so the specific rows come before the catch-all file rows, and for a function
whose group changed across releases the most common form that issues collectives itself comes first
(``lookup``; ``kinds_of`` unites every form). ``kinds`` lists group kinds of
``mtpdiag.layout.GROUP_KINDS``, most likely first. Pipeline point-to-point rows carry the direction of
the peer (``next``/``prev`` pipeline stage) so a peer can be named when torch's frame lacks one.

The metric-tracker rows (MTP, DeepSeek indexer, MoE aux loss) also say which collectives the function
issues, in order, on which group, over how many elements, and in which releases it has that form;
``tests/unit/test_known_sites_megatron.py`` checks every such claim against the released megatron-core
wheels. ``mtpdiag check`` and ``mtpdiag lint`` read the same rows (``collection_rows``, ``lint_rows``).
"""

from __future__ import annotations

from functools import lru_cache

from mtpdiag.analysis.known_site_rows import KNOWN_SITES, TRACKER_ROWS
from mtpdiag.analysis.known_site_types import (
    MEGATRON_RELEASES,
    Collective,
    KnownSite,
    Role,
    Signature,
    path_ends_with,
)
from mtpdiag.model import Site

__all__ = [
    "KNOWN_SITES",
    "MEGATRON_RELEASES",
    "MTP_COLLECTIONS",
    "MTP_FUNCTIONS",
    "TRACKER_ROWS",
    "Collective",
    "KnownSite",
    "Role",
    "Signature",
    "collection_rows",
    "engine_row",
    "group_label",
    "is_mtp_site",
    "kinds_of",
    "lookup",
    "lookup_all",
    "path_ends_with",
    "rows_defined",
    "rows_named",
    "signature_of",
    "skip_of",
]


@lru_cache(maxsize=4096)
def lookup_all(site: Site | None) -> tuple[KnownSite, ...]:
    """Every row that matches ``site``, in table order (cached: thousands of ranks share a site)."""
    if site is None:
        return ()
    return tuple(row for row in KNOWN_SITES if row.matches(site))


def lookup(site: Site | None) -> KnownSite | None:
    """The first table row that matches ``site``, or None."""
    rows = lookup_all(site)
    return rows[0] if rows else None


def kinds_of(site: Site | None) -> tuple[str, ...]:
    """Group kinds of every form of the site's function across releases, most likely first
    (``MTPLossLoggingHelper.reduce_loss_in_tracker``: DP×CP, and TP×CP in megatron-core 0.13)."""
    return tuple(dict.fromkeys(k for row in lookup_all(site) for k in row.kinds))


def signature_of(site: Site | None) -> Signature | None:
    """The metric-tracker family (``mtp``, ``dsa-indexer``, ``moe-aux-loss``) a site's collective belongs
    to, or None. A verl engine's own collectives (its token-count all_reduce) belong to none."""
    row = lookup(site)
    if row is None or row.role not in ("reduce", "caller"):
        return None
    return row.signature


def is_mtp_site(site: Site | None) -> bool:
    """True for the MTP loss reduce and its callers (megatron's and verl's), never the DSA indexer."""
    return signature_of(site) == "mtp"


def skip_of(site: Site | None) -> str | None:
    """How part of the group can skip the site's collectives (an early return on an empty tracker, ...)."""
    row = lookup(site)
    return row.skip if row is not None else None


# --------------------------------------------------------------------------- source-level look-up


def rows_named(dotted: str) -> tuple[KnownSite, ...]:
    """Rows a call spelled ``dotted`` (import aliases resolved) reaches: the qualified name must be the
    whole call or its tail. ``x.MTPLossLoggingHelper.track_mtp_metrics`` reaches the MTP row;
    ``DSAIndexerLossLoggingHelper.reduce_loss_in_tracker`` only the indexer's; a bare
    ``reduce_loss_in_tracker`` none (a method is always called through its class or an instance)."""
    return tuple(
        row
        for row in _SOURCE_ROWS
        if row.function is not None and (dotted == row.function or dotted.endswith("." + row.function))
    )


def rows_defined(qualname: str, filename: str | None = None) -> tuple[KnownSite, ...]:
    """Rows for the function defined as ``qualname`` (``Class.method``), in ``filename`` when the row
    names a file and the file is known."""
    return tuple(
        row
        for row in _SOURCE_ROWS
        if row.function == qualname
        and (filename is None or row.file_suffix is None or path_ends_with(filename, row.file_suffix))
    )


def collection_rows(signature: Signature = "mtp") -> tuple[KnownSite, ...]:
    """Rows whose call collects a signature's metric: its reduce functions and their callers."""
    return tuple(row for row in TRACKER_ROWS if row.signature == signature and row.role in ("reduce", "caller"))


def engine_row() -> KnownSite:
    """verl's Megatron engine method that collects the MTP loss."""
    return next(row for row in TRACKER_ROWS if row.role == "engine")


def group_label(rows: tuple[KnownSite, ...]) -> str:
    """``dp_cp`` / ``pp and dp``: the group kinds of one function's forms, for a person."""
    return " and ".join(dict.fromkeys(k for row in rows for k in row.kinds))


# Rows that can be recognised in source code: they name a function and say what it runs.
_SOURCE_ROWS = tuple(row for row in KNOWN_SITES if row.role is not None)

# One source of truth for the names: the MTP collection's qualified and short names.
MTP_COLLECTIONS = tuple(dict.fromkeys(row.function for row in collection_rows("mtp") if row.function is not None))
MTP_FUNCTIONS = frozenset(name.rsplit(".", 1)[-1] for name in MTP_COLLECTIONS)  # compatibility
