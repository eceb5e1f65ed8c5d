"""``watch --ray``'s Flight Recorder state, kept on the driver between samples (``ClusterProgress``).

Each node's capture task polls its own ranks and hands back their new state; the driver must take it for those
ranks only, keep the state of ranks on nodes that did not answer, keep the highest mark of every group (groups
span nodes), and report a move once, dated by its age on the node (the nodes' clocks need not agree).
"""

from __future__ import annotations

import time

from mtpdiag.capture.cluster_progress import ClusterProgress


def test_a_node_s_reply_replaces_the_state_of_the_ranks_it_polled_and_only_those():
    progress = ClusterProgress()
    progress.update(
        [
            {
                "fr_progress": {
                    "moved": False,
                    "ranks": [0, 1],
                    "state": {"asked": {0: 10.0, 1: 10.0}, "read_mtime": {}, "marks": {}},
                }
            },
            {
                "fr_progress": {
                    "moved": False,
                    "ranks": [2, 3],
                    "state": {"asked": {2: 10.5, 3: 10.5}, "read_mtime": {}, "marks": {}},
                }
            },
        ]
    )
    assert progress.poll(()) is None
    # Node A answered: ranks 0 and 1 were read (no open request any more); node B's task failed this time.
    progress.update(
        [
            {
                "fr_progress": {
                    "moved": False,
                    "ranks": [0, 1],
                    "state": {
                        "asked": {},
                        "read_mtime": {0: 11.0, 1: 11.0},
                        "marks": {"0[0, 1, 2, 3]": [7, 10.9], "13[0, 1]": [3, 10.8]},
                    },
                }
            }
        ]
    )
    assert progress.state == {
        "asked": {2: 10.5, 3: 10.5},
        "read_mtime": {0: 11.0, 1: 11.0},
        "first_read": {},  # an older node's mtpdiag sends none
        "marks": {"0[0, 1, 2, 3]": [7, 10.9], "13[0, 1]": [3, 10.8]},
    }
    before = time.time()
    progress.update(
        [
            {"node": "b"},
            {
                "fr_progress": {
                    "moved": True,
                    "age_s": 4.0,
                    "ranks": [2],
                    "state": {"marks": {"0[0, 1, 2, 3]": [6, 9.0], "14[2, 3]": [2, 11.2]}},
                }
            },
        ]
    )
    assert progress.state["asked"] == {3: 10.5}  # rank 2 was polled and has no open request now
    assert progress.state["marks"]["0[0, 1, 2, 3]"] == [7, 10.9]  # a node behind keeps no group back
    assert progress.state["marks"]["14[2, 3]"] == [2, 11.2]
    moved = progress.poll(())
    assert moved is not None and before - 4.0 <= moved <= time.time() - 4.0  # four seconds old, on this clock
    assert progress.poll(()) is None  # a move is reported once


def test_a_node_that_gives_no_age_dates_its_move_now():
    """An older mtpdiag on a node answers ``moved`` alone."""
    progress = ClusterProgress()
    before = time.time()
    progress.update([{"fr_progress": {"moved": True, "ranks": [0], "state": {}}}])
    moved = progress.poll(())
    assert moved is not None and before <= moved <= time.time()


def test_established_once_every_node_s_piped_ranks_were_read_a_first_time():
    """Each node says which of its ranks have a debug-info pipe and when each was first read; the signal can see
    every group move from the latest of those first reads (``Watcher`` waits a window past it)."""

    def reply(ranks, first_read):
        state = {"asked": {}, "read_mtime": dict(first_read), "first_read": dict(first_read), "marks": {}}
        return {"fr_progress": {"moved": False, "ranks": ranks, "piped": ranks, "state": state}}

    progress = ClusterProgress()
    assert progress.established_at() == float("-inf")  # no node said it has a piped rank
    progress.update([reply([0, 1], {0: 11.0, 1: 12.0}), reply([2, 3], {2: 11.5})])
    assert progress.established_at() is None  # rank 3 has not answered
    progress.update([reply([2, 3], {2: 11.5, 3: 13.0})])
    assert progress.established_at() == 13.0
    progress.update([{"node": "a"}])  # a node whose task failed this time: its ranks' reads are kept
    assert progress.established_at() == 13.0
