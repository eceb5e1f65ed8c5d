"""Parallel sizes read from command lines: Megatron-LM flags, verl hydra overrides, short flags."""

from __future__ import annotations

import pytest

from mtpdiag.layout.cmdline import layout_hints, merge_hints

PY = ["/usr/bin/python3", "-u"]


def test_megatron_flags_with_space_and_equals():
    argv = PY + [
        "pretrain_gpt.py",
        "--tensor-model-parallel-size",
        "2",
        "--context-parallel-size=4",
        "--pipeline-model-parallel-size",
        "8",
        "--expert-model-parallel-size=16",
        "--expert-tensor-parallel-size",
        "1",
        "--virtual-pipeline-model-parallel-size",
        "3",
    ]
    assert layout_hints(argv) == {"tp": 2, "cp": 4, "pp": 8, "ep": 16, "etp": 1, "vpp": 3}


def test_layers_per_virtual_stage_is_not_vpp():
    argv = PY + [
        "pretrain_gpt.py",
        "--num-layers-per-virtual-pipeline-stage",
        "2",
        "--pipeline-model-parallel-size",
        "4",
    ]
    assert layout_hints(argv) == {"pp": 4}


def test_verl_actor_overrides():
    argv = PY + [
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
        "++actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2",
    ]
    assert layout_hints(argv) == {"cp": 2, "tp": 4, "pp": 2, "ep": 8, "etp": 1, "vpp": 2}


def test_rollout_tensor_parallel_is_the_inference_engine_not_training():
    argv = PY + [
        "-m",
        "verl.trainer.main_ppo",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    ]
    assert layout_hints(argv) == {"tp": 2}


def test_actor_wins_over_critic_and_ref_in_either_order():
    argv = PY + [
        "-m",
        "verl.trainer.main_ppo",
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "critic.megatron.context_parallel_size=4",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=3",
    ]
    # critic's cp never overrides the actor's; ref's pp counts because the actor names none
    assert layout_hints(argv) == {"cp": 2, "pp": 3}


def test_sft_engine_spelling():
    argv = PY + [
        "-m",
        "verl.trainer.sft_trainer",
        "engine=megatron",
        "engine.tensor_model_parallel_size=2",
        "engine.context_parallel_size=2",
        "engine.pipeline_model_parallel_size=1",
    ]
    assert layout_hints(argv) == {"tp": 2, "cp": 2, "pp": 1}


def test_short_flags_only_with_an_integer():
    assert layout_hints(PY + ["worker.py", "--gate", "buggy", "--cp", "2", "--pp", "2"]) == {"cp": 2, "pp": 2}
    assert layout_hints(PY + ["tool.py", "--tp", "--cp=x", "--ep", "auto", "--pp=3"]) == {"pp": 3}


def test_last_value_wins_as_argparse_and_hydra_do():
    argv = PY + [
        "train.py",
        "--tensor-model-parallel-size",
        "2",
        "--tp",
        "4",
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "actor_rollout_ref.actor.megatron.context_parallel_size=8",
    ]
    assert layout_hints(argv) == {"tp": 4, "cp": 8}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        PY + ["train.py", "--tensor-model-parallel-size"],
        PY + ["train.py", "--context-parallel-size", "0"],
        PY + ["train.py", "--context-parallel-size", "-2"],
        PY + ["-m", "verl.trainer.main_ppo", "actor_rollout_ref.actor.megatron.context_parallel_size=null"],
        PY + ["-m", "verl.trainer.main_ppo", "context_parallel_size=2"],
        PY + ["train.py", "--secret-flag=hunter2", "--wandb-key", "abc"],
    ],
)
def test_nothing_is_guessed(argv):
    assert layout_hints(argv) == {}


def test_merge_keeps_the_first_source_for_each_key():
    assert merge_hints({"cp": 2}, {"cp": 4, "pp": 2}, {"tp": 1, "pp": 8}) == {"cp": 2, "pp": 2, "tp": 1}
