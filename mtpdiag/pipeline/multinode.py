"""``mtpdiag run`` across nodes, the pure part: which node this is, how a shared hang directory is named, which
one a call joins, and the list of nodes whose bundles arrived (``nodes.json``).

One ``mtpdiag run`` per node, all given one shared ``--out``. Each node runs in ``<out>/<node>/`` (a single
node's run directory, with its own lock), and a hang, whichever node calls it first, is ``<out>/hang-<UTC
time>/``: every node's bundle (``<node>.mtpdiag.json``) and ``nodes.json``, which ``mtpdiag analyze`` merges.
The I/O is ``pipeline.shared_out``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

import msgspec

from mtpdiag.errors import InputError
from mtpdiag.pipeline.run_dir import utc
from mtpdiag.vocabulary.nodes import NodeRole

NODES_FILE = "nodes.json"
NODES_SCHEMA = "mtpdiag.hang-nodes/1"
BUNDLE_SUFFIX = ".mtpdiag.json"  # collect's name for a host's bundle in a directory
HANG_PREFIX = "hang-"
_STAMP = "%Y%m%dT%H%M%SZ"
_HANG_NAME = re.compile(r"hang-(\d{8}T\d{6}Z)(?:-(\d{1,4}))?")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Nodes' clocks (NTP) agree within milliseconds; a second for the names' whole seconds, the rest for a node
# whose clock is off.
CLOCK_SKEW_S = 5.0


class HangDir(msgspec.Struct, frozen=True):
    """A shared hang directory as a call sees it: its name, when it was made (from the name), and the nodes that
    called into it themselves."""

    name: str
    created: float
    called: tuple[str, ...] = ()


class NodeArrival(msgspec.Struct, frozen=True):
    """One node's bundle in a hang directory: who, how it came (``NodeRole``), when, its ranks, and for a node
    that called the hang, its headline and where its own report is (relative to the hang directory)."""

    node: str
    role: NodeRole
    at: str
    ranks: tuple[int, ...] = ()
    bundle: str = ""
    headline: str = ""
    report: str = ""


class HangNodes(msgspec.Struct, frozen=True):
    """``nodes.json``: the hang, the node that made its directory, and the nodes whose bundles arrived."""

    hang: str
    first: str
    created: str
    nodes: tuple[NodeArrival, ...] = ()
    schema: str = NODES_SCHEMA


def node_label(option: str | None, command: Sequence[str], environ: Mapping[str, str], hostname: str) -> str | None:
    """This node's name in a shared ``--out``, or None for a single-node run (its layout is unchanged).

    ``--host`` names it; without it, a job that spans nodes (torchrun's ``--nnodes`` above 1, or an srun step
    over several nodes) is named after the host."""
    if option is not None:
        if not _LABEL.fullmatch(option) or option.startswith(HANG_PREFIX):
            raise InputError(
                f"--host {option!r}: a node's name is letters, digits, '.', '_' and '-' (at most 128, not starting "
                f"with '{HANG_PREFIX}', which names the shared hang directories)"
            )
        return option
    if nodes_in_command(command) > 1 or _int(environ.get("SLURM_STEP_NUM_NODES")) > 1:
        return re.sub(r"[^A-Za-z0-9._-]", "_", hostname).lstrip("._-")[:128] or "node"
    return None


def nodes_in_command(command: Sequence[str]) -> int:
    """The most nodes torchrun's ``--nnodes N`` (or ``MIN:MAX``) allows; 1 without it."""
    for i, arg in enumerate(command):
        value = None
        if arg == "--nnodes" and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith("--nnodes="):
            value = arg.partition("=")[2]
        if value is not None:
            return max(_int(part) for part in value.split(":"))
    return 1


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 1


def hang_dir_name(stamp: float, n: int = 1) -> str:
    """``hang-<UTC time>``, and ``-2``, ``-3``… after it for another hang made in the same second."""
    name = HANG_PREFIX + datetime.fromtimestamp(stamp, timezone.utc).strftime(_STAMP)
    return name if n == 1 else f"{name}-{n}"


def hang_time(name: str) -> float | None:
    """When a hang directory was made, from its name (UTC seconds); None for any other name."""
    m = _HANG_NAME.fullmatch(name)
    if m is None:
        return None
    return datetime.strptime(m[1], _STAMP).replace(tzinfo=timezone.utc).timestamp()


def same_hang_window(hang_after: float) -> float:
    """How long after a hang directory was made another node's call still joins it.

    The nodes of one hung job call it at different moments: each after its own quiet window (``hang_after``)
    from its own ranks' last progress, and a node whose ranks were mid-step (a long device step) when the first
    stopped stops only at their next collective, a window later; a loaded node's capture adds seconds. A second
    hang of the same job within a minute of these needs it to recover and hang again, which ``run`` notes."""
    return 60.0 + 2 * hang_after


def pick_hang(hangs: Sequence[HangDir], node: str, now: float, window: float) -> str | None:
    """The hang directory a call by ``node`` at ``now`` joins: the latest one made within ``window`` before it
    (clocks a few seconds apart allowed), unless this node called into it already (then this is a new hang)."""
    recent = [
        h for h in hangs if now - window - CLOCK_SKEW_S <= h.created <= now + CLOCK_SKEW_S and node not in h.called
    ]
    if not recent:
        return None
    return max(recent, key=lambda h: (h.created, _suffix(h.name))).name


def _suffix(name: str) -> int:
    m = _HANG_NAME.fullmatch(name)
    return int(m[2]) if m is not None and m[2] else 1


def with_arrival(doc: HangNodes, arrival: NodeArrival) -> HangNodes:
    """``doc`` with ``arrival`` in it: a node's entry replaced in place, or added last. A sighting never replaces
    a node's own call (its bundle is the one taken when it called)."""
    nodes = list(doc.nodes)
    for i, entry in enumerate(nodes):
        if entry.node == arrival.node:
            if entry.role == NodeRole.CALLED and arrival.role == NodeRole.SAW:
                return doc
            nodes[i] = arrival
            break
    else:
        nodes.append(arrival)
    return msgspec.structs.replace(doc, nodes=tuple(nodes))


def called_by(doc: HangNodes | None) -> tuple[str, ...]:
    return tuple(e.node for e in doc.nodes if e.role == NodeRole.CALLED) if doc is not None else ()


def bundle_name(node: str) -> str:
    return node + BUNDLE_SUFFIX


def nodes_text(doc: HangNodes) -> str:
    return msgspec.json.format(msgspec.json.encode(doc).decode(), indent=1) + "\n"


def read_nodes(data: bytes) -> HangNodes | None:
    """``nodes.json``'s document; None when it is not one (a caller then starts it again from the bundles)."""
    try:
        return msgspec.json.decode(data, type=HangNodes)
    except msgspec.MsgspecError:
        return None


def new_nodes(hang: str, node: str, now: float | None = None) -> HangNodes:
    return HangNodes(hang=hang, first=node, created=utc(now))
