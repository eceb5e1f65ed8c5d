"""The words of the report contracts (docs/design.md) as ``StrEnum``s: a member is its JSON string, so it
compares, hashes and serialises as that string, and a typo is a NameError instead of a silent mismatch."""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` of Python 3.11: ``str()``, ``format()`` and ``hash()`` are the value's."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]

        def __hash__(self) -> int:
            return str.__hash__(self)


class ProcessState(StrEnum):
    """A captured process's state (``RankCapture.state``): its ``/proc/PID/stat`` letter, or how the capture
    went when there is no letter to give. The field stays a string: a kernel may report letters not listed."""

    RUNNING = "R"
    SLEEPING = "S"
    DISK = "D"  # uninterruptible sleep
    STOPPED = "T"  # job-control stop (SIGSTOP)
    TRACED = "t"  # tracing stop
    ZOMBIE = "Z"
    GONE = "gone"  # the process exited before or during the capture
    UNREADABLE = "unreadable"  # no stack could be read
    UNKNOWN = "unknown"  # read from a file: py-spy and the others do not record the process state


class RankState(StrEnum):
    """A rank as the report shows it (``RankView.state``)."""

    COLLECTIVE = "collective"
    WAITING = "waiting"  # blocked outside any collective; its wait says on what
    RUNNING = "running"
    STOPPED = "stopped"
    GONE = "gone"
    UNREADABLE = "unreadable"


# States of a rank that cannot take part in anything: it is stopped, exited or could not be read.
FROZEN_STATES = (RankState.STOPPED, RankState.GONE, RankState.UNREADABLE)


class Verdict(StrEnum):
    OK = "ok"
    PROBLEM = "problem"
    INCOMPLETE = "incomplete"  # ranks are stuck, but the evidence cannot say why


class Role(StrEnum):
    """A split collective's place in a deadlock: only the root gets a finding."""

    ROOT = "root"
    CONSEQUENCE = "consequence"


class GateStrength(StrEnum):
    STRONG = "strong"  # several ranks on each side split cleanly along the gate
    WEAK = "weak"  # one rank alone, or other coordinates separate the sides as well


class GroupFrom(StrEnum):
    """Where a split's group kind came from."""

    KNOWN_SITE = "known-site"
    FLIGHT_RECORDER = "flight-recorder"
    WATCHDOG_LOG = "watchdog-log"
    UNIQUE_FIT = "unique-fit"
    WORLD_OP = "world-op"
    GUESS = "guess"


class Source(StrEnum):
    """The evidence a split was read from."""

    STACKS = "stacks"
    FLIGHT_RECORDER = "flight-recorder"
    STACKS_AND_FLIGHT_RECORDER = "stacks+flight-recorder"
    WATCHDOG_LOG = "watchdog-log"


class OrderSource(StrEnum):
    """What a root's program order rests on (``details.order.source``)."""

    STACKS = "stacks"  # line order in the deepest frame two stacks share
    KNOWN_SITE = "known-site"  # the known-site table's early return
    STACKS_AND_KNOWN_SITE = "stacks+known-site"
    FLIGHT_RECORDER = "flight-recorder"  # sequence numbers on a shared communicator


class FindingId(StrEnum):
    """The stable finding ids users script against."""

    MTP_CP_GATED_REDUCE = "mtp-cp-gated-reduce"
    GATED_COLLECTIVE = "gated-collective"
    P2P_UNMATCHED = "p2p-unmatched"
    STRAGGLER = "straggler"
    FROZEN_RANK = "frozen-rank"
    MISSING_RANK = "missing-rank"
    ALL_WAITING = "all-waiting"
    SIZE_MISMATCH = "size-mismatch"
    DTYPE_MISMATCH = "dtype-mismatch"
    UNEXPLAINED_WAIT = "unexplained-wait"


class Outcome(StrEnum):
    """How one ``verify`` world ended."""

    COMPLETED = "completed"
    DEADLOCK = "deadlock"
    ERROR = "error"


class CheckStatus(StrEnum):
    """``mtpdiag check``'s verdict on verl's engine (``mtpdiag.check/1``)."""

    AFFECTED = "affected"
    FIXED = "fixed"
    NOT_APPLICABLE = "not-applicable"
    UNKNOWN = "unknown"


class EngineGate(StrEnum):
    """The gate around verl's MTP-loss collection: the one that deadlocks with cp > 1 (verl PR #5895), or the
    fixed one (``check``'s verdict, ``verify``'s runs)."""

    BUGGY = "buggy"
    FIXED = "fixed"


class OutputFormat(StrEnum):
    """A report's output format (``--format``): one per renderer of ``mtpdiag.report.RENDERERS``."""

    CONSOLE = "console"
    JSON = "json"
    MARKDOWN = "markdown"
    HTML = "html"


class WatchPhase(StrEnum):
    """What ``watch``'s and ``run``'s samples say so far (``pipeline.watcher.Watcher.decide``; ``run``'s event log)."""

    STARTING = "starting"  # not armed yet: the job was never seen to move (run only)
    PROGRESS = "progress"  # a rank moved within the last samples
    SLOW = "slow"  # quiet, for less than the window
    PAUSED = "paused"  # quiet past the window, but some rank is in a phase of its own (run's --pause-after)
    HANG = "hang"  # quiet past the window, seen by at least two stack samples


class StackRead(StrEnum):
    """How ``run``'s watcher reads the ranks' stacks at a sample (``analysis.stall.stack_read``)."""

    SKIP = "skip"  # not at all: the Flight Recorder showed a collective completed moments ago
    PAUSED = "paused"  # a blocking py-spy dump: no main thread ran, so the short pause costs nobody
    RUNNING = "running"  # py-spy --nonblocking: a main thread ran (working, or spinning at a host sync)
