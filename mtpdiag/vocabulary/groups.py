"""Coordinates and process-group kinds as a person reads them, and as megatron-core describes its groups."""

from __future__ import annotations

from mtpdiag.vocabulary.states import StrEnum


class Coordinate(StrEnum):
    """A rank's coordinate in the parallel layout (``RankView.coords``, a gate's keys)."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"


# The coordinates of a rank, in the order they are always shown.
COORDINATES = tuple(c.value for c in Coordinate)


class GroupKind(StrEnum):
    """A process-group kind of the layout (``layout.GROUP_KINDS``), as megatron-core's groups are made."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"
    EP = "ep"
    DP_CP = "dp_cp"
    TP_CP = "tp_cp"
    TP_DP = "tp_dp"
    TP_DP_CP = "tp_dp_cp"
    MP = "mp"
    WORLD = "world"
    ETP = "etp"
    EDP = "edp"
    TP_EP = "tp_ep"
    TP_EP_PP = "tp_ep_pp"


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
MEGATRON_GROUP_KINDS: dict[str, GroupKind] = {
    "default_pg": GroupKind.WORLD,
    "TENSOR_MODEL_PARALLEL_GROUP": GroupKind.TP,
    "CONTEXT_PARALLEL_GROUP": GroupKind.CP,
    "DATA_PARALLEL_GROUP": GroupKind.DP,
    "DATA_PARALLEL_GROUP_GLOO": GroupKind.DP,
    "PIPELINE_MODEL_PARALLEL_GROUP": GroupKind.PP,
    "DATA_PARALLEL_GROUP_WITH_CP": GroupKind.DP_CP,
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO": GroupKind.DP_CP,
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": GroupKind.TP_CP,
    "TENSOR_AND_DATA_PARALLEL_GROUP": GroupKind.TP_DP,
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": GroupKind.TP_DP_CP,
    "MODEL_PARALLEL_GROUP": GroupKind.MP,
    "EXPERT_MODEL_PARALLEL_GROUP": GroupKind.EP,
    "EXPERT_TENSOR_PARALLEL_GROUP": GroupKind.ETP,
    "EXPERT_DATA_PARALLEL_GROUP": GroupKind.EDP,
    "EXPERT_DATA_PARALLEL_GROUP_GLOO": GroupKind.EDP,
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": GroupKind.TP_EP,
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": GroupKind.TP_EP_PP,
}


def group_name(kind: str) -> str:
    """``dp_cp`` -> ``DP×CP``; a kind the table does not know as it is."""
    return GROUP_NAMES.get(kind, kind)
