"""Call sites whose process group we know from the code, not from guessing.

When a collective is entered by only some ranks, the layout alone cannot always say which group it
ran on (a DP×CP group with dp=1 has the same members as the CP group). Megatron, verl and our
reproducer use fixed groups at well-known call sites; this table names them.

A row matches a site by its function's short name (``reduce_loss_in_tracker`` matches
``MTPLossLoggingHelper.reduce_loss_in_tracker``; a dotted name matches the qualified tail) and/or by
the end of its file path; rows are tried in order, so the specific rows come before the catch-all
file rows. ``kinds`` lists group kinds of ``mtpdiag.layout.GROUP_KINDS``, most likely first.
Pipeline point-to-point rows carry the direction of the peer (``next``/``prev`` pipeline stage) so
a peer can be named when torch's frame lacks one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from mtpdiag.model import Site

# The MTP loss collection of verl PR #5895 (megatron's MTPLossLoggingHelper and verl's caller).
MTP_FUNCTIONS = frozenset({"reduce_loss_in_tracker", "track_mtp_metrics", "get_megatron_mtp_loss"})


@dataclass(frozen=True)
class KnownSite:
    """One row of the table. ``None`` in ``function``/``file_suffix`` matches anything."""

    function: str | None
    file_suffix: str | None
    kinds: tuple[str, ...]
    why: str
    peer: str | None = None  # "next" | "prev": the pipeline neighbour a p2p at this site talks to
    p2p: bool = False  # pipeline point-to-point code: matched by peers, not by group membership
    waits: bool = False  # waits on Work handles itself, so a bare Work.wait shows this frame innermost

    def matches(self, site: Site) -> bool:
        if self.function is not None and not _function_matches(site.function, self.function):
            return False
        if self.file_suffix is not None:
            path = "/" + site.file.replace("\\", "/").lstrip("/")
            if not path.endswith("/" + self.file_suffix.lstrip("/")):
                return False
        return True


def _function_matches(function: str, wanted: str) -> bool:
    """``wanted`` is a short name or a dotted tail (``_AllToAll.forward``) of the qualified name."""
    return function == wanted or function.endswith("." + wanted)


_PP_P2P = "pipeline_parallel/p2p_communication.py"
_TP_MAPPINGS = "tensor_parallel/mappings.py"

KNOWN_SITES: tuple[KnownSite, ...] = (
    # --- MTP / auxiliary-loss trackers (the bug class of verl #5895)
    KnownSite("reduce_loss_in_tracker", None, ("dp_cp",),
              "MTPLossLoggingHelper averages over get_data_parallel_group(with_context_parallel=True)"),
    KnownSite("track_mtp_metrics", None, ("dp_cp",), "calls reduce_loss_in_tracker"),
    KnownSite("get_megatron_mtp_loss", None, ("dp_cp",), "verl's MTP metric: calls reduce_loss_in_tracker"),
    KnownSite("reduce_aux_losses_tracker_across_ranks", None, ("pp", "dp_cp", "tp_cp"),
              "MoE aux-loss tracker: pp reduce, then the tracker's avg group"),
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
)


@lru_cache(maxsize=4096)
def lookup(site: Site | None) -> KnownSite | None:
    """The first table row that matches ``site``, or None (cached: thousands of ranks share a site)."""
    if site is None:
        return None
    for row in KNOWN_SITES:
        if row.matches(site):
            return row
    return None


def is_mtp_site(site: Site | None) -> bool:
    return site is not None and site.function.rsplit(".", 1)[-1] in MTP_FUNCTIONS
