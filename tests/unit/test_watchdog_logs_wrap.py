"""Wrapped watchdog lines joined back (``inputs.watchdog_lines``), on the public logs of
``tests/fixtures/watchdog_logs/``: a number cut by a wrap is read whole, two lines that are each whole are never
joined, and real lines wrapped at every column (hard, padded to the width, or at spaces with the space dropped
as an editor does) read exactly as unwrapped. The wrapping in the last tests is done by the test, on real lines.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mtpdiag.inputs.watchdog_lines import logical_lines
from mtpdiag.inputs.watchdog_log import parse_watchdog_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "watchdog_logs"


def lines_of(name: str) -> list[str]:
    return (FIXTURES / f"{name}.log").read_text(encoding="utf-8").splitlines()


def test_a_number_cut_by_a_wrap_is_read_whole():
    """sglang #3836: ``NumelOut=5872`` / ``0256``; sglang #3424: ``Timeout(ms)=`` / ``600000`` and ``last compl`` /
    ``eted NCCL work: 1522788``, rows padded with spaces."""
    rank5 = next(
        t for t in parse_watchdog_log("\n".join(lines_of("sglang_3836_wrap_in_number"))).timeouts if t.rank == 5
    )
    assert (rank5.seq, rank5.numel_in, rank5.numel_out, rank5.timeout_ms, rank5.ran_for_ms) == (
        5653,
        58720256,
        58720256,
        600000,
        600028,
    )
    [rank4] = parse_watchdog_log("\n".join(lines_of("sglang_3424_wrap_padded"))).timeouts
    assert (rank4.timeout_ms, rank4.last_enqueued, rank4.last_completed) == (600000, 1522789, 1522788)


def test_a_status_number_cut_at_the_end_of_its_line_is_read_whole():
    """The 2.5+ status line ends in its number: a wrap inside it leaves only digits on the next row."""
    [line] = [x for x in lines_of("qwenvl_194_failure_no_optype") if "1116" in x and "[rank1]" in x]
    cut = len(line) - 2  # "... last completed work: 11" / "15"
    [t, *_] = parse_watchdog_log(f"{line[:cut]}\n{line[cut:]}\n").timeouts
    assert t.last_completed == 1115


def test_two_whole_lines_are_never_joined():
    """A whole timeout line followed by a stray fragment that starts no record (sglang #3836's
    ``4] -> 5[5] via P2P/IPC``), and a whole status line that ends in a number followed by that fragment (it
    starts with a digit): each stays a line of its own, its numbers unchanged."""
    sglang = lines_of("sglang_3836_wrap_in_number")
    timeout_at = next(i for i, x in enumerate(sglang) if x.startswith("[rank4]"))
    fragment = sglang[timeout_at + 1]
    assert fragment == "4] -> 5[5] via P2P/IPC"
    status = next(x for x in lines_of("arctic_219_failure_interleaved") if "120049" in x)
    for first in (sglang[timeout_at], status):
        joined = [line for _, line in logical_lines(f"{first}\n{fragment}\n")]
        assert joined == [first, fragment]
    [t] = parse_watchdog_log(f"{status}\n{fragment}\n").timeouts
    assert (t.seq, t.last_enqueued, t.last_completed) == (120049, 120051, 120048)
    [t] = parse_watchdog_log(f"{sglang[timeout_at]}\n{fragment}\n").timeouts
    assert t.ran_for_ms == 600011


# Real blocks of lines of every shape: timeouts with their 2.4/2.5 status lines, a dump signal, 2.5+ failures.
BLOCKS = {
    "basicsr_737_pg_guid_desc": slice(0, 4),
    "llamafactory_6269_pg_uid": slice(0, 9),
    "openrlhf_1126_failure_detected": slice(0, 4),
    "qwenvl_194_failure_no_optype": slice(0, 6),
    "nccl_1610_rank_disagree": slice(0, 4),
}


# The narrowest wrap tried: a row must hold the start of torch's own prefix ("[rankN]:", the glog header) for
# the rows after it to be known as its rest; nccl #1610's lines carry 18 columns of timestamp before it.
MIN_WIDTH = 40


def _reading(text: str) -> tuple:
    """What the log says, without line numbers, glog thread ids (a wrap may split them off their timestamp)
    or the signal's own words (a dropped space may merge two)."""
    log = parse_watchdog_log(text)
    timeouts = tuple(
        (t.rank, t.group, t.seq, t.op_type, t.numel_in, t.numel_out, t.timeout_ms, t.ran_for_ms, t.blocking_wait)
        + (t.last_enqueued, t.last_completed, t.work_rank)
        for t in log.timeouts
    )
    statuses = tuple(
        (s.rank, s.group, s.failed_seq, s.last_enqueued, s.last_completed, s.signal_rank) for s in log.statuses
    )
    return timeouts, statuses, log.notes


def _hard(line: str, width: int, pad: bool) -> list[str]:
    rows = [line[i : i + width] for i in range(0, len(line), width)] or [""]
    return [rows[0], *(r.ljust(width) if pad else r for r in rows[1:])]


def _at_spaces(line: str, width: int) -> list[str]:
    return textwrap.wrap(line, width, break_long_words=True, break_on_hyphens=False) or [""]


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("how", ["hard", "padded", "at spaces"])
def test_real_lines_wrapped_at_every_column_read_as_unwrapped(name, how):
    lines = lines_of(name)[BLOCKS[name]]
    whole = _reading("\n".join(lines))
    assert whole[0] or whole[1]
    for width in range(MIN_WIDTH, max(map(len, lines)) + 2):
        rows = []
        for line in lines:
            if how == "at spaces":
                rows += _at_spaces(line, width)
            else:
                rows += _hard(line, width, pad=how == "padded")
        assert _reading("\n".join(rows)) == whole, (how, width)
