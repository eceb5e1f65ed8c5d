"""The parallel sizes, in each spelling mtpdiag reads them: its own flags, megatron-core's argument names
(which verl's configs and hydra overrides use unchanged), and Megatron-LM's command-line flags."""

from __future__ import annotations

SIZE_KEYS = ("tp", "cp", "pp", "ep", "etp", "vpp")
# Keys a flags or hints dict may carry: the sizes, and the rank order (a string).
SOURCE_KEYS = (*SIZE_KEYS, "order")

# megatron-core's argument names (TransformerConfig / initialize_model_parallel).
CONFIG_NAMES = {
    "tp": "tensor_model_parallel_size",
    "cp": "context_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
}
# The last component of a verl/hydra override key -> the size.
HYDRA_KEYS = {name: key for key, name in CONFIG_NAMES.items()}
# Megatron-LM's argparse flags (``--num-layers-per-virtual-pipeline-stage`` is a layer count, not a size).
MEGATRON_FLAGS = {"--" + name.replace("_", "-"): key for key, name in CONFIG_NAMES.items()}
# Short flags (our reproducer and many scripts); read only when followed by an integer.
SHORT_FLAGS = {"--tp": "tp", "--cp": "cp", "--pp": "pp", "--ep": "ep"}
# How a command-line hint is shown: Megatron-LM's flag names, the spelling people grep logs for.
COMMAND_LINE_FLAGS = {**{key: flag for flag, key in MEGATRON_FLAGS.items()}, "order": "--order"}

# The trained model's section of a verl config: the PPO actor, or the SFT trainer's engine (``engine=megatron``).
# As hydra override prefixes they name the trained model on a command line; other ``*.megatron.*`` groups
# (ref, critic, reward model) count only where these say nothing, and a rollout's sizes never count.
CONFIG_SECTIONS = ("actor_rollout_ref.actor.megatron", "engine")
