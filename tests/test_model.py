"""The model's own contracts: what a bundle's fields may hold, whatever was read before them."""

from __future__ import annotations

import pytest

from mtpdiag.model import SchemaError, Snapshot, ThreadStack


def _thread(*frames: dict) -> dict:
    return {"thread_id": 1, "name": "MainThread", "frames": list(frames)}


def _frame(**extra) -> dict:
    return {"function": "send", "file": "torch/distributed/distributed_c10d.py", "line": 10, **extra}


@pytest.mark.parametrize("good, bad", [
    ({"args": {"dst": 1}}, {"args": {"dst": True}}),
    ({"args": {"dst": 0}}, {"args": {"dst": False}}),
    ({"native": False}, {"native": 0}),
    ({"line": 1}, {"line": True}),
])
def test_a_bad_frame_is_refused_whatever_was_read_before_it(good, bad):
    """The readers share equal frames between ranks; a frame read first must not vouch for a different one
    that compares equal to it (``True == 1``)."""
    with pytest.raises(SchemaError):
        ThreadStack.from_dict(_thread(_frame(**bad)))
    seen: dict = {}
    ThreadStack.from_dict(_thread(_frame(**good)), seen)
    with pytest.raises(SchemaError):
        ThreadStack.from_dict(_thread(_frame(**bad)), seen)
    # the same frame after another one: each frame is keyed alone as well as in its stack
    with pytest.raises(SchemaError):
        ThreadStack.from_dict(_thread(_frame(function="f", line=2), _frame(**bad)), seen)


def test_a_bad_frame_in_a_later_bundle_is_refused():
    good = {"schema": "mtpdiag.bundle/1", "captures": [{"rank": 0, "state": "S", "threads": [
        _thread(_frame(args={"dst": 1}))]}]}
    bad = {"schema": "mtpdiag.bundle/1", "captures": [{"rank": 1, "state": "S", "threads": [
        _thread(_frame(function="f", line=2), _frame(args={"dst": True}))]}]}
    seen: dict = {}
    Snapshot.from_dict(good, seen)
    with pytest.raises(SchemaError):
        Snapshot.from_dict(bad, seen)
