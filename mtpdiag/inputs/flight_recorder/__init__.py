"""torch's Flight Recorder dumps, read from disk into ``model.flight_recorder`` records.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=N``, on by default for NCCL since torch 2.8) keeps each rank's last
N ops: the process group, the group's sequence number, the op, its sizes, dtypes, state and the Python stack
that issued it. On a GPU hang it is often the only record of *which* collective hangs.

* ``dump``: load the per-rank files (pickle or JSON) without running code (``load_fr_dumps``);
* ``parse``: one rank's content, as torch wrote it, into an ``FRRankDump``;
* ``sites``: an entry's stack as display sites, with qualified names read from the source files.

torch's profiling names (``nccl:send 0->1``) are read into public op names by ``vocabulary.profiling_names``
(re-exported here), and a rank's entries into the calls it made by ``analysis.flight_recorder.calls``.
"""

from mtpdiag.inputs.flight_recorder.dump import load_fr_dumps, read_dump_file
from mtpdiag.vocabulary.profiling_names import op_name, parse_profiling_name

__all__ = ["load_fr_dumps", "op_name", "parse_profiling_name", "read_dump_file"]
