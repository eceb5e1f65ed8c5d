"""torch Flight Recorder dumps: read them safely, and hold them against the stack diagnosis.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=N``) keeps each rank's last N collectives: the process
group (a name that is the same on every member, and a description such as megatron's
``DATA_PARALLEL_GROUP_WITH_CP``), the per-group collective sequence number, the op and its state.
Stacks say where each rank waits now; the recorder says how far each rank got in each group and
which ranks a group really has.

* ``dump``: the per-rank pickles, read by an unpickler that refuses every class (``load_fr_dumps``);
* ``progress``: per group, each member's last entered and completed sequence id, and who is behind;
* ``correlate``: that view next to a ``Report``, as JSON for ``Report.extra["flight_recorder"]``.
"""

from mtpdiag.flight_recorder.correlate import correlate, ops_match
from mtpdiag.flight_recorder.dump import (
    FRDump,
    FREntry,
    FRGroup,
    FRGroupStatus,
    FRRankDump,
    load_fr_dumps,
    op_name,
)
from mtpdiag.flight_recorder.progress import MEGATRON_GROUP_KINDS, GroupProgress, group_progress

__all__ = [
    "FRDump", "FREntry", "FRGroup", "FRGroupStatus", "FRRankDump", "GroupProgress", "MEGATRON_GROUP_KINDS",
    "correlate", "group_progress", "load_fr_dumps", "op_name", "ops_match",
]
