"""``--ray [ADDRESS]``: typer's options take a value or none, so the CLI gives a bare ``--ray`` its default."""

from __future__ import annotations

import pytest

from mtpdiag.commands.options import fill_optional_values


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["inspect", "--ray"], ["inspect", "--ray", "auto"]),
        (["inspect", "--ray", "--json"], ["inspect", "--ray", "auto", "--json"]),
        (["inspect", "--ray", "10.0.0.1:6379", "--json"], ["inspect", "--ray", "10.0.0.1:6379", "--json"]),
        (["inspect", "--ray=ray://head:10001"], ["inspect", "--ray=ray://head:10001"]),
        (["collect", "--ray", "--out", "d"], ["collect", "--ray", "auto", "--out", "d"]),
        (["inspect", "--all"], ["inspect", "--all"]),
        (["analyze", "--", "--ray"], ["analyze", "--", "--ray"]),  # after --, an argument
    ],
)
def test_a_bare_ray_means_auto(argv, expected):
    assert fill_optional_values(argv) == expected


@pytest.mark.parametrize("command", ["inspect", "collect", "watch"])
def test_the_help_names_the_extra_to_install(command):
    """Rich reads ``[ray]`` as markup and drops it unless it is escaped (the help said ``pip install 'mtpdiag'``)."""
    import os
    import subprocess
    import sys

    from support.jobs_e2e import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "mtpdiag", command, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "400"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'mtpdiag[ray]'" in done.stdout, done.stdout
