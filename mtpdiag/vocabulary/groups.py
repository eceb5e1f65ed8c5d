"""Coordinates and process-group kinds as a person reads them, and as megatron-core describes its groups."""

from __future__ import annotations

# The coordinates of a rank, in the order they are always shown.
COORDINATES = ("tp", "cp", "ep", "dp", "pp")

# Group kinds (``mtpdiag.layout.GROUP_KINDS``) as the report names them.
GROUP_NAMES = {
    "tp": "TP",
    "cp": "CP",
    "dp": "DP",
    "pp": "PP",
    "ep": "EP",
    "dp_cp": "DP×CP",
    "tp_cp": "TP×CP",
    "tp_dp": "TP×DP",
    "tp_dp_cp": "TP×DP×CP",
    "mp": "model-parallel (TP×PP)",
    "world": "world",
    "etp": "expert-TP",
    "edp": "expert-DP",
    "tp_ep": "TP×EP",
    "tp_ep_pp": "TP×EP×PP",
}

# megatron-core's process-group descriptions (the Flight Recorder's and the watchdog's) -> group kinds.
MEGATRON_GROUP_KINDS = {
    "default_pg": "world",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_GLOO": "dp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp_cp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "MODEL_PARALLEL_GROUP": "mp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
    "EXPERT_DATA_PARALLEL_GROUP_GLOO": "edp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
}


def group_name(kind: str) -> str:
    """``dp_cp`` -> ``DP×CP``; a kind the table does not know as it is."""
    return GROUP_NAMES.get(kind, kind)
