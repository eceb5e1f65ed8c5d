"""The types of the known-site table (``known_sites``): a row, the collectives a row's function issues,
and how a captured site is matched against a row."""

from __future__ import annotations

from typing import Literal

import msgspec

from mtpdiag.model import Site

Signature = Literal["mtp", "dsa-indexer", "moe-aux-loss"]
Role = Literal["reduce", "caller", "engine"]

# megatron-core minor releases the rows speak about; "main"/"dev" are the Megatron-LM branches.
MEGATRON_RELEASES = ("0.13", "0.14", "0.15", "0.16", "0.17", "0.18", "0.19")


class Collective(msgspec.Struct, frozen=True):
    """One collective a function issues.

    ``group`` says how the source names the group: a ``parallel_state`` getter as it is called
    (``get_pipeline_model_parallel_group()``) or a slot of the metric tracker (``avg_group``,
    ``reduce_group``), which the code that saves into the tracker fills (its ``avg_group=`` argument).
    """

    op: str
    group: str
    kinds: tuple[str, ...]
    reduce: str = "SUM"  # torch.distributed.ReduceOp name
    elements: str | None = None  # "L" = the number of MTP layers; None where it depends on the caller
    when: str | None = None  # the condition it runs under, when not always


class KnownSite(msgspec.Struct, frozen=True):
    """One row of the table. ``None`` in ``function``/``file_suffix`` matches anything."""

    function: str | None
    file_suffix: str | None
    kinds: tuple[str, ...]
    why: str
    peer: str | None = None  # "next" | "prev": the pipeline neighbour a p2p at this site talks to
    p2p: bool = False  # pipeline point-to-point code: matched by peers, not by group membership
    waits: bool = False  # waits on Work handles itself, so a bare Work.wait shows this frame innermost
    signature: Signature | None = None  # the metric-tracker family the row belongs to
    role: Role | None = None  # reduce: issues the collectives; caller: reaches them through `calls`
    collectives: tuple[Collective, ...] = ()  # in the order they run
    calls: tuple[str, ...] = ()  # qualified names of known rows this function reaches
    package: str = "megatron-core"
    versions: tuple[str, ...] = ()  # releases (minor, or "main"/"dev") with this form
    skip: str | None = None  # how part of the group can skip the collectives (an early return, ...)
    source: str | None = None  # where a claim not checked against a released wheel comes from

    @property
    def short_name(self) -> str | None:
        return self.function.rsplit(".", 1)[-1] if self.function else None

    def matches(self, site: Site) -> bool:
        # A row that names its function also takes a path py-spy shortened (its text dump prints
        # ``core/transformer/multi_token_prediction.py``); a file-only row needs its whole suffix.
        if self.file_suffix is not None and not path_ends_with(
            site.file, self.file_suffix, shortened=self.function is not None
        ):
            return False
        if self.function is not None and not _function_matches(
            site.function, self.function, self.file_suffix is not None
        ):
            return False
        return True


def path_ends_with(path: str, suffix: str, shortened: bool = False) -> bool:
    """Does ``path`` end with the path components of ``suffix``? With ``shortened``, a path that is
    itself a shorter tail of ``suffix`` counts too."""
    have = [p for p in path.replace("\\", "/").split("/") if p]
    want = [p for p in suffix.split("/") if p]
    if not have:
        return False
    if have[-len(want) :] == want:
        return True
    return shortened and len(have) < len(want) and want[-len(have) :] == have


def _function_matches(function: str, wanted: str, in_known_file: bool) -> bool:
    """``wanted`` is the qualified name; ``function`` what the capture reports.

    A qualified name matches itself or a longer qualified name ending in it. A bare short name (no
    dot: the capture could not qualify it) matches only when the file already pinned the row down.
    """
    if function == wanted or function.endswith("." + wanted):
        return True
    short = wanted.rsplit(".", 1)[-1]
    return in_known_file and "." not in function and function == short


def _kinds(collectives: tuple[Collective, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for c in collectives for k in c.kinds))


def tracker_row(
    function: str,
    file_suffix: str,
    signature: Signature,
    versions: tuple[str, ...],
    why: str,
    collectives: tuple[Collective, ...] = (),
    calls: tuple[str, ...] = (),
    role: Role = "reduce",
    skip: str | None = None,
    source: str | None = None,
    package: str = "megatron-core",
    kinds: tuple[str, ...] | None = None,
) -> KnownSite:
    """A metric-tracker row: its kinds are those of its collectives, in order."""
    return KnownSite(
        function,
        file_suffix,
        kinds if kinds is not None else _kinds(collectives),
        why,
        signature=signature,
        role=role,
        collectives=collectives,
        calls=calls,
        package=package,
        versions=versions,
        skip=skip,
        source=source,
    )
