"""Where the layout comes from: verl configs (with hydra overrides), flags, command-line hints.

The configs under fixtures/configs/ are written in the shape of verl 0.8's real config tree; a test marked
``verl`` also reads the generated config shipped in the real verl wheel when verl is importable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpdiag.errors import InputError
from mtpdiag.layout import ParallelLayout
from mtpdiag.layout.sources import read_verl_config, resolve_layout
from support.verl_wheels import verl_megatron_config

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
CP2_PP2 = str(CONFIGS / "ppo_megatron_cp2_pp2.yaml")
MOE = str(CONFIGS / "ppo_megatron_moe.yaml")
USER = str(CONFIGS / "ppo_megatron_user.yaml")
SFT = str(CONFIGS / "sft_megatron_engine.yaml")
FSDP = str(CONFIGS / "ppo_fsdp.yaml")
BAD_INTERPOLATION = str(CONFIGS / "ppo_megatron_bad_interpolation.yaml")
ACTOR = "actor_rollout_ref.actor.megatron"
NO_FLAGS: dict = {}


# ---- read_verl_config -----------------------------------------------------------------------------------


def test_reads_the_actor_section_and_leaves_nulls_out():
    assert read_verl_config(CP2_PP2) == {"tp": 1, "cp": 2, "pp": 2, "ep": 1}


def test_ignores_rollout_and_critic_parallel_sizes():
    # rollout tp is 4 and critic tp is 4 in this file; the actor's tp is 1
    assert read_verl_config(CP2_PP2)["tp"] == 1


def test_reads_moe_sizes_including_etp_and_vpp():
    assert read_verl_config(MOE) == {"tp": 2, "cp": 1, "pp": 2, "ep": 4, "etp": 1, "vpp": 2}


def test_reads_the_sft_trainer_engine_section():
    assert read_verl_config(SFT) == {"tp": 2, "cp": 1, "pp": 2, "ep": 1}


def test_partial_user_config_gives_only_what_it_sets():
    assert read_verl_config(USER) == {"cp": 2}


def test_override_changes_a_size():
    assert read_verl_config(CP2_PP2, [f"{ACTOR}.context_parallel_size=4"])["cp"] == 4


def test_override_adds_a_key_missing_from_a_partial_config():
    sizes = read_verl_config(
        USER, [f"{ACTOR}.pipeline_model_parallel_size=2", f"+{ACTOR}.tensor_model_parallel_size=2"]
    )
    assert sizes == {"cp": 2, "pp": 2, "tp": 2}


def test_force_add_and_null_overrides():
    sizes = read_verl_config(
        MOE, [f"++{ACTOR}.expert_tensor_parallel_size=null", f"{ACTOR}.virtual_pipeline_model_parallel_size=null"]
    )
    assert "etp" not in sizes and "vpp" not in sizes and sizes["ep"] == 4


def test_delete_override_unsets_a_size():
    assert "cp" not in read_verl_config(CP2_PP2, [f"~{ACTOR}.context_parallel_size"])


def test_quoted_integer_override_is_accepted():
    assert read_verl_config(CP2_PP2, [f"{ACTOR}.pipeline_model_parallel_size='4'"])["pp"] == 4


def test_override_reaches_interpolated_ref_section():
    # ref.megatron follows the actor through ${oc.select:...}: overriding the actor moves both, and the
    # real OmegaConf resolver is what makes that true
    from omegaconf import OmegaConf

    sizes = read_verl_config(CP2_PP2, [f"{ACTOR}.tensor_model_parallel_size=2"])
    cfg = OmegaConf.load(CP2_PP2)
    OmegaConf.update(cfg, f"{ACTOR}.tensor_model_parallel_size", 2)
    assert sizes["tp"] == cfg.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 2


def test_config_group_choices_are_skipped():
    # `engine=megatron` picks a file from verl's config tree; it must not wipe the engine section
    overrides = ["engine=megatron", "+engine@engine=megatron", "engine.context_parallel_size=2"]
    assert read_verl_config(SFT, overrides) == {"tp": 2, "cp": 2, "pp": 2, "ep": 1}


@pytest.mark.parametrize(
    "path, fragment",
    [
        (str(CONFIGS / "does_not_exist.yaml"), "cannot read config"),
        (FSDP, "no megatron section"),
        (BAD_INTERPOLATION, "cannot resolve actor_rollout_ref.actor.megatron.context_parallel_size"),
    ],
)
def test_bad_configs_are_one_line_input_errors(path, fragment):
    with pytest.raises(InputError) as info:
        read_verl_config(path)
    message = str(info.value)
    assert fragment in message and path in message and "\n" not in message


def test_invalid_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("actor_rollout_ref:\n  actor:\n    megatron: [1,\n")
    with pytest.raises(InputError) as info:
        read_verl_config(str(path))
    message = str(info.value)
    assert str(path) in message and "not valid YAML" in message and "line" in message and "\n" not in message


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- tensor_model_parallel_size: 2\n")
    with pytest.raises(InputError, match="not a YAML mapping"):
        read_verl_config(str(path))


def test_directory_is_not_a_config(tmp_path):
    with pytest.raises(InputError, match="cannot read config"):
        read_verl_config(str(tmp_path))


@pytest.mark.parametrize("override", ["context_parallel_size", "=2", "a..b=1", f"{ACTOR}.context_parallel_size=[1"])
def test_bad_override_names_the_file(override):
    with pytest.raises(InputError) as info:
        read_verl_config(CP2_PP2, [override])
    assert "bad override" in str(info.value) and CP2_PP2 in str(info.value)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "true"])
def test_non_positive_or_non_integer_sizes_are_rejected(value):
    with pytest.raises(InputError, match="must be a positive integer"):
        read_verl_config(CP2_PP2, [f"{ACTOR}.context_parallel_size={value}"])


# ---- resolve_layout ------------------------------------------------------------------------------------


def test_no_source_gives_no_layout():
    assert resolve_layout(4, flags={"tp": None, "cp": None, "order": None}) == (None, None)


def test_flags_alone():
    layout, source = resolve_layout(4, flags={"tp": None, "cp": 2, "pp": 2})
    assert layout == ParallelLayout.for_world(4, cp=2, pp=2)
    assert source == "flags --cp 2 --pp 2"


def test_flags_may_carry_the_order():
    layout, source = resolve_layout(8, flags={"tp": 2, "pp": 2, "order": "tp-cp-ep-pp-dp"})
    assert layout.order == "tp-cp-ep-pp-dp"
    assert layout.groups("dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert "--order tp-cp-ep-pp-dp" in source


def test_config_alone():
    layout, source = resolve_layout(4, flags=NO_FLAGS, config=CP2_PP2)
    assert layout == ParallelLayout.for_world(4, tp=1, cp=2, pp=2, ep=1)
    assert source == f"verl config {CP2_PP2}"


def test_config_with_overrides_says_so():
    layout, source = resolve_layout(
        8, flags=NO_FLAGS, config=CP2_PP2, overrides=[f"{ACTOR}.tensor_model_parallel_size=2"]
    )
    assert (layout.tp, layout.cp, layout.pp, layout.dp) == (2, 2, 2, 1)
    assert source == f"verl config {CP2_PP2} with 1 override(s)"


def test_hints_alone():
    layout, source = resolve_layout(4, flags=NO_FLAGS, hints=[{"cp": 2, "pp": 2}, {}])
    assert (layout.cp, layout.pp) == (2, 2)
    assert source == "command line (--context-parallel-size 2 --pipeline-model-parallel-size 2)"


def test_agreeing_hints_from_several_processes_merge():
    layout, _ = resolve_layout(8, flags=NO_FLAGS, hints=[{"cp": 2}, {"cp": 2, "tp": 2}, {"pp": 2}])
    assert (layout.tp, layout.cp, layout.pp, layout.dp) == (2, 2, 2, 1)


def test_disagreeing_hints_are_an_error():
    with pytest.raises(InputError) as info:
        resolve_layout(4, flags=NO_FLAGS, hints=[{"cp": 2}, {"cp": 4}])
    assert "target processes" in str(info.value)
    assert "--context-parallel-size 2" in str(info.value) and "--context-parallel-size 4" in str(info.value)


def test_hints_that_do_not_fit_the_world_are_dropped_and_said():
    """Sizes read off command lines are a guess: one that does not fit gives no layout, not a failed command."""
    layout, source = resolve_layout(2, flags=NO_FLAGS, hints=[{"cp": 2, "pp": 2}])
    assert layout is None
    assert source.startswith("command line (--context-parallel-size 2 --pipeline-model-parallel-size 2), which ")
    assert source.endswith("which does not fit (tp*cp*pp = 1*2*2 = 4 does not divide the world size 2)")


def test_flags_that_do_not_fit_the_world_are_an_error():
    with pytest.raises(InputError, match="does not divide the world size 2"):
        resolve_layout(2, flags={"cp": 2, "pp": 2}, hints=[{"cp": 2}])


def test_sources_merge_in_priority_order():
    layout, source = resolve_layout(8, flags={"tp": 2}, config=USER, hints=[{"pp": 2}])
    assert (layout.tp, layout.cp, layout.pp) == (2, 2, 2)
    assert source == f"flags --tp 2 + verl config {USER} + command line (--pipeline-model-parallel-size 2)"


def test_agreeing_sources_are_fine():
    layout, _ = resolve_layout(4, flags={"cp": 2, "pp": 2}, config=CP2_PP2, hints=[{"cp": 2}])
    assert (layout.cp, layout.pp) == (2, 2)


def test_flags_conflicting_with_config():
    with pytest.raises(InputError) as info:
        resolve_layout(8, flags={"cp": 4}, config=CP2_PP2)
    assert str(info.value) == (f"layout conflict: --cp 4 (flags) but context_parallel_size=2 (config {CP2_PP2})")


def test_config_conflicting_with_hints():
    with pytest.raises(InputError) as info:
        resolve_layout(4, flags=NO_FLAGS, config=CP2_PP2, hints=[{"pp": 4}])
    assert str(info.value) == (
        f"layout conflict: pipeline_model_parallel_size=2 (config {CP2_PP2}) but "
        f"--pipeline-model-parallel-size 4 (command line of the target processes)"
    )


def test_flags_conflicting_with_hints():
    with pytest.raises(InputError, match=r"--tp 2 \(flags\) but --tensor-model-parallel-size 4"):
        resolve_layout(8, flags={"tp": 2}, hints=[{"tp": 4}])


def test_world_size_derived_from_the_config():
    layout, source = resolve_layout(None, flags=NO_FLAGS, config=MOE)
    assert layout.world_size == 16
    assert (layout.tp, layout.pp, layout.ep, layout.etp, layout.vpp) == (2, 2, 4, 1, 2)
    assert layout.dp == 4
    assert source.endswith("(world size 16 from trainer.nnodes * trainer.n_gpus_per_node)")


def test_world_size_that_cannot_be_derived():
    assert resolve_layout(None, flags={"cp": 2}) == (None, "flags --cp 2")
    assert resolve_layout(None, flags=NO_FLAGS, config=USER) == (None, f"verl config {USER}")


def test_given_world_size_wins_over_the_config():
    layout, source = resolve_layout(8, flags=NO_FLAGS, config=CP2_PP2)
    assert layout.world_size == 8 and layout.dp == 2 and "world size" not in source


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(world_size=6, flags={"cp": 4}), "does not divide the world size 6"),
        (dict(world_size=4, flags={"vpp": 2}), "vpp needs pp > 1"),
        (dict(world_size=4, flags={"cp": 2, "pp": 2, "order": "tp-cp-ep-pp-dp"}), "does not end in pp"),
        (dict(world_size=4, flags={"order": "tp-xx"}), "invalid order"),
        (dict(world_size=4, flags={"cp": 0}), "cp must be a positive integer"),
        (dict(world_size=6, flags=NO_FLAGS, config=CP2_PP2), "does not divide the world size 6"),
    ],
)
def test_impossible_layouts_are_input_errors(kwargs, fragment):
    with pytest.raises(InputError) as info:
        resolve_layout(kwargs.pop("world_size"), **kwargs)
    assert fragment in str(info.value)


def test_overrides_without_a_config():
    with pytest.raises(InputError, match="without a config file"):
        resolve_layout(4, flags=NO_FLAGS, overrides=[f"{ACTOR}.context_parallel_size=2"])


def test_bad_config_surfaces_through_resolve_layout():
    with pytest.raises(InputError, match="no megatron section"):
        resolve_layout(8, flags={"cp": 2}, config=FSDP)


def test_unknown_keys_are_a_programming_error():
    with pytest.raises(ValueError):
        resolve_layout(4, flags={"context_parallel_size": 2})


# ---- the real verl config tree -------------------------------------------------------------------------


@pytest.mark.verl
def test_verl_generated_megatron_config_with_the_jobs_overrides():
    path = verl_megatron_config("0.8.0")  # the real config tree from the PyPI wheel
    overrides = [
        f"{ACTOR}.context_parallel_size=2",
        f"{ACTOR}.pipeline_model_parallel_size=2",
        "trainer.n_gpus_per_node=4",
        "trainer.nnodes=1",
    ]
    assert read_verl_config(str(path), overrides) == {"tp": 1, "cp": 2, "pp": 2, "ep": 1}
    layout, source = resolve_layout(None, flags=NO_FLAGS, config=str(path), overrides=overrides)
    assert layout == ParallelLayout.for_world(4, tp=1, cp=2, pp=2, ep=1)
    assert "world size 4" in source
