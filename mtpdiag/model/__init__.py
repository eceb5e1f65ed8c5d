"""The data that flows through mtpdiag: captures in (``captures``), the diagnosis out (``report``).

Frozen msgspec Structs whose fields are their JSON (``fields.Record``): compiled decoders check a document
against the type as they build it, and the encoders write the type back. No other I/O. ``from mtpdiag.model
import X`` works for every name below; ``replace`` copies a Struct (or a dataclass) with some fields changed.
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
    Env,
    RankCapture,
    Snapshot,
    ThreadStack,
    who_and_why,
    world_sizes,
)
from mtpdiag.model.fields import Record, SchemaError, decimal, printable, replace
from mtpdiag.model.frames import Frame, FrameArgs, Site, Stack
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
    "BUNDLE_SCHEMA",
    "ENV_WHITELIST",
    "REPORT_SCHEMA",
    "STATE_DISK",
    "STATE_RUNNING",
    "STATE_SLEEPING",
    "STATE_GONE",
    "STATE_STOPPED",
    "STATE_UNKNOWN",
    "STATE_UNREADABLE",
    "STATE_ZOMBIE",
    "UNKNOWN_HOST",
    "Env",
    "Finding",
    "FlightRecorderSection",
    "Frame",
    "FrameArgs",
    "Mismatch",
    "Progress",
    "RankCapture",
    "RankView",
    "Record",
    "Report",
    "SchemaError",
    "Site",
    "SiteGroup",
    "Snapshot",
    "Stack",
    "ThreadStack",
    "WaitState",
    "WatchdogSection",
    "decimal",
    "printable",
    "replace",
    "who_and_why",
    "world_sizes",
]
