"""``--ray [ADDRESS]``: typer's options take a value or none, so the CLI gives a bare ``--ray`` its default."""

from __future__ import annotations

import pytest

from mtpdiag.commands.options import fill_optional_values


@pytest.mark.parametrize("argv,expected", [
    (["inspect", "--ray"], ["inspect", "--ray", "auto"]),
    (["inspect", "--ray", "--json"], ["inspect", "--ray", "auto", "--json"]),
    (["inspect", "--ray", "10.0.0.1:6379", "--json"], ["inspect", "--ray", "10.0.0.1:6379", "--json"]),
    (["inspect", "--ray=ray://head:10001"], ["inspect", "--ray=ray://head:10001"]),
    (["collect", "--ray", "--out", "d"], ["collect", "--ray", "auto", "--out", "d"]),
    (["inspect", "--all"], ["inspect", "--all"]),
    (["analyze", "--", "--ray"], ["analyze", "--", "--ray"]),  # after --, an argument
])
def test_a_bare_ray_means_auto(argv, expected):
    assert fill_optional_values(argv) == expected
