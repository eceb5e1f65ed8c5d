"""``--ray``'s rule for a head that listens on the loopback only (mtpdiag.capture.ray_address), on real sockets."""

from __future__ import annotations

import socket

import pytest

from mtpdiag.capture import ray_address
from mtpdiag.capture.ray_address import ONE_MACHINE, host_address, keep_loopback, loopback_only


@pytest.fixture
def listener(request):
    """A TCP socket listening at the address the test asks for (a GCS's port stands in for it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((request.param, 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("listener", ["127.0.0.1"], indirect=True)
def test_a_head_on_the_loopback_only_is_kept_there(listener, monkeypatch):
    monkeypatch.delenv(ONE_MACHINE, raising=False)
    on_a_network = host_address() != "127.0.0.1"  # a host without a route: Ray keeps 127.0.0.1 itself
    print(f"host address as Ray gives it: {host_address()}")
    assert loopback_only(f"127.0.0.1:{listener}") == on_a_network
    assert loopback_only(f"localhost:{listener}") == on_a_network
    assert keep_loopback(f"127.0.0.1:{listener}") == on_a_network
    assert (ray_address.os.environ.get(ONE_MACHINE) == "0") == on_a_network
    monkeypatch.delenv(ONE_MACHINE, raising=False)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{listener}")  # --ray auto reads it
    assert keep_loopback("auto") == on_a_network


@pytest.mark.parametrize("listener", ["0.0.0.0"], indirect=True)
def test_a_head_on_every_address_is_left_to_ray(listener, monkeypatch):
    monkeypatch.delenv(ONE_MACHINE, raising=False)
    assert not loopback_only(f"127.0.0.1:{listener}")
    assert not keep_loopback(f"127.0.0.1:{listener}")
    assert ONE_MACHINE not in ray_address.os.environ


def test_nothing_listening_other_hosts_and_the_users_own_setting_are_left_alone(monkeypatch):
    with socket.socket() as sock:  # a port nothing listens at once it is closed
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert not loopback_only(f"127.0.0.1:{closed}")
    assert not loopback_only("10.0.0.1:6379") and not loopback_only("ray://127.0.0.1:10001")
    assert not loopback_only("auto") and not loopback_only("127.0.0.1:port")
    monkeypatch.setenv(ONE_MACHINE, "1")
    assert not keep_loopback(f"127.0.0.1:{closed}")
    assert ray_address.os.environ[ONE_MACHINE] == "1"


def test_a_ray_client_address_names_its_server_with_rays_default_port():
    from mtpdiag.capture.ray_address import client_server

    assert client_server("ray://127.0.0.1:46713") == "127.0.0.1:46713"
    assert client_server("ray://head") == "head:10001"
    assert client_server("ray://head:10002/namespace") == "head:10002"
    assert client_server("ray://[::1]:5") == "[::1]:5"
    assert client_server("ray://[::1]") == "[::1]:10001"


@pytest.mark.parametrize("listener", ["127.0.0.1"], indirect=True)
def test_only_a_port_that_refuses_connections_is_counted_as_a_dead_raylet(listener):
    with socket.socket() as sock:  # a port nothing listens at any more: a raylet that died
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    asked = [("127.0.0.1", listener), ("127.0.0.1", closed), ("127.0.0.1", listener)]
    assert ray_address.refusing(asked, timeout=5.0) == {("127.0.0.1", closed)}
    assert ray_address.refusing([]) == set()
