"""``watch --ray``'s Flight Recorder state, kept on the driver between samples (``ray_cluster.ClusterProgress``).

Each node's capture task polls its own ranks and hands back their new state; the driver must take it for those
ranks only, keep the state of ranks on nodes that did not answer, and report a move once.
"""

from __future__ import annotations

from mtpdiag.capture.flight_recorder import LiveProgress
from mtpdiag.capture.ray_cluster import ClusterProgress


def test_a_node_s_reply_replaces_the_state_of_the_ranks_it_polled_and_only_those():
    progress = ClusterProgress()
    progress.update(
        [
            {
                "fr_progress": {
                    "moved": False,
                    "ranks": [0, 1],
                    "state": {"asked": {0: 10.0, 1: 10.0}, "read_mtime": {}, "completed": {}},
                }
            },
            {
                "fr_progress": {
                    "moved": False,
                    "ranks": [2, 3],
                    "state": {"asked": {2: 10.5, 3: 10.5}, "read_mtime": {}, "completed": {}},
                }
            },
        ]
    )
    assert progress.poll(()) is False
    # Node A answered: ranks 0 and 1 were read (no open request any more); node B's task failed this time.
    progress.update(
        [
            {
                "fr_progress": {
                    "moved": False,
                    "ranks": [0, 1],
                    "state": {"asked": {}, "read_mtime": {0: 11.0, 1: 11.0}, "completed": {0: 7, 1: 7}},
                }
            }
        ]
    )
    assert progress.state == {"asked": {2: 10.5, 3: 10.5}, "read_mtime": {0: 11.0, 1: 11.0}, "completed": {0: 7, 1: 7}}
    progress.update([{"node": "b"}, {"fr_progress": {"moved": True, "ranks": [2], "state": {}}}])
    assert progress.state["asked"] == {3: 10.5}  # rank 2 was polled and has no open request now
    assert progress.poll(()) is True and progress.poll(()) is False  # a move is reported once


def test_live_progress_state_round_trips_through_plain_data():
    state = {"asked": {1: 5.0}, "read_mtime": {0: 4.0, 1: 3.0}, "completed": {0: 12, 1: 11}}
    assert LiveProgress(state).state() == state
    assert LiveProgress(state).state({0}) == {"asked": {}, "read_mtime": {0: 4.0}, "completed": {0: 12}}
    assert LiveProgress().state() == {"asked": {}, "read_mtime": {}, "completed": {}}
