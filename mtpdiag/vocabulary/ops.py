"""torch.distributed's ops, by the names the report uses (torch's public function names), and how torch's
Flight Recorder and NCCL watchdog spell them."""

from __future__ import annotations

# Public torch.distributed functions a rank can block in.
KNOWN_OPS = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_coalesced",
        "all_gather_object",
        "all_gather_single",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "send",
        "recv",
        "isend",
        "irecv",
        "send_object_list",
        "recv_object_list",
        "batch_isend_irecv",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "init_process_group",
        "new_group",
        "new_subgroups",
        "new_subgroups_by_enumeration",
        "split_group",
        "destroy_process_group",
        "init_device_mesh",
    }
)
WAIT_OP = "wait"  # a bare Work.wait
BATCH_P2P_OP = "batch_isend_irecv"
# Ops with one peer rather than a group; with the batched form, every point-to-point call.
SEND_OPS = frozenset({"send", "isend", "send_object_list"})
RECV_OPS = frozenset({"recv", "irecv", "recv_object_list"})
P2P_OPS = SEND_OPS | RECV_OPS
P2P_CALLS = P2P_OPS | {BATCH_P2P_OP}
# Each point-to-point call and the one that completes it on the peer.
P2P_PARTNER = {
    "send": "recv",
    "recv": "send",
    "isend": "irecv",
    "irecv": "isend",
    "send_object_list": "recv_object_list",
    "recv_object_list": "send_object_list",
}
BARRIER_OPS = frozenset({"barrier", "monitored_barrier"})
# Ops that create or initialise communicators: NCCL blocks the CPU in them.
COMM_INIT_OPS = frozenset(
    {
        "init_process_group",
        "new_group",
        "new_subgroups",
        "new_subgroups_by_enumeration",
        "split_group",
        "init_device_mesh",
    }
)
# Ops that take the default (world) group in practice: every rank of the world must enter them.
WORLD_OPS = BARRIER_OPS | COMM_INIT_OPS | {"destroy_process_group"}
# Calls that every member of a group must make (what ``lint`` looks for; point-to-point apart), in the
# spellings source code uses, private ones included.
GROUP_CALLS = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_coalesced",
        "_all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "new_group",
        "new_subgroups",
        "new_subgroups_by_enumeration",
    }
)

# The Flight Recorder's profiling names (``nccl:_allgather_base``): torch's internal type -> the public op.
RECORDED_OPS = {
    "_all_gather_base": "all_gather_into_tensor",
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_base": "all_gather_into_tensor",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_reduce_barrier": "barrier",
    "allreduce": "all_reduce",
    "sparse_all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce",
    "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all",
    "ALLGATHER_coalesced": "all_gather",
    "REDUCE_SCATTER_coalesced": "reduce_scatter",
}
RECORDED_P2P = frozenset({"send", "recv"})  # the recorder's point-to-point types
# Closing entries of a batch whose parts recorded the op: the batch is this public op.
RECORDED_BATCH_OPS = {"ALLGATHER_coalesced": "all_gather", "REDUCE_SCATTER_coalesced": "reduce_scatter"}
# Ops whose per-rank sizes legitimately differ (torch's analyzer exempts the same ones).
UNEVEN_INPUT_OPS = frozenset({"all_to_all", "all_to_all_single", "scatter"})
UNEVEN_OUTPUT_OPS = frozenset({"all_to_all", "all_to_all_single", "gather"})
# A stack's op -> the recorded ops it issues (an object collective records the tensor one it runs).
RECORDED_FOR = {
    "all_gather_object": {"all_gather"},
    "gather_object": {"gather", "all_gather"},
    "broadcast_object_list": {"broadcast"},
    "scatter_object_list": {"scatter", "broadcast"},
    "send_object_list": {"send"},
    "recv_object_list": {"recv"},
    "isend": {"send"},
    "irecv": {"recv"},
    "all_reduce_coalesced": {"allreduce_coalesced", "all_reduce"},
    "monitored_barrier": {"barrier", "send", "recv"},
}

# The NCCL watchdog's OpType (ProcessGroup's opTypeToString) -> the public op.
WORK_OP_TYPES = {
    "ALLREDUCE": "all_reduce",
    "_ALLREDUCE_SPARSE": "all_reduce",
    "ALLREDUCE_COALESCED": "all_reduce_coalesced",
    "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "all_gather_into_tensor",
    "ALLGATHER_COALESCED": "all_gather_coalesced",
    "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather_into_tensor_coalesced",
    "REDUCE_SCATTER": "reduce_scatter",
    "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor_coalesced",
    "BROADCAST": "broadcast",
    "REDUCE": "reduce",
    "GATHER": "gather",
    "SCATTER": "scatter",
    "ALLTOALL": "all_to_all",
    "ALLTOALL_BASE": "all_to_all_single",
    "SEND": "send",
    "RECV": "recv",
    "RECVANYSOURCE": "recv",
    "BARRIER": "barrier",
    "COALESCED": "coalesced",
    "UNKNOWN": "unknown",
}
# Watchdog ops (public names) whose works count in their own sequence: point-to-point works carry the group's
# p2p number, and a coalesced batch may be either kind; their sizes legitimately differ across ranks.
WORK_P2P_OPS = frozenset({"send", "recv"})
WORK_OWN_COUNT_OPS = WORK_P2P_OPS | {"coalesced"}
# What the watchdog writes before a ``WorkNCCL(...)`` that timed out (regular expressions; a wrap may have
# dropped a space): the watchdog's timeout (1.8 to today) and a blocking wait's (1.7; later ones end in
# "timed out in blocking wait").
WORK_TIMEOUT_PHRASES = (
    r"Watchdog\s*caught\s*collective\s*operation\s*timeout",
    r"Caught\s*collective\s*operation\s*timeout\s*for\s*work",
)

# Commands that launch a job rather than being a rank of it (only the interpreter, its flags and the program
# are read from a command line).
LAUNCHER_PROGRAMS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def is_launcher_argv(argv: list[str]) -> bool:
    """Whether a command line runs torchrun."""
    import os

    return any(os.path.basename(a) in LAUNCHER_PROGRAMS or a in LAUNCHER_MODULES for a in argv[:4])
