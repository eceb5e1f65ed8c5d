"""The rows of the known-site table (``known_sites`` explains the table and looks sites up in it)."""

from __future__ import annotations

from mtpdiag.analysis.known_site_types import MEGATRON_RELEASES, Collective, KnownSite, tracker_row

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
_EMPTY_TRACKER = (
    "returns before its first collective when this rank's tracker is empty, and the tracker "
    "is filled only by the layers a rank holds, so a pipeline stage without them skips the "
    "pipeline all_reduce the other stages wait in (Megatron-LM #4745)"
)
_LAZY_TRACKER = (
    "reduces only the names in this rank's own tracker, which a layer creates lazily, so a "
    "pipeline stage without MoE layers skips the pipeline all_reduce (Megatron-LM #1444, "
    "#2418; NeMo-RL #3419), and a size that differs between stages hangs it too (#3400/#3401)"
)

# The MTP / DeepSeek-indexer / MoE aux-loss metric trackers of megatron-core, and verl's callers.
TRACKER_ROWS: tuple[KnownSite, ...] = (
    # --- MTP loss (the bug class of verl PR #5895)
    tracker_row(
        "MTPLossLoggingHelper.reduce_loss_in_tracker",
        _MTP,
        "mtp",
        ("0.14", "0.15", "0.16", "0.17", "0.18"),
        "MTPLossLoggingHelper averages the MTP losses over the tracker's avg_group, "
        "get_data_parallel_group(with_context_parallel=True)",
        (_MTP_AVG,),
    ),
    tracker_row(
        "MTPLossLoggingHelper.reduce_loss_in_tracker",
        _MTP,
        "mtp",
        ("0.13",),
        "MTPLossLoggingHelper averages the MTP losses over the tracker's avg_group, which megatron-core "
        "0.13's MTP layer sets to get_tensor_and_context_parallel_group()",
        (_MTP_AVG_013,),
    ),
    tracker_row(
        "MTPLossLoggingHelper.reduce_metrics_in_tracker",
        _MTP,
        "mtp",
        ("0.19", "main"),
        "MTPLossLoggingHelper (renamed by Megatron-LM #3458) averages the MTP losses, then sums the "
        "correct and total prediction counts, over the tracker's avg_group (DP×CP)",
        (
            _MTP_AVG,
            Collective("all_reduce", "avg_group", ("dp_cp",), "SUM", "L"),
            Collective("all_reduce", "avg_group", ("dp_cp",), "SUM", "L"),
        ),
        source="main: NVIDIA/Megatron-LM multi_token_prediction.py at 00611e6e",
    ),
    tracker_row(
        "MTPLossLoggingHelper.reduce_metrics_in_tracker",
        _MTP,
        "mtp",
        ("dev",),
        "MTPLossLoggingHelper on dev averages the MTP losses, then sums the correct and total counts "
        "packed into one tensor of 2L, over the tracker's avg_group (DP×CP)",
        (
            Collective(
                "all_reduce", "avg_group", ("dp_cp",), "AVG", "L", when="losses saved by save_metrics_to_tracker"
            ),
            Collective("all_reduce", "acceptance_avg_group", ("dp_cp",), "SUM", "2L"),
        ),
        source="dev: NVIDIA/Megatron-LM multi_token_prediction.py with _save_acceptance_counts (Megatron-LM #4226)",
    ),
    tracker_row(
        "MTPLossLoggingHelper.reduce_loss_in_tracker",
        _MTP,
        "mtp",
        ("dev",),
        "MTPLossLoggingHelper on dev reduces the MTP loss sums over the tracker's avg_group (DP×CP): "
        "loss sums and token counts packed into one SUM of 2L with per-token loss, else an AVG of L",
        (
            Collective("all_reduce", "avg_group", ("dp_cp",), "SUM", "2L", when="per-token loss"),
            Collective("all_reduce", "avg_group", ("dp_cp",), "AVG", "L", when="microbatch-normalised loss"),
        ),
        source="dev: NVIDIA/Megatron-LM multi_token_prediction.py with _save_acceptance_counts",
    ),
    tracker_row(
        "MTPLossLoggingHelper.track_mtp_metrics",
        _MTP,
        "mtp",
        MEGATRON_RELEASES + ("main", "dev"),
        "calls MTPLossLoggingHelper's reduce (reduce_loss_in_tracker, reduce_metrics_in_tracker from 0.19)",
        calls=("MTPLossLoggingHelper.reduce_loss_in_tracker", "MTPLossLoggingHelper.reduce_metrics_in_tracker"),
        role="caller",
        kinds=("dp_cp", "tp_cp"),
    ),
    tracker_row(
        "get_megatron_mtp_loss",
        _VERL_UTILS,
        "mtp",
        _VERL_MTP,
        "verl's MTP metric: MTPLossLoggingHelper.track_mtp_metrics on a tracker whose avg_group verl's "
        "MTP patch sets to the DP×CP group",
        calls=("MTPLossLoggingHelper.track_mtp_metrics",),
        role="caller",
        package="verl",
        kinds=("dp_cp",),
    ),
    tracker_row(
        "MegatronEngine.forward_backward_batch",
        _VERL_ENGINE,
        "mtp",
        ("0.7.1", "0.8.0"),
        "verl's Megatron engine: sums the batch's token count over the DP group, and collects the MTP "
        "loss through get_megatron_mtp_loss (0.7.1 on the src rank only: verl PR #5895)",
        (_VERL_TOKENS,),
        calls=("get_megatron_mtp_loss",),
        role="engine",
        package="verl",
    ),
    tracker_row(
        "MegatronEngine.forward_backward_batch",
        _VERL_ENGINE,
        "mtp",
        ("0.9.0", "0.9.1"),
        "verl's Megatron engine: sums the batch's and the routed token counts over the DP group, and "
        "collects the MTP loss through get_megatron_mtp_loss on the last pipeline stage",
        (
            _VERL_TOKENS,
            Collective("all_reduce", "self.get_data_parallel_group()", ("dp",), "SUM", "1", when="per-token loss"),
        ),
        calls=("get_megatron_mtp_loss",),
        role="engine",
        package="verl",
    ),
    # --- DeepSeek sparse-attention indexer loss: the pipeline group first, then DP without CP
    tracker_row(
        "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker",
        _DSA,
        "dsa-indexer",
        ("0.16", "0.17", "0.18"),
        "DSAIndexerLossLoggingHelper sums the indexer losses over the pipeline group, then averages over DP without CP",
        (
            Collective("all_reduce", _PP, ("pp",), "SUM", "num_layers"),
            Collective("all_reduce", _DP_NO_CP, ("dp",), "AVG", "num_layers"),
        ),
        skip=_EMPTY_TRACKER,
    ),
    tracker_row(
        "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker",
        _DSA,
        "dsa-indexer",
        ("0.19", "main"),
        "DSAIndexerLossLoggingHelper sums the indexer losses over the pipeline group, reduces them over "
        "CP when context parallel, then averages over DP without CP",
        (
            Collective("all_reduce", _PP, ("pp",), "SUM", "num_layers"),
            Collective("all_reduce", "reduce_group", ("cp",), "SUM", "num_layers", when="cp > 1 with per-token loss"),
            Collective("all_reduce", "avg_group", ("cp",), "AVG", "num_layers", when="cp > 1 without per-token loss"),
            Collective("all_reduce", _DP_NO_CP, ("dp",), "AVG", "num_layers"),
        ),
        skip=_EMPTY_TRACKER,
        source="main: early return as of Megatron-LM #4745 (fixed on dev by #4518)",
    ),
    tracker_row(
        "DSAIndexerLossLoggingHelper.reduce_loss_in_tracker",
        _DSA,
        "dsa-indexer",
        ("dev",),
        "DSAIndexerLossLoggingHelper on dev agrees a tracker size over the pipeline group and reduces "
        "on every stage, empty or not",
        (Collective("all_reduce", "pipeline group", ("pp",), "SUM", "num_layers"),),
        source="dev: Megatron-LM #4518 (the fix of #4745) and #6980",
    ),
    tracker_row(
        "DSAIndexerLossLoggingHelper.track_indexer_metrics",
        _DSA,
        "dsa-indexer",
        ("0.16", "0.17", "0.18", "0.19", "main", "dev"),
        "calls DSAIndexerLossLoggingHelper.reduce_loss_in_tracker (pipeline group, then DP)",
        calls=("DSAIndexerLossLoggingHelper.reduce_loss_in_tracker",),
        role="caller",
        kinds=("pp", "dp"),
    ),
    # --- MoE auxiliary losses: the pipeline group, then the tracker's groups, then DP
    tracker_row(
        "MoEMetricsTracker._sync_metrics",
        _MOE_LOGGING,
        "moe-aux-loss",
        ("0.19",),
        "MoEMetricsTracker sums each metric over the pipeline group, then its reduce_group, averages "
        "over its avg_group and over DP (the pg_collection's DP×CP×GTP-remat group when one is passed)",
        (
            _MOE_PP,
            _MOE_REDUCE,
            _MOE_AVG,
            Collective("all_reduce", "dp_group", ("dp", "dp_cp"), "AVG", when="needs_dp_avg"),
        ),
        skip=_LAZY_TRACKER,
    ),
    tracker_row(
        "MoEMetricsTracker._sync_metrics",
        _MOE_LOGGING,
        "moe-aux-loss",
        ("0.18",),
        "MoEMetricsTracker sums each metric over the pipeline group, then its reduce_group, averages "
        "over its avg_group and over DP without CP",
        (_MOE_PP, _MOE_REDUCE, _MOE_AVG, Collective("all_reduce", "dp_group", ("dp",), "AVG", when="needs_dp_avg")),
        skip=_LAZY_TRACKER,
    ),
    tracker_row(
        "reduce_aux_losses_tracker_across_ranks",
        _MOE_UTILS,
        "moe-aux-loss",
        ("0.16", "0.17"),
        "MoE aux-loss tracker: sums over the pipeline group, then the tracker's reduce_group, averages "
        "over DP without CP and the avg_group",
        (
            _MOE_PP,
            _MOE_REDUCE,
            Collective("all_reduce", "dp_group", ("dp",), "AVG", when="reduce_group set without DP"),
            _MOE_AVG,
        ),
        skip=_LAZY_TRACKER,
    ),
    tracker_row(
        "reduce_aux_losses_tracker_across_ranks",
        _MOE_UTILS,
        "moe-aux-loss",
        ("0.14", "0.15"),
        "MoE aux-loss tracker: sums over the pipeline group, then the tracker's reduce_group, averages "
        "over its avg_group and over DP×CP",
        (
            _MOE_PP_GETTER,
            _MOE_REDUCE,
            _MOE_AVG,
            Collective("all_reduce", "get_data_parallel_group(with_context_parallel=True)", ("dp_cp",), "AVG"),
        ),
        skip=_LAZY_TRACKER,
    ),
    tracker_row(
        "reduce_aux_losses_tracker_across_ranks",
        _MOE_UTILS,
        "moe-aux-loss",
        ("0.13",),
        "MoE aux-loss tracker: sums over the pipeline group, then the tracker's reduce_group, averages "
        "over its avg_group",
        (_MOE_PP_GETTER, _MOE_REDUCE, _MOE_AVG),
        skip=_LAZY_TRACKER,
    ),
    # From 0.18 the function only delegates: a site in it is one of the forms above.
    tracker_row(
        "reduce_aux_losses_tracker_across_ranks",
        _MOE_UTILS,
        "moe-aux-loss",
        ("0.18", "0.19"),
        "calls MoEMetricsTracker._sync_metrics (pipeline group, then the tracker's groups, then DP)",
        calls=("MoEMetricsTracker._sync_metrics",),
        role="caller",
        kinds=("pp", "tp_cp", "tp_dp_cp", "dp"),
    ),
    tracker_row(
        "MoEMetricsTracker.report",
        _MOE_LOGGING,
        "moe-aux-loss",
        ("0.18", "0.19"),
        "MoEMetricsTracker.report (what track_moe_metrics wraps from 0.18): calls _sync_metrics",
        calls=("MoEMetricsTracker._sync_metrics",),
        role="caller",
        kinds=("pp", "tp_cp", "tp_dp_cp", "dp"),
    ),
    tracker_row(
        "track_moe_metrics",
        _MOE_UTILS,
        "moe-aux-loss",
        ("0.13", "0.14", "0.15", "0.16", "0.17"),
        "megatron's MoE metrics: reduce_aux_losses_tracker_across_ranks (pipeline group, then DP)",
        calls=("reduce_aux_losses_tracker_across_ranks",),
        role="caller",
        kinds=("pp", "tp_cp", "tp_dp_cp", "dp"),
    ),
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
    KnownSite(
        None,
        _TP_MAPPINGS,
        ("tp", "tp_ep", "etp", "ep", "tp_cp"),
        "reduce/gather/scatter mappings: the tensor-parallel group unless MoE passes its own",
    ),
    KnownSite("broadcast_data", "tensor_parallel/data.py", ("tp",), "broadcasts the batch from tp rank 0"),
    # the same function where Megatron-LM kept it before megatron-core (2022), and Megatron-DeepSpeed still does
    KnownSite("broadcast_data", "mpu/data.py", ("tp",), "broadcasts the batch from tp rank 0"),
    KnownSite(None, "tensor_parallel/layers.py", ("tp",), "column/row parallel linear communication"),
    KnownSite(None, "tensor_parallel/cross_entropy.py", ("tp",), "vocab-parallel cross entropy"),
    KnownSite("_allreduce_layernorm_grads", None, ("tp",), "sequence-parallel layernorm grads"),
    KnownSite("_allreduce_non_tensor_model_parallel_grads", None, ("tp",), "non-TP-sharded grads"),
    # --- context parallel
    KnownSite("ring_attention", None, ("cp",), "context-parallel attention exchanges K/V shards"),
    KnownSite(
        None,
        "attention/dot_product_attention/context_parallel.py",
        ("cp",),
        "transformer_engine context-parallel attention",
    ),
    KnownSite("attn_forward_func_with_cp", None, ("cp",), "transformer_engine context-parallel attention"),
    # --- data parallel gradient/parameter sync
    KnownSite("finalize_model_grads", None, ("dp_cp", "dp"), "token count all_reduce over DP×CP"),
    KnownSite("_allreduce_conditional_embedding_grads", None, ("pp",), "shared embeddings across stages"),
    KnownSite(
        None,
        "distributed/param_and_grad_buffer.py",
        ("dp_cp", "edp", "dp"),
        "DDP bucket grad reduce / param all-gather",
    ),
    KnownSite(None, "distributed/distributed_data_parallel.py", ("dp_cp", "edp", "dp"), "DDP grad sync"),
    KnownSite("average_losses_across_data_parallel_group", None, ("dp", "dp_cp"), "loss averaging"),
    # --- process-group creation: every rank of the world calls new_group
    KnownSite(
        "initialize_model_parallel",
        "megatron/core/parallel_state.py",
        ("world",),
        "megatron's parallel_state: new_group on every rank of the world",
        collectives=(Collective("new_group", "the world", ("world",)),),
        role="reduce",
    ),
)


# ------------------------------------------------------------------------------------------ site look-up
