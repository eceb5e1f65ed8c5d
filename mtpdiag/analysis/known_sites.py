"""Call sites whose process group we know from the code, not from guessing.

When a collective is entered by only some ranks, the layout alone cannot always say which group it
ran on (a DP×CP group with dp=1 has the same members as the CP group). Megatron, verl and our
reproducer use fixed groups at well-known call sites; this table names them.

A row names its function by qualified name (``MTPLossLoggingHelper.reduce_loss_in_tracker``, what
py-spy 0.4 reports on Python >= 3.11 as ``co_qualname``) and, for the metric helpers, by the end of
its file path. A site matches a row when its file ends with the row's path and its function is the
qualified name, a qualified name ending in it (``Outer.<locals>.f``), or -- where only the short name
is known (py-spy on Python < 3.11, Flight Recorder frames) -- the bare short name in that file. A
short name alone never matches a method of another class: ``DSAIndexerLossLoggingHelper.
reduce_loss_in_tracker`` is the DeepSeek indexer's loss, on the pipeline group, and not the MTP reduce.

Rows are tried in order, so the specific rows come before the catch-all file rows, and for a function
whose group changed across releases the most common form that issues collectives itself comes first
(``lookup``; ``kinds_of`` unites every form). ``kinds`` lists group kinds of
``mtpdiag.layout.GROUP_KINDS``, most likely first. Pipeline point-to-point rows carry the direction of
the peer (``next``/``prev`` pipeline stage) so a peer can be named when torch's frame lacks one.

The metric-tracker rows (MTP, DeepSeek indexer, MoE aux loss) also say which collectives the function
issues, in order, on which group, over how many elements, and in which releases it has that form;
``tests/unit/test_known_sites_megatron.py`` checks every such claim against the released megatron-core
wheels. ``mtpdiag check`` and ``mtpdiag lint`` read the same rows (``collection_rows``, ``lint_rows``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import msgspec

from mtpdiag.model import Site

Signature = Literal["mtp", "dsa-indexer", "moe-aux-loss"]
Role = Literal["reduce", "caller", "engine"]

# megatron-core minor releases the rows speak about; "main"/"dev" are the Megatron-LM branches.
MEGATRON_RELEASES = ("0.13", "0.14", "0.15", "0.16", "0.17", "0.18", "0.19")


class Collective(msgspec.Struct, frozen=True):
    """One collective a function issues.

    ``group`` says how the source names the group: a ``parallel_state`` getter as it is called
    (``get_pipeline_model_parallel_group()``) or a slot of the metric tracker (``avg_group``,
    ``reduce_group``), which the code that saves into the tracker fills (its ``avg_group=`` argument).
    """

    op: str
    group: str
    kinds: tuple[str, ...]
    reduce: str = "SUM"  # torch.distributed.ReduceOp name
    elements: str | None = None  # "L" = the number of MTP layers; None where it depends on the caller
    when: str | None = None  # the condition it runs under, when not always


class KnownSite(msgspec.Struct, frozen=True):
    """One row of the table. ``None`` in ``function``/``file_suffix`` matches anything."""

    function: str | None
    file_suffix: str | None
    kinds: tuple[str, ...]
    why: str
    peer: str | None = None  # "next" | "prev": the pipeline neighbour a p2p at this site talks to
    p2p: bool = False  # pipeline point-to-point code: matched by peers, not by group membership
    waits: bool = False  # waits on Work handles itself, so a bare Work.wait shows this frame innermost
    signature: Signature | None = None  # the metric-tracker family the row belongs to
    role: Role | None = None  # reduce: issues the collectives; caller: reaches them through `calls`
    collectives: tuple[Collective, ...] = ()  # in the order they run
    calls: tuple[str, ...] = ()  # qualified names of known rows this function reaches
    package: str = "megatron-core"
    versions: tuple[str, ...] = ()  # releases (minor, or "main"/"dev") with this form
    skip: str | None = None  # how part of the group can skip the collectives (an early return, ...)
    source: str | None = None  # where a claim not checked against a released wheel comes from

    @property
    def short_name(self) -> str | None:
        return self.function.rsplit(".", 1)[-1] if self.function else None

    def matches(self, site: Site) -> bool:
        # A row that names its function also takes a path py-spy shortened (its text dump prints
        # ``core/transformer/multi_token_prediction.py``); a file-only row needs its whole suffix.
        if self.file_suffix is not None and \
                not path_ends_with(site.file, self.file_suffix, shortened=self.function is not None):
            return False
        if self.function is not None and not _function_matches(site.function, self.function,
                                                               self.file_suffix is not None):
            return False
        return True


def path_ends_with(path: str, suffix: str, shortened: bool = False) -> bool:
    """Does ``path`` end with the path components of ``suffix``? With ``shortened``, a path that is
    itself a shorter tail of ``suffix`` counts too."""
    have = [p for p in path.replace("\\", "/").split("/") if p]
    want = [p for p in suffix.split("/") if p]
    if not have:
        return False
    if have[-len(want):] == want:
        return True
    return shortened and len(have) < len(want) and want[-len(have):] == have


def _function_matches(function: str, wanted: str, in_known_file: bool) -> bool:
    """``wanted`` is the qualified name; ``function`` what the capture reports.

    A qualified name matches itself or a longer qualified name ending in it. A bare short name (no
    dot: the capture could not qualify it) matches only when the file already pinned the row down.
    """
    if function == wanted or function.endswith("." + wanted):
        return True
    short = wanted.rsplit(".", 1)[-1]
    return in_known_file and "." not in function and function == short


def _kinds(collectives: tuple[Collective, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for c in collectives for k in c.kinds))


def _tracker(function: str, file_suffix: str, signature: Signature, versions: tuple[str, ...], why: str,
             collectives: tuple[Collective, ...] = (), calls: tuple[str, ...] = (), role: Role = "reduce",
             skip: str | None = None, source: str | None = None, package: str = "megatron-core",
             kinds: tuple[str, ...] | None = None) -> KnownSite:
    """A metric-tracker row: its kinds are those of its collectives, in order."""
    return KnownSite(function, file_suffix, kinds if kinds is not None else _kinds(collectives), why,
                     signature=signature, role=role, collectives=collectives, calls=calls, package=package,
                     versions=versions, skip=skip, source=source)


_MTP = "megatron/core/transformer/multi_token_prediction.py"
_DSA = "megatron/core/transformer/experimental_attention_variant/dsa.py"
_MOE_UTILS = "megatron/core/transformer/moe/moe_utils.py"
_MOE_LOGGING = "megatron/core/transformer/moe/moe_logging.py"
_VERL_UTILS = "verl/utils/megatron_utils.py"
_VERL_ENGINE = "verl/workers/engine/megatron/transformer_impl.py"
_PP_P2P = "pipeline_parallel/p2p_communication.py"
_TP_MAPPINGS = "tensor_parallel/mappings.py"

_PP = "get_pipeline_model_parallel_group()"
_DP_NO_CP = "get_data_parallel_group(with_context_parallel=False)"
_MTP_AVG = Collective("all_reduce", "avg_group", ("dp_cp",), "AVG", "L")
_MTP_AVG_013 = Collective("all_reduce", "avg_group", ("tp_cp",), "AVG", "L")
_MOE_PP = Collective("all_reduce", "pp_group", ("pp",), "SUM", "num_layers + mtp_num_layers")
_MOE_PP_GETTER = Collective("all_reduce", _PP, ("pp",), "SUM", "num_layers + mtp_num_layers")
_MOE_REDUCE = Collective("all_reduce", "reduce_group", ("tp_cp", "tp_dp_cp"), "SUM", when="reduce_group set")
_MOE_AVG = Collective("all_reduce", "avg_group", ("tp_dp_cp",), "AVG", when="avg_group set")
_VERL_MTP = ("0.7.1", "0.8.0", "0.9.0", "0.9.1")  # verl releases with get_megatron_mtp_loss
_VERL_TOKENS = Collective("all_reduce", "self.get_data_parallel_group()", ("dp",), "SUM", "1")
_EMPTY_TRACKER = ("returns before its first collective when this rank's tracker is empty, and the tracker "
                  "is filled only by the layers a rank holds, so a pipeline stage without them skips the "
                  "pipeline all_reduce the other stages wait in (Megatron-LM #4745)")
_LAZY_TRACKER = ("reduces only the names in this rank's own tracker, which a layer creates lazily, so a "
                 "pipeline stage without MoE layers skips the pipeline all_reduce (Megatron-LM #1444, "
                 "#2418; NeMo-RL #3419), and a size that differs between stages hangs it too (#3400/#3401)")

# The MTP / DeepSeek-indexer / MoE aux-loss metric trackers of megatron-core, and verl's callers.
TRACKER_ROWS: tuple[KnownSite, ...] = (
    # --- MTP loss (the bug class of verl PR #5895)
    _tracker("MTPLossLoggingHelper.reduce_loss_in_tracker", _MTP, "mtp", ("0.14", "0.15", "0.16", "0.17", "0.18"),
             "MTPLossLoggingHelper averages the MTP losses over the tracker's avg_group, "
             "get_data_parallel_group(with_context_parallel=True)", (_MTP_AVG,)),
    _tracker("MTPLossLoggingHelper.reduce_loss_in_tracker", _MTP, "mtp", ("0.13",),
             "MTPLossLoggingHelper averages the MTP losses over the tracker's avg_group, which megatron-core "
             "0.13's MTP layer sets to get_tensor_and_context_parallel_group()", (_MTP_AVG_013,)),
    _tracker("MTPLossLoggingHelper.reduce_metrics_in_tracker", _MTP, "mtp", ("0.19", "main"),
             "MTPLossLoggingHelper (renamed by Megatron-LM #3458) averages the MTP losses, then sums the "
             "correct and total prediction counts, over the tracker's avg_group (DP×CP)",
             (_MTP_AVG, Collective("all_reduce", "avg_group", ("dp_cp",), "SUM", "L"),
              Collective("all_reduce", "avg_group", ("dp_cp",), "SUM", "L")),
             source="main: NVIDIA/Megatron-LM multi_token_prediction.py at 00611e6e"),
    _tracker("MTPLossLoggingHelper.reduce_metrics_in_tracker", _MTP, "mtp", ("dev",),
             "MTPLossLoggingHelper on dev averages the MTP losses, then sums the correct and total counts "
             "packed into one tensor of 2L, over the tracker's avg_group (DP×CP)",
             (Collective("all_reduce", "avg_group", ("dp_cp",), "AVG", "L", when="losses saved by "
                         "save_metrics_to_tracker"),
              Collective("all_reduce", "acceptance_avg_group", ("dp_cp",), "SUM", "2L")),
             source="dev: NVIDIA/Megatron-LM multi_token_prediction.py with _save_acceptance_counts "
                    "(Megatron-LM #4226)"),
    _tracker("MTPLossLoggingHelper.reduce_loss_in_tracker", _MTP, "mtp", ("dev",),
             "MTPLossLoggingHelper on dev reduces the MTP loss sums over the tracker's avg_group (DP×CP): "
             "loss sums and token counts packed into one SUM of 2L with per-token loss, else an AVG of L",
             (Collective("all_reduce", "avg_group", ("dp_cp",), "SUM", "2L", when="per-token loss"),
              Collective("all_reduce", "avg_group", ("dp_cp",), "AVG", "L", when="microbatch-normalised loss")),
             source="dev: NVIDIA/Megatron-LM multi_token_prediction.py with _save_acceptance_counts"),
    _tracker("MTPLossLoggingHelper.track_mtp_metrics", _MTP, "mtp", MEGATRON_RELEASES + ("main", "dev"),
             "calls MTPLossLoggingHelper's reduce (reduce_loss_in_tracker, reduce_metrics_in_tracker from 0.19)",
             calls=("MTPLossLoggingHelper.reduce_loss_in_tracker", "MTPLossLoggingHelper.reduce_metrics_in_tracker"),
             role="caller", kinds=("dp_cp", "tp_cp")),
    _tracker("get_megatron_mtp_loss", _VERL_UTILS, "mtp", _VERL_MTP,
             "verl's MTP metric: MTPLossLoggingHelper.track_mtp_metrics on a tracker whose avg_group verl's "
             "MTP patch sets to the DP×CP group",
             calls=("MTPLossLoggingHelper.track_mtp_metrics",), role="caller", package="verl", kinds=("dp_cp",)),
    _tracker("MegatronEngine.forward_backward_batch", _VERL_ENGINE, "mtp", ("0.7.1", "0.8.0"),
             "verl's Megatron engine: sums the batch's token count over the DP group, and collects the MTP "
             "loss through get_megatron_mtp_loss (0.7.1 on the src rank only: verl PR #5895)",
             (_VERL_TOKENS,), calls=("get_megatron_mtp_loss",), role="engine", package="verl"),
    _tracker("MegatronEngine.forward_backward_batch", _VERL_ENGINE, "mtp", ("0.9.0", "0.9.1"),
             "verl's Megatron engine: sums the batch's and the routed token counts over the DP group, and "
             "collects the MTP loss through get_megatron_mtp_loss on the last pipeline stage",
             (_VERL_TOKENS, Collective("all_reduce", "self.get_data_parallel_group()", ("dp",), "SUM", "1",
                                       when="per-token loss")),
             calls=("get_megatron_mtp_loss",), role="engine", package="verl"),
    # --- DeepSeek sparse-attention indexer loss: the pipeline group first, then DP without CP
    _tracker("DSAIndexerLossLoggingHelper.reduce_loss_in_tracker", _DSA, "dsa-indexer",
             ("0.16", "0.17", "0.18"),
             "DSAIndexerLossLoggingHelper sums the indexer losses over the pipeline group, then averages "
             "over DP without CP",
             (Collective("all_reduce", _PP, ("pp",), "SUM", "num_layers"),
              Collective("all_reduce", _DP_NO_CP, ("dp",), "AVG", "num_layers")),
             skip=_EMPTY_TRACKER),
    _tracker("DSAIndexerLossLoggingHelper.reduce_loss_in_tracker", _DSA, "dsa-indexer", ("0.19", "main"),
             "DSAIndexerLossLoggingHelper sums the indexer losses over the pipeline group, reduces them over "
             "CP when context parallel, then averages over DP without CP",
             (Collective("all_reduce", _PP, ("pp",), "SUM", "num_layers"),
              Collective("all_reduce", "reduce_group", ("cp",), "SUM", "num_layers",
                         when="cp > 1 with per-token loss"),
              Collective("all_reduce", "avg_group", ("cp",), "AVG", "num_layers",
                         when="cp > 1 without per-token loss"),
              Collective("all_reduce", _DP_NO_CP, ("dp",), "AVG", "num_layers")),
             skip=_EMPTY_TRACKER, source="main: early return as of Megatron-LM #4745 (fixed on dev by #4518)"),
    _tracker("DSAIndexerLossLoggingHelper.reduce_loss_in_tracker", _DSA, "dsa-indexer", ("dev",),
             "DSAIndexerLossLoggingHelper on dev agrees a tracker size over the pipeline group and reduces "
             "on every stage, empty or not",
             (Collective("all_reduce", "pipeline group", ("pp",), "SUM", "num_layers"),),
             source="dev: Megatron-LM #4518 (the fix of #4745) and #6980"),
    _tracker("DSAIndexerLossLoggingHelper.track_indexer_metrics", _DSA, "dsa-indexer",
             ("0.16", "0.17", "0.18", "0.19", "main", "dev"),
             "calls DSAIndexerLossLoggingHelper.reduce_loss_in_tracker (pipeline group, then DP)",
             calls=("DSAIndexerLossLoggingHelper.reduce_loss_in_tracker",), role="caller", kinds=("pp", "dp")),
    # --- MoE auxiliary losses: the pipeline group, then the tracker's groups, then DP
    _tracker("MoEMetricsTracker._sync_metrics", _MOE_LOGGING, "moe-aux-loss", ("0.19",),
             "MoEMetricsTracker sums each metric over the pipeline group, then its reduce_group, averages "
             "over its avg_group and over DP (the pg_collection's DP×CP×GTP-remat group when one is passed)",
             (_MOE_PP, _MOE_REDUCE, _MOE_AVG,
              Collective("all_reduce", "dp_group", ("dp", "dp_cp"), "AVG", when="needs_dp_avg")),
             skip=_LAZY_TRACKER),
    _tracker("MoEMetricsTracker._sync_metrics", _MOE_LOGGING, "moe-aux-loss", ("0.18",),
             "MoEMetricsTracker sums each metric over the pipeline group, then its reduce_group, averages "
             "over its avg_group and over DP without CP",
             (_MOE_PP, _MOE_REDUCE, _MOE_AVG, Collective("all_reduce", "dp_group", ("dp",), "AVG", when="needs_dp_avg")),
             skip=_LAZY_TRACKER),
    _tracker("reduce_aux_losses_tracker_across_ranks", _MOE_UTILS, "moe-aux-loss", ("0.16", "0.17"),
             "MoE aux-loss tracker: sums over the pipeline group, then the tracker's reduce_group, averages "
             "over DP without CP and the avg_group",
             (_MOE_PP, _MOE_REDUCE, Collective("all_reduce", "dp_group", ("dp",), "AVG",
                                               when="reduce_group set without DP"), _MOE_AVG),
             skip=_LAZY_TRACKER),
    _tracker("reduce_aux_losses_tracker_across_ranks", _MOE_UTILS, "moe-aux-loss", ("0.14", "0.15"),
             "MoE aux-loss tracker: sums over the pipeline group, then the tracker's reduce_group, averages "
             "over its avg_group and over DP×CP",
             (_MOE_PP_GETTER, _MOE_REDUCE, _MOE_AVG,
              Collective("all_reduce", "get_data_parallel_group(with_context_parallel=True)", ("dp_cp",), "AVG")),
             skip=_LAZY_TRACKER),
    _tracker("reduce_aux_losses_tracker_across_ranks", _MOE_UTILS, "moe-aux-loss", ("0.13",),
             "MoE aux-loss tracker: sums over the pipeline group, then the tracker's reduce_group, averages "
             "over its avg_group",
             (_MOE_PP_GETTER, _MOE_REDUCE, _MOE_AVG), skip=_LAZY_TRACKER),
    # From 0.18 the function only delegates: a site in it is one of the forms above.
    _tracker("reduce_aux_losses_tracker_across_ranks", _MOE_UTILS, "moe-aux-loss", ("0.18", "0.19"),
             "calls MoEMetricsTracker._sync_metrics (pipeline group, then the tracker's groups, then DP)",
             calls=("MoEMetricsTracker._sync_metrics",), role="caller", kinds=("pp", "tp_cp", "tp_dp_cp", "dp")),
    _tracker("MoEMetricsTracker.report", _MOE_LOGGING, "moe-aux-loss", ("0.18", "0.19"),
             "MoEMetricsTracker.report (what track_moe_metrics wraps from 0.18): calls _sync_metrics",
             calls=("MoEMetricsTracker._sync_metrics",), role="caller", kinds=("pp", "tp_cp", "tp_dp_cp", "dp")),
    _tracker("track_moe_metrics", _MOE_UTILS, "moe-aux-loss", ("0.13", "0.14", "0.15", "0.16", "0.17"),
             "megatron's MoE metrics: reduce_aux_losses_tracker_across_ranks (pipeline group, then DP)",
             calls=("reduce_aux_losses_tracker_across_ranks",), role="caller",
             kinds=("pp", "tp_cp", "tp_dp_cp", "dp")),
)

KNOWN_SITES: tuple[KnownSite, ...] = TRACKER_ROWS + (
    # --- pipeline point-to-point (megatron pipeline_parallel)
    KnownSite("_communicate", _PP_P2P, ("pp",), "waits on its isend/irecv requests", p2p=True, waits=True),
    KnownSite("_batched_p2p_ops", _PP_P2P, ("pp",), "batch_isend_irecv between stages", p2p=True, waits=True),
    KnownSite("_p2p_ops", _PP_P2P, ("pp",), "isend/irecv between stages", p2p=True, waits=True),
    KnownSite("_communicate_shapes", _PP_P2P, ("pp",), "exchanges tensor shapes", p2p=True, waits=True),
    KnownSite("send_forward", None, ("pp",), "activations to the next stage", peer="next", p2p=True),
    KnownSite("recv_forward", None, ("pp",), "activations from the previous stage", peer="prev", p2p=True),
    KnownSite("send_backward", None, ("pp",), "gradients to the previous stage", peer="prev", p2p=True),
    KnownSite("recv_backward", None, ("pp",), "gradients from the next stage", peer="next", p2p=True),
    KnownSite("send_forward_recv_backward", None, ("pp",), "1F1B steady state", peer="next", p2p=True),
    KnownSite("send_backward_recv_forward", None, ("pp",), "1F1B steady state", peer="prev", p2p=True),
    KnownSite(None, _PP_P2P, ("pp",), "megatron pipeline p2p", p2p=True),
    # --- expert parallel (before the tensor-parallel file rows: all_to_all lives in mappings.py)
    KnownSite("_AllToAll.forward", _TP_MAPPINGS, ("ep", "tp_ep", "tp"), "MoE token all-to-all"),
    KnownSite("_AllToAll.backward", _TP_MAPPINGS, ("ep", "tp_ep", "tp"), "MoE token all-to-all"),
    KnownSite(None, "moe/token_dispatcher.py", ("ep", "tp_ep", "etp"), "MoE token dispatch"),
    KnownSite(None, "moe/fused_a2a.py", ("ep",), "MoE fused all-to-all"),
    # --- tensor parallel
    KnownSite(None, _TP_MAPPINGS, ("tp", "tp_ep", "etp", "ep", "tp_cp"),
              "reduce/gather/scatter mappings: the tensor-parallel group unless MoE passes its own"),
    KnownSite("broadcast_data", "tensor_parallel/data.py", ("tp",), "broadcasts the batch from tp rank 0"),
    KnownSite(None, "tensor_parallel/layers.py", ("tp",), "column/row parallel linear communication"),
    KnownSite(None, "tensor_parallel/cross_entropy.py", ("tp",), "vocab-parallel cross entropy"),
    KnownSite("_allreduce_layernorm_grads", None, ("tp",), "sequence-parallel layernorm grads"),
    KnownSite("_allreduce_non_tensor_model_parallel_grads", None, ("tp",), "non-TP-sharded grads"),
    # --- context parallel
    KnownSite("ring_attention", None, ("cp",), "context-parallel attention exchanges K/V shards"),
    KnownSite(None, "attention/dot_product_attention/context_parallel.py", ("cp",),
              "transformer_engine context-parallel attention"),
    KnownSite("attn_forward_func_with_cp", None, ("cp",), "transformer_engine context-parallel attention"),
    # --- data parallel gradient/parameter sync
    KnownSite("finalize_model_grads", None, ("dp_cp", "dp"), "token count all_reduce over DP×CP"),
    KnownSite("_allreduce_conditional_embedding_grads", None, ("pp",), "shared embeddings across stages"),
    KnownSite(None, "distributed/param_and_grad_buffer.py", ("dp_cp", "edp", "dp"),
              "DDP bucket grad reduce / param all-gather"),
    KnownSite(None, "distributed/distributed_data_parallel.py", ("dp_cp", "edp", "dp"), "DDP grad sync"),
    KnownSite("average_losses_across_data_parallel_group", None, ("dp", "dp_cp"), "loss averaging"),
    # --- process-group creation: every rank of the world calls new_group
    KnownSite("initialize_model_parallel", "megatron/core/parallel_state.py", ("world",),
              "megatron's parallel_state: new_group on every rank of the world",
              collectives=(Collective("new_group", "the world", ("world",)),), role="reduce"),
)


# ------------------------------------------------------------------------------------------ site look-up

@lru_cache(maxsize=4096)
def lookup_all(site: Site | None) -> tuple[KnownSite, ...]:
    """Every row that matches ``site``, in table order (cached: thousands of ranks share a site)."""
    if site is None:
        return ()
    return tuple(row for row in KNOWN_SITES if row.matches(site))


def lookup(site: Site | None) -> KnownSite | None:
    """The first table row that matches ``site``, or None."""
    rows = lookup_all(site)
    return rows[0] if rows else None


def kinds_of(site: Site | None) -> tuple[str, ...]:
    """Group kinds of every form of the site's function across releases, most likely first
    (``MTPLossLoggingHelper.reduce_loss_in_tracker``: DP×CP, and TP×CP in megatron-core 0.13)."""
    return tuple(dict.fromkeys(k for row in lookup_all(site) for k in row.kinds))


def signature_of(site: Site | None) -> Signature | None:
    """The metric-tracker family (``mtp``, ``dsa-indexer``, ``moe-aux-loss``) a site's collective belongs
    to, or None. A verl engine's own collectives (its token-count all_reduce) belong to none."""
    row = lookup(site)
    if row is None or row.role not in ("reduce", "caller"):
        return None
    return row.signature


def is_mtp_site(site: Site | None) -> bool:
    """True for the MTP loss reduce and its callers (megatron's and verl's), never the DSA indexer."""
    return signature_of(site) == "mtp"


def skip_of(site: Site | None) -> str | None:
    """How part of the group can skip the site's collectives (an early return on an empty tracker, ...)."""
    row = lookup(site)
    return row.skip if row is not None else None


# --------------------------------------------------------------------------- source-level look-up

def rows_named(dotted: str) -> tuple[KnownSite, ...]:
    """Rows a call spelled ``dotted`` (import aliases resolved) reaches: the qualified name must be the
    whole call or its tail. ``x.MTPLossLoggingHelper.track_mtp_metrics`` reaches the MTP row;
    ``DSAIndexerLossLoggingHelper.reduce_loss_in_tracker`` only the indexer's; a bare
    ``reduce_loss_in_tracker`` none (a method is always called through its class or an instance)."""
    return tuple(row for row in _SOURCE_ROWS
                 if row.function is not None and (dotted == row.function or dotted.endswith("." + row.function)))


def rows_defined(qualname: str, filename: str | None = None) -> tuple[KnownSite, ...]:
    """Rows for the function defined as ``qualname`` (``Class.method``), in ``filename`` when the row
    names a file and the file is known."""
    return tuple(row for row in _SOURCE_ROWS if row.function == qualname and
                 (filename is None or row.file_suffix is None or path_ends_with(filename, row.file_suffix)))


def collection_rows(signature: Signature = "mtp") -> tuple[KnownSite, ...]:
    """Rows whose call collects a signature's metric: its reduce functions and their callers."""
    return tuple(row for row in TRACKER_ROWS if row.signature == signature and row.role in ("reduce", "caller"))


def engine_row() -> KnownSite:
    """verl's Megatron engine method that collects the MTP loss."""
    return next(row for row in TRACKER_ROWS if row.role == "engine")


def group_label(rows: tuple[KnownSite, ...]) -> str:
    """``dp_cp`` / ``pp and dp``: the group kinds of one function's forms, for a person."""
    return " and ".join(dict.fromkeys(k for row in rows for k in row.kinds))


# Rows that can be recognised in source code: they name a function and say what it runs.
_SOURCE_ROWS = tuple(row for row in KNOWN_SITES if row.role is not None)

# One source of truth for the names: the MTP collection's qualified and short names.
MTP_COLLECTIONS = tuple(dict.fromkeys(row.function for row in collection_rows("mtp") if row.function is not None))
MTP_FUNCTIONS = frozenset(name.rsplit(".", 1)[-1] for name in MTP_COLLECTIONS)  # compatibility
