"""Where ``--ray`` finds a cluster's GCS (a head that listens on the loopback only is reached there) and its nodes.

Ray replaces a loopback address (``127.0.0.1``, ``localhost``, ``::1``) with this host's address before it
connects, so that the address it hands on reaches the node from other machines. A head started on the loopback
(``ray start --node-ip-address=127.0.0.1``, a driver's ``ray.init(_node_ip_address="127.0.0.1")`` or
``cluster_utils`` with that node address) listens there only, and Ray would retry the host's address for ever.
For such a head Ray is told, before it is imported, that its cluster is this one machine
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which keeps the loopback address and makes this driver's node address
the loopback, the head's). Stdlib only: this runs before Ray is imported.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
ONE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's switch: "0" keeps Ray on the loopback


def answers(host_port: str, timeout: float = 10.0) -> None:
    """ConnectionError unless something accepts a TCP connection at ``host_port`` (the GCS's port)."""
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"nothing answers at {host_port} ({getattr(exc, 'strerror', None) or exc})") from None


def refusing(addresses: Iterable[tuple[str, int]], timeout: float = 2.0) -> set[tuple[str, int]]:
    """The ``(host, port)`` pairs whose host refuses a TCP connection: nothing listens there (a raylet that died on
    a machine that is still up). Asked at once; a timeout or any other error says nothing and is not counted."""

    def refused(address: tuple[str, int]) -> bool:
        try:
            with socket.create_connection(address, timeout=timeout):
                return False
        except ConnectionRefusedError:
            return True
        except OSError:
            return False

    asked = sorted(set(addresses))
    if not asked:
        return set()
    with ThreadPoolExecutor(max_workers=min(32, len(asked))) as pool:
        return {a for a, no in zip(asked, pool.map(refused, asked), strict=True) if no}


def client_server(address: str) -> str:
    """``HOST:PORT`` of a ``ray://HOST[:PORT][/…]`` address's Ray Client server (Ray's default port: 10001)."""
    where = address.removeprefix("ray://").split("/", 1)[0]
    _, colon, port = where.rpartition(":")
    if colon and port.isdigit():  # "[::1]" has none: its last ":" is inside the brackets
        return where
    return f"{where}:10001"


def host_address() -> str:
    """The address Ray gives this host: the one it routes to the internet by (Ray's ``get_node_ip_address``;
    a UDP ``connect`` sends nothing), or the loopback when it has no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 53))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def loopback_only(address: str) -> bool:
    """Whether ``address`` is a loopback ``HOST:PORT`` at which a GCS answers while nothing answers at the
    host's address on the same port (the head listens on the loopback only)."""
    host, _, port = address.rpartition(":")
    if host.strip("[]") not in LOOPBACK_HOSTS or not port.isdigit():
        return False
    try:
        answers(address, timeout=5.0)
    except ConnectionError:
        return False
    try:
        answers(f"{host_address()}:{port}", timeout=5.0)
    except ConnectionError:
        return True
    return False


def keep_loopback(address: str) -> bool:
    """Before Ray is imported: keep Ray on the loopback when ``address`` (``auto``: ``RAY_ADDRESS``) names a head
    that listens there only (a value the user set is left alone). Whether it did."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or address
    if ONE_MACHINE in os.environ or not loopback_only(address):
        return False
    os.environ[ONE_MACHINE] = "0"
    return True
