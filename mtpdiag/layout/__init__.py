"""A job's parallel layout: megatron-core's rank arithmetic, and where the sizes come from.

* ``megatron``: ``ParallelLayout``, every rank's coordinates and every group, as megatron-core builds them;
* ``sources``: the layout from flags, a verl config and the targets' command lines, merged and checked;
* ``verl_config``: a verl config read with its hydra overrides (omegaconf: imported only when one is read);
* ``cmdline``: the sizes a command line names (Megatron-LM flags, hydra overrides, short flags);
* ``overrides``: hydra's override grammar, the one both of the last two read.
"""

from mtpdiag.layout.megatron import DEFAULT_ORDER, GROUP_KINDS, INFERENCE_ORDER, LayoutError, ParallelLayout

__all__ = ["DEFAULT_ORDER", "GROUP_KINDS", "INFERENCE_ORDER", "LayoutError", "ParallelLayout"]
