"""Hugging Face parity of Lara-Mini (``LaraMiniForCausalLM``, transformers 5.24).

Tiny random models hold its three layer types: Gated DeltaNet projecting q, k, v, z, b and a apart (fewer
query/key heads than value heads, key and value heads of different sizes), GQA with per-head QK-norm over a
sliding window of 4 with RoPE, and the same attention over the whole past without positions; a softmax
top-k MoE with an ungated shared expert twice the routed width in every layer. Every parameter redrawn
(vectors, A_log and dt_bias among them, 0.5 ± 0.3; conv1d and matrices N(0, 0.2²)). They give HF's float32
eager logits within 1e-4; archlab -> HF -> archlab is bit-identical; greedy and left-padded batched
generation equal HF ``generate``; a save_pretrained directory (its Gated DeltaNet projections fused into one
``in_proj``, its gated norm named ``out_norm``, as published) reads back through load_hf_dir.
"""

from typing import Any

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, TOL, logits, max_diff, randomize

from archlab import ConfigError
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf
from archlab.nn.mixers.base import window_of
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LINEAR, SLIDING, FULL = "linear_attention", "sliding_attention", "full_attention"
BASE = dict(
    HF_SIZES,
    num_hidden_layers=5,  # the published period: linear, sliding, linear, full, sliding
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=4,
    rope_parameters=dict(rope_type="default", rope_theta=100.0),
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=8,
    shared_expert_intermediate_size=16,
)
CASES = {
    "published-pattern": BASE,  # a tied head, as published
    # attention biases, weights as scored, one key head per value head, an untied head, the full layer first
    "bias": dict(
        BASE,
        num_hidden_layers=3,
        layer_types=[FULL, SLIDING, LINEAR],
        attention_bias=True,
        norm_topk_prob=False,
        linear_num_key_heads=4,
        tie_word_embeddings=False,
    ),
}


def hf_model(case: str, seed: int = 1) -> Any:
    config = transformers.LaraMiniConfig(**CASES[case], **parity.NO_TOKENS, **EAGER)
    return randomize(transformers.LaraMiniForCausalLM(config), seed)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf_and_convert_back_bit_for_bit(case):
    hf = hf_model(case)
    model = from_hf(hf)
    assert ignored(model.cfg) == []
    assert max_diff(logits(model), logits(hf)) <= TOL
    back = parity.check_back_and_again(hf, model, **EAGER)
    assert back.config.layer_types == hf.config.layer_types


def test_the_layer_kinds_read_from_the_config():
    """layer_types become the kinds deltanet, sliding (the window) and nope (no positions), in the shortest
    first and pattern; the shared expert is ungated."""
    cfg = from_hf(hf_model("published-pattern")).cfg
    assert (cfg.layers.first, cfg.layers.pattern) == (["deltanet"], ["sliding", "deltanet", "nope"])
    assert cfg.layers.kinds["sliding"] == {"attention": {"window": 4}}
    assert cfg.layers.kinds["nope"] == {"position": {"kind": "none"}}
    kinds = [(lc.attention.kind, window_of(lc), lc.position.kind) for lc in layer_configs(cfg)]
    assert kinds[1:4] == [("causal", 4, "rope"), ("gated_deltanet", None, "rope"), ("causal", None, "none")]
    assert (cfg.mlp.n_shared_experts, cfg.mlp.shared_expert_gate, cfg.head.tied) == (2, False, True)


def test_each_layer_kind_changes_the_logits():
    """The same weights without the window, or with RoPE on the full layers, give other logits."""
    model = from_hf(hf_model("published-pattern"))
    for kinds in (
        dict(model.cfg.layers.kinds, sliding={}),
        dict(model.cfg.layers.kinds, nope={}),
    ):
        cfg = parity.changed_cfg(model.cfg)
        cfg.layers.kinds = kinds
        parity.check_changes_logits(model, cfg, str(kinds))


@pytest.mark.parametrize("case", list(CASES))
def test_generation_matches_hf_generate(case):
    """Greedy decoding past the window, and left-padded prompts of 7, 3 and 5 tokens in one batch: the ids
    and every step's logits of HF ``generate``."""
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


def test_save_pretrained_directory_round_trip(tmp_path):
    """save_pretrained (the fused in_proj and out_norm, as published) -> load_hf_dir -> save_hf_dir ->
    from_pretrained: the same logits."""
    parity.check_directory_round_trip(hf_model("published-pattern", seed=7), tmp_path, None, None, **EAGER)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "LaraMiniConfig.hidden_act"),
        (dict(shared_expert_intermediate_size=12), "LaraMiniConfig.shared_expert_intermediate_size"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.5)), "LaraMiniConfig.rope_parameters.partial_rotary_factor"),
        (dict(layer_types=[LINEAR, SLIDING, "chunked_attention", FULL, SLIDING]), "LaraMiniConfig.layer_types"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(transformers.LaraMiniConfig(**{**BASE, **changes}))
    assert err.value.field == field


@pytest.mark.parametrize(
    "kinds, field",
    [
        (dict(nope={"position": {"kind": "none"}, "attention": {"window": 4}}), "model.layers.kinds.nope.position.kind"),
        (dict(sliding={"attention": {"window": 4}, "position": {"kind": "none"}}), "model.layers.kinds.sliding.position.kind"),
        (dict(nope={"position": {"kind": "none"}, "attention": {"qk_norm": "none"}}), "model.layers.kinds.nope.attention.qk_norm"),
        (dict(sliding={"attention": {"window": 4}, "mlp": {"routing": {"top_k": 3}}}), "model.layers.kinds.sliding.mlp.routing.top_k"),
        (dict(nope={}), "model.position.kind"),
    ],
)  # fmt: skip
def test_to_hf_refuses_layers_lara_mini_cannot_hold(kinds, field):
    """Its sliding layers have RoPE and one window, its full layers no positions; one attention and MoE."""
    cfg = from_hf(hf_model("published-pattern")).cfg
    cfg.layers.kinds = {**cfg.layers.kinds, **kinds}
    assert field in {p.field for p in FAMILIES["lara_mini"].problems(cfg)}
    with pytest.raises(ConfigError):
        FAMILIES["lara_mini"].check(cfg)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(allow_neg_eigval=True), "model.layers.kinds.deltanet.attention.allow_neg_eigval"),
        (dict(norm_eps=1e-3), "model.layers.kinds.deltanet.attention.norm_eps"),
        (dict(output_gate="sigmoid"), "model.layers.kinds.deltanet.attention.output_gate"),
    ],
)
def test_to_hf_refuses_linear_layers_lara_mini_cannot_hold(change, field):
    """Its linear layers' β is sigmoid(b), their gated norm norm(o)·silu(z) at rms_norm_eps (Qwen3-Next's)."""
    cfg = from_hf(hf_model("published-pattern")).cfg
    deltanet = cfg.layers.kinds["deltanet"]
    cfg.layers.kinds = {**cfg.layers.kinds, "deltanet": {**deltanet, "attention": {**deltanet["attention"], **change}}}
    assert field in {p.field for p in FAMILIES["lara_mini"].problems(cfg)}
    with pytest.raises(ConfigError):
        FAMILIES["lara_mini"].check(cfg)
