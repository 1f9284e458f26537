"""Hugging Face parity of Mixtral (archlab/interop/families/mixtral.py): a softmax-routed mixture of experts
(top-k weights renormalised) on every layer under LLaMA-style attention with GQA and a sliding window.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), norm scales 0.5 + N(0, 0.3²)) gives the
same float32 logits in archlab and in transformers' eager attention and experts, from HF to archlab and
from the shrunk preset to HF; every MoE layer routes every token to the same experts with the same weights;
archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding (padded batches too) equals
HF ``generate``; a save_pretrained directory (the stacked experts) loads, its experts' load counts built
(no state dict holds them) and counting a training step; what Mixtral cannot hold is refused both ways,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "mixtral-window": (
        "MixtralForCausalLM",
        "MixtralConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            **NO_TOKENS,
            intermediate_size=48,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
        ),
    ),
}
TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=3", "model.mlp.d_ff=96"]
# the preset shrunk, its routing and RoPE kept
PRESET = ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2", "model.mlp.expert_d_ff=48"]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "mixtral-window", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        impl=EAGER,
        only=parity.ONE_MODEL_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    mixtral = from_hf(hf_model()).cfg
    assert (
        mixtral.attention.window,
        mixtral.mlp.routing.n_experts,
        mixtral.mlp.expert_d_ff,
        mixtral.mlp.routing.normalize_top_k,
    ) == (WINDOW, 4, 48, True)


def test_every_token_is_routed_as_hf_routes_it():
    """In every MoE layer, the experts archlab's forward chooses for every token (from its own hidden
    states) are HF's, and on HF's hidden states its router gives HF's weights."""
    parity.check_routed_as_hf(hf_model(seed=8))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit."""
    parity.check_exports(compose_model(["model=mixtral-8x7b", *TINY, *PRESET]), "MixtralForCausalLM", **EAGER)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.mlp.routing.normalize_top_k=false"], "model.mlp.routing.normalize_top_k"),
        (["model/layers=dense_first"], "model.layers.first"),
        (["model.mlp.routing.scoring=sigmoid"], "model.mlp.routing.scoring"),
        (["model.mlp.expert=gelu"], "model.mlp.expert"),
        (["model.mlp.bias=true"], "model.mlp.bias"),
        (["model/layers=every_other_global", "model.attention.window=8"], "model.layers.pattern"),
        (["model/position=yarn", "model.position.scaling.original_context=4096"], "model.position.scaling.kind"),
        (["model.position.scaling.truncate=false"], "model.position.scaling.truncate"),  # no YaRN to read it
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(overrides, field):
    parity.check_refuses(lambda: config_to_hf(compose_model(["model=mixtral-8x7b", *overrides])), field, "Hugging Face")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(router_jitter_noise=0.1), "MixtralConfig.router_jitter_noise"),
        (dict(hidden_act="relu"), "MixtralConfig.hidden_act"),
        (
            dict(
                rope_parameters=dict(
                    rope_type="yarn",
                    rope_theta=10000.0,
                    factor=4.0,
                    original_max_position_embeddings=64,
                    beta_fast=4.0,
                    beta_slow=0.25,
                )
            ),
            "MixtralConfig.rope_parameters.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mixtral-window", **changes)), field)


def test_a_converted_model_s_buffers_are_built_and_count_a_training_step(tmp_path):
    """``from_hf`` and ``load_hf_dir`` leave no buffer on the meta device: each MoE layer's load count, which
    no state dict holds, starts at 0 on the weights' device and counts a training step's assignments (2 of
    the 4 experts for each of the 2 x 8 tokens: 32 per layer), as it does in a model archlab built."""
    import torch

    from archlab.interop.hf import load_hf_dir

    hf = hf_model()
    hf.save_pretrained(tmp_path)
    for model in (from_hf(hf), load_hf_dir(tmp_path)):
        assert [name for name, b in model.named_buffers() if b.is_meta] == []
        loads = [b for name, b in model.named_buffers() if name.endswith(".load")]
        assert len(loads) == 3 and all(b.device == model.tok_emb.weight.device and b.sum() == 0 for b in loads)
        model.train()
        logits = model(torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(0)))
        logits.float().logsumexp(-1).mean().backward()
        assert [int(b.sum()) for b in loads] == [32, 32, 32]
