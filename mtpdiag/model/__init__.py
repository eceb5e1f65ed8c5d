"""The data that flows through mtpdiag: captures in (``captures``), the diagnosis out (``report``).

Frozen dataclasses with versioned JSON (de)serialization and no other I/O; ``fields`` is the checked
reading they share. ``from mtpdiag.model import X`` works for every name below.
"""

from mtpdiag.model.captures import (
    BUNDLE_SCHEMA,
    ENV_WHITELIST,
    STATE_DISK,
    STATE_GONE,
    STATE_RUNNING,
    STATE_SLEEPING,
    STATE_STOPPED,
    STATE_UNKNOWN,
    STATE_UNREADABLE,
    STATE_ZOMBIE,
    UNKNOWN_HOST,
    RankCapture,
    Snapshot,
    ThreadStack,
    who_and_why,
    world_sizes,
)
from mtpdiag.model.fields import SchemaError, decimal, printable
from mtpdiag.model.frames import Frame, Site
from mtpdiag.model.report import (
    REPORT_SCHEMA,
    Finding,
    Mismatch,
    RankView,
    Report,
    SiteGroup,
    WaitState,
)
from mtpdiag.model.sections import FlightRecorderSection, Progress, WatchdogSection

__all__ = [
    "BUNDLE_SCHEMA", "ENV_WHITELIST", "REPORT_SCHEMA", "STATE_DISK", "STATE_RUNNING", "STATE_SLEEPING",
    "STATE_GONE", "STATE_STOPPED", "STATE_UNKNOWN", "STATE_UNREADABLE", "STATE_ZOMBIE", "UNKNOWN_HOST", "Finding", "FlightRecorderSection", "Frame", "Mismatch", "Progress",
    "RankCapture", "RankView", "Report", "SchemaError", "Site", "SiteGroup", "Snapshot", "ThreadStack", "WaitState",
    "WatchdogSection", "decimal", "printable", "who_and_why", "world_sizes",
]
