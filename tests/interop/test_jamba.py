"""Hugging Face parity of Jamba (JambaForCausalLM; archlab/interop/families/jamba.py): tiny random models
(every parameter redrawn: matrices N(0, 0.2²), vectors, among them the Mamba layers' Δ/B/C norm scales,
A_log, D and the biases, 0.5 + N(0, 0.3²)) holding every layer kind, Mamba-1 and NoPE GQA attention each
with a dense SwiGLU or a softmax MoE whose top-k weights are not renormalised, give the same float32 logits
in archlab and in transformers' eager attention and experts; with projection biases, no convolution bias,
a Δ rank of its own and a tied head too; greedy and left-padded decoding equal HF ``generate``; HF ->
archlab -> HF -> archlab and the shrunk ``jamba-v0.1`` preset -> HF -> archlab give back every tensor bit for
bit; a save_pretrained directory (each expert saved apart) round trips; ``JambaConfig()`` reads into the
preset; the refusals name their field.

HF's Mamba layers zero a padded position's input before ``in_proj``, as Bamba's: with ``mamba_proj_bias``
the projection's bias reaches the convolution of the tokens after the padding, so the left-padded check
runs without it (archlab's padded row computes the prompt alone, tests/interop/test_bamba.py shows it)."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, NO_TOKENS, V
from helpers.published import ACTIVE, PUBLISHED

from archlab import compose_model, count_params
from archlab.config.layers import layer_kind
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# width 64, 4 layers: attention at 0 and 3 (period 3), MoE at 1 and 3 (period 2, offset 1), so the layers are
# attention + dense, Mamba + MoE, Mamba + dense, attention + MoE; 4 heads of 16 (2 KV heads), MLP and experts
# of 96, 4 experts (top 2); Mamba: inner 128 (expand 2), state 8, Δ rank 4 (ceil(64 / 16)), conv 4
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4)
SMALL |= dict(num_key_value_heads=2, max_position_embeddings=64, attn_layer_period=3, attn_layer_offset=0)
SMALL |= dict(expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8)
SMALL |= dict(NO_TOKENS, rms_norm_eps=1e-5)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "jamba": ("JambaForCausalLM", "JambaConfig", SMALL),
    # projection biases, no convolution bias, Δ rank 3, expand 1, no experts (num_experts 1: every MLP
    # dense), JambaConfig's attention layer at 4 of 5 layers, a tied head
    "jamba-biases-tied": (
        "JambaForCausalLM",
        "JambaConfig",
        dict(SMALL, num_hidden_layers=5, attn_layer_period=8, attn_layer_offset=4, num_experts=1)
        | dict(mamba_proj_bias=True, mamba_conv_bias=False, mamba_dt_rank=3, mamba_expand=1, tie_word_embeddings=True),
    ),
}
# case -> (preset, HF class, sizes over helpers.hf.TINY): jamba-v0.1 at width 64, 5 layers (attention at 4),
# 4 experts of 96
PRESET_CASES = {
    "jamba-v0.1": (
        "jamba-v0.1",
        "JambaForCausalLM",
        ["model.n_layer=5", "model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
        + ["model.layers.kinds.mamba_moe.mlp.routing.n_experts=4", "model.layers.kinds.mamba.attention.state_size=8"]
        + ["model.layers.kinds.mamba_moe.attention.state_size=8"],
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name; left padding without biases
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        PRESET_CASES,
        impl=EAGER,
        only=(
            "test_from_hf_gives_hf_logits",
            "test_hf_to_archlab_to_hf_and_back",
            "test_archlab_to_hf_to_archlab_is_bit_identical",
            "test_greedy_generation_matches_hf_generate",
            "test_save_pretrained_directories_round_trip",
        ),
    )
    | parity.family_tests(
        hf_model, {"jamba": HF_CASES["jamba"]}, impl=EAGER, only=("test_padded_batch_generation_matches_hf_generate",)
    )
)


def test_from_hf_reads_the_parts():
    cfg = from_hf(hf_model("jamba")).cfg
    assert [layer_kind(cfg, i) for i in range(4)] == ["attention", "mamba_moe", "mamba", "moe"]
    mamba = cfg.layers.kinds["mamba"]["attention"]
    assert mamba == {
        "kind": "mamba", "state_size": 8, "conv_kernel": 4, "conv_bias": True, "bias": False, "bc_dt_norm": True,
        "bc_dt_norm_scale": True, "bc_dt_norm_eps": 1e-5,
    }  # fmt: skip
    assert cfg.layers.kinds["moe"] == {"mlp": cfg.layers.kinds["mamba_moe"]["mlp"]}
    routing = cfg.layers.kinds["moe"]["mlp"]["routing"]
    assert (routing["n_experts"], routing["top_k"], routing["normalize_top_k"]) == (4, 2, False)
    a = cfg.attention
    assert (a.kind, a.n_head, a.n_kv_head, a.qkv_bias, cfg.position.kind, cfg.mlp.kind, cfg.mlp.d_ff) == (
        "causal", 4, 2, False, "none", "swiglu", 96,
    )  # fmt: skip
    biased = from_hf(hf_model("jamba-biases-tied")).cfg
    assert [layer_kind(biased, i) for i in range(5)] == ["mamba"] * 4 + ["attention"]
    m = biased.layers.kinds["mamba"]["attention"]
    assert (m["bias"], m["conv_bias"], m["dt_rank"], m["inner"], biased.head.tied) == (True, False, 3, 64, True)


def test_every_token_is_routed_as_hf_routes_it():
    """In both MoE layers, the experts archlab chooses for every token are HF's, with HF's weights (not
    renormalised: they sum to less than 1)."""
    parity.check_routed_as_hf(hf_model("jamba", seed=8), mlp="feed_forward", router="router")


def test_layers_placed_by_period_and_offset_write_back_as_given():
    """JambaConfig's own periods are kept where they place the layers; other layouts get the shortest."""
    c = config_to_hf(from_hf(hf_model("jamba")).cfg)
    assert (c.attn_layer_period, c.attn_layer_offset, c.expert_layer_period, c.expert_layer_offset) == (3, 0, 2, 1)
    c = config_to_hf(from_hf(hf_model("jamba-biases-tied")).cfg)
    assert (c.attn_layer_period, c.attn_layer_offset, c.num_experts) == (8, 4, 1)


def test_jamba_config_defaults_read_into_the_preset():
    """transformers' ``JambaConfig()`` (its docstring's checkpoint, ai21labs/Jamba-v0.1) reads into
    ``jamba-v0.1`` field for field and writes back the same keys; the counts are the published ones."""
    default = transformers.JambaConfig()
    cfg = config_from_hf(default)
    assert cfg == compose_model(["model=jamba-v0.1"])
    counts = count_params(cfg)
    assert (counts["total"], counts["active"]) == (PUBLISHED["jamba-v0.1"], ACTIVE["jamba-v0.1"])
    back = config_to_hf(cfg)
    keys = ("hidden_size", "num_hidden_layers", "num_key_value_heads", "intermediate_size", "num_experts")
    keys += ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset")
    keys += ("mamba_d_state", "mamba_dt_rank", "mamba_expand", "mamba_conv_bias", "mamba_proj_bias", "rms_norm_eps")
    for key in keys:
        assert getattr(back, key) == getattr(default, key), key


TINY = ["model=jamba-v0.1", "model.n_layer=5", "model.d_model=64", "model.attention.n_head=4"]
TINY += ["model.attention.n_kv_head=2"]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model/position=rope"], "model.position.kind"),
        (["model.attention.qkv_bias=true"], "model.attention.qkv_bias"),
        (["model/mlp=gelu"], "model.mlp.kind"),
        (["model.layers.kinds.mamba.attention.bc_dt_norm_scale=false"], "model.layers.kinds.mamba.attention.bc_dt_norm_scale"),
        (["model.layers.kinds.mamba.attention.bc_dt_norm_eps=1e-5"], "model.layers.kinds.mamba.attention.bc_dt_norm_eps"),
        (["model.layers.kinds.mamba_moe.attention.state_size=8"], "model.layers.kinds.mamba_moe.attention.state_size"),
        (["+model.layers.kinds.mamba.attention.inner=96"], "model.layers.kinds.mamba.attention.inner"),
        (["model.layers.kinds.mamba_moe.mlp.routing.normalize_top_k=true"], "model.layers.kinds.mamba_moe.mlp.routing.normalize_top_k"),
        (["+model.layers.kinds.mamba_moe.mlp.expert_d_ff=32"], "model.layers.kinds.mamba_moe.mlp.expert_d_ff"),
        (["model.layers.kinds.mamba_moe.mlp.routing.n_experts=1", "model.layers.kinds.mamba_moe.mlp.routing.top_k=1"], "model.layers.kinds.mamba_moe.mlp.routing.n_experts"),
        (["+model.layers.kinds.attention.attention={window: 4}"], "model.layers.kinds.attention.attention.window"),
        (["model.layers.pattern=[mamba,attention,attention]"], "model.layers.pattern"),  # attention at 1, 2, 4
        (["model.layers.pattern=[attention]"], "model.layers.pattern"),  # no Mamba layer
    ],
)  # fmt: skip
def test_the_record_refuses_what_jamba_does_not_hold(overrides, field):
    cfg = compose_model([*TINY, *overrides])
    assert field in {p.field for p in FAMILIES["jamba"].problems(cfg)}


def test_the_shrunk_preset_is_held():
    assert FAMILIES["jamba"].problems(compose_model(TINY)) == []


@pytest.mark.parametrize(
    "changes, field",
    [(dict(hidden_act="gelu"), "JambaConfig.hidden_act")],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "jamba", **changes)), field)
