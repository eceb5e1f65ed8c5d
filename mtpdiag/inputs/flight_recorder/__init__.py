"""torch's Flight Recorder dumps, read from disk into ``model.flight_recorder`` records.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=N``, on by default for NCCL since torch 2.8) keeps each rank's last
N ops: the process group, the group's sequence number, the op, its sizes, dtypes, state and the Python stack
that issued it. On a GPU hang it is often the only record of *which* collective hangs.

* ``dump``: load the per-rank files (pickle or JSON) without running code (``load_fr_dumps``);
* ``parse``: one rank's content, as torch wrote it, into an ``FRRankDump``;
* ``names``: torch's profiling names (``nccl:send 0->1``) read into public op names;
* ``calls``: a rank's entries in one group read as the calls it made (a batch and its closing entry);
* ``sites``: an entry's stack as display sites, with qualified names read from the source files.
"""

from mtpdiag.inputs.flight_recorder.dump import load_fr_dumps, read_dump_file
from mtpdiag.inputs.flight_recorder.names import op_name, parse_profiling_name

__all__ = ["load_fr_dumps", "op_name", "parse_profiling_name", "read_dump_file"]
