"""One hydra override grammar for the verl config reader and the command-line hints (layout.overrides).

Before, the two had their own regular expressions and disagreed: the config reader took keys with a ``-``
(hydra's key names allow one) and the hint reader did not, so ``analyze --config x.yaml --override K=2`` and a
job launched with ``K=2`` on its command line could end with different layouts.
"""

from __future__ import annotations

import pytest

from mtpdiag.layout.cmdline import layout_hints
from mtpdiag.layout.overrides import parse_override
from mtpdiag.layout.sources import read_verl_config

CONFIGS = "tests/fixtures/configs"


@pytest.mark.parametrize(
    "token, op, key, value",
    [
        (
            "actor_rollout_ref.actor.megatron.context_parallel_size=2",
            "",
            "actor_rollout_ref.actor.megatron.context_parallel_size",
            "2",
        ),
        ("+trainer.n_gpus_per_node=8", "+", "trainer.n_gpus_per_node", "8"),
        ("++trainer.nnodes=2", "++", "trainer.nnodes", "2"),
        (
            "~actor_rollout_ref.actor.megatron.context_parallel_size",
            "~",
            "actor_rollout_ref.actor.megatron.context_parallel_size",
            None,
        ),
        ("~trainer.nnodes=2", "~", "trainer.nnodes", "2"),
        ("engine=megatron", "", "engine", "megatron"),
        ("+engine@engine=megatron", "+", "engine@engine", "megatron"),
        ("hydra/launcher=basic", "", "hydra/launcher", "basic"),
        ("data.files.0.path=/x=y", "", "data.files.0.path", "/x=y"),
        ("my-run.megatron.tensor_model_parallel_size=4", "", "my-run.megatron.tensor_model_parallel_size", "4"),
        ("trainer.nnodes=", "", "trainer.nnodes", ""),
        ("trainer.nnodes= 2", "", "trainer.nnodes", " 2"),
    ],
)
def test_what_hydra_reads_as_an_override(token, op, key, value):
    parsed = parse_override(token)
    assert parsed is not None and (parsed.op, parsed.key, parsed.value) == (op, key, value)


@pytest.mark.parametrize(
    "token",
    [
        "--tp",
        "--tp=2",
        "1abc=2",
        "a..b=2",
        "a.=2",
        "=2",
        "trainer.nnodes",
        "+~a=1",
        "a/b.c=1",
        "ä=1",
        "+++a=1",
        "a b=1",
    ],
)
def test_what_is_no_override(token):
    assert parse_override(token) is None


def test_the_hints_and_the_config_reader_take_the_same_overrides():
    """A key hydra accepts is read by both readers (the hint reader refused ``-`` in a key before)."""
    override = "actor_rollout_ref.actor.megatron.context_parallel_size=4"
    dashed = "actor_rollout_ref.actor.megatron.my-extra=1"  # a key with a dash: both must take it
    assert layout_hints([override, dashed])["cp"] == 4
    assert read_verl_config(f"{CONFIGS}/ppo_megatron_cp2_pp2.yaml", [override, dashed])["cp"] == 4
    secondary = "critic.my-model.megatron.tensor_model_parallel_size=2"
    assert layout_hints([secondary]) == {"tp": 2}


def test_a_deletion_or_a_group_choice_is_no_size_hint():
    assert (
        layout_hints(
            [
                "~actor_rollout_ref.actor.megatron.context_parallel_size",
                "+engine@engine=megatron",
                "hydra/launcher=basic",
            ]
        )
        == {}
    )
