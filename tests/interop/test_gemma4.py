"""Hugging Face parity of Gemma 4 (text) (archlab/interop/families/gemma4.py, model_type gemma4_text): sandwich
layers of sliding and full attention, full layers with heads of their own size and count, proportional RoPE and
values that are the keys' projection, an unscaled value RMSNorm, the last layers sharing the keys and values of
the last earlier layer of their type (their MLP twice as wide), per-layer input embeddings and a scalar per
layer.

Tiny random models (every parameter and the ``layer_scalar`` buffers redrawn: matrices N(0, 0.2²), norm scales
and scalars 0.5 + N(0, 0.3²)) give HF's float32 eager logits; archlab -> HF -> archlab is bit-identical; greedy
generation, past the window of 4 and through the shared layers' KV cache, and left-padded batches equal HF
``generate``; a save_pretrained directory reads back; what the family cannot hold is refused both ways."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS, WIDTHS, WINDOW

from archlab import count_params
from archlab.config import ModelConfig
from archlab.interop.hf import config_from_hf, from_hf
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
BASE = dict(
    HF_SIZES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=48,
    sliding_window=WINDOW,
    **NO_TOKENS,
)
# proportional RoPE at a base low enough that its turning pairs turn over the test's positions
ROPE = {
    S: {"rope_type": "default", "rope_theta": 100.0},
    F: {"rope_type": "proportional", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
}
HF_CASES = {
    # E2B's parts: sliding, full, sliding, full, the last two sharing KV with double-wide MLPs; per-layer inputs
    # from a table of its own size; full layers of 32-wide heads, one key/value head, keys as values; capped logits
    "gemma4": (
        "Gemma4ForCausalLM",
        "Gemma4TextConfig",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_types=[S, F, S, F],
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=128,
            final_logit_softcapping=5.0,
            rope_parameters=ROPE,
        ),
    ),
    # no per-layer inputs, sharing or K=V; attention biases, an untied head, three layers (the last full)
    "gemma4-plain": (
        "Gemma4ForCausalLM",
        "Gemma4TextConfig",
        dict(
            BASE,
            num_hidden_layers=3,
            layer_types=[S, S, F],
            global_head_dim=16,
            hidden_size_per_layer_input=0,
            attention_bias=True,
            tie_word_embeddings=False,
            rope_parameters=ROPE,
        ),
    ),
    # 26B-A4B's parts: experts beside every layer's MLP (4 of them, top 2, each 16 wide), K=V on the full layers
    "gemma4-moe": (
        "Gemma4ForCausalLM",
        "Gemma4TextConfig",
        dict(
            BASE,
            num_hidden_layers=3,
            layer_types=[S, S, F],
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=16,
            rope_parameters=ROPE,
        ),
    ),
}


# an archlab layout of Gemma 4's parts: gemma3-1b's shrunk, with plain norm scales, value norms, unscaled
# scores, layer scalars, per-layer inputs; local, global (proportional RoPE, 32-wide heads, keys as values),
# then both again sharing the keys and values of the first two, with MLPs twice as wide
GLOBAL = {"window": None, "head_dim": 32, "n_kv_head": 1}
LAYOUT = [
    "model=gemma3-1b",
    *WIDTHS,
    "model.n_layer=4",
    "model.attention.head_dim=16",
    "model.norm.unit_offset=false",
    "model.attention.v_norm=true",
    "model.attention.scale=1.0",
    "model.block.layer_scalar=true",
    "model.per_layer_input.dim=8",
]


def layout(**changes) -> ModelConfig:
    rope = {"theta": 1e3, "turning_fraction": 0.5}
    kinds = dict(
        pattern=["local", "global", "local_shared", "global_shared"],
        local={"attention": {"window": WINDOW}},
        global_={"attention": {**GLOBAL, "v_from_k": True}, "position": rope},
        local_shared={
            "attention": {"window": WINDOW, "kv_shared": True},
            "position": {"theta": 1e4},
            "mlp": {"d_ff": 192},
        },
        global_shared={"attention": {**GLOBAL, "kv_shared": True}, "position": rope, "mlp": {"d_ff": 192}},
    )
    return parity.with_kinds(parity.with_kinds(parity.composed(*LAYOUT), **kinds), **changes)


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# Gemma 4 Unified's text class: Gemma 4's layers without per-layer inputs, 'vision' bidirectional by default
UNIFIED = {
    "gemma4-unified": (
        "Gemma4UnifiedForCausalLM",
        "Gemma4UnifiedTextConfig",
        {k: v for k, v in HF_CASES["gemma4"][2].items() if "per_layer" not in k},
    )
}
UNIFIED["unshared"] = (*UNIFIED["gemma4-unified"][:2], dict(UNIFIED["gemma4-unified"][2], num_kv_shared_layers=0))


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES))


def test_the_family_s_parts_read_from_the_config():
    """Layer 0's parts as the model's own; the full layers' heads, RoPE and K=V in kind global; kv_shared and
    the double-wide MLP in the _shared kinds; the per-layer inputs' table of its own size."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "gemma4"))
    assert ignored(cfg) == []
    a = cfg.attention
    assert (a.window, a.head_dim, a.n_kv_head, a.v_norm, a.scale, a.qk_norm) == (WINDOW, 16, 2, True, 1.0, "head")
    assert (cfg.block.kind, cfg.block.layer_scalar, cfg.norm.unit_offset) == ("sandwich", True, False)
    assert (cfg.per_layer_input.dim, cfg.per_layer_input.vocab) == (8, 128)
    assert (cfg.layers.first, cfg.layers.pattern) == ([], ["local", "global", "local_shared", "global_shared"])
    glob = {"window": None, "head_dim": 32, "n_kv_head": 1, "v_from_k": True}
    assert cfg.layers.kinds["global"]["attention"] == glob
    assert cfg.layers.kinds["global"]["position"] == {"theta": 1000.0, "turning_fraction": 0.5}
    shared = {"window": None, "head_dim": 32, "n_kv_head": 1, "kv_shared": True}  # its values: its server's
    assert cfg.layers.kinds["global_shared"]["attention"] == shared
    assert cfg.layers.kinds["local_shared"] == {"attention": {"kv_shared": True}, "mlp": {"d_ff": 96}}


def test_experts_in_the_mlp_s_place_are_refused():
    """A MoE that is not Gemma's (in the MLP's place, not beside it) names model.mlp.beside; Gemma 4 Unified has
    no experts at all."""
    cfg = parity.composed(*LAYOUT, "model/mlp=moe", "model.mlp.expert=geglu", "model.mlp.approximate=tanh")
    parity.check_family_refuses("gemma4_text", cfg, "model.mlp.beside")
    parity.check_family_refuses("gemma4_unified_text", cfg, "model.mlp.beside")


def test_the_experts_beside_the_mlp_read_from_the_config():
    """enable_moe_block: a MoE of tanh-GeGLU experts beside a dense MLP of intermediate_size, Gemma's router."""
    m = config_from_hf(parity.hf_config(HF_CASES, "gemma4-moe")).mlp
    assert (m.kind, m.expert, m.approximate, m.beside, m.d_ff, m.expert_d_ff) == ("moe", "geglu", "tanh", True, 48, 16)
    r = m.routing
    assert (r.n_experts, r.top_k, r.scoring, r.normalize_top_k, r.router_norm, r.expert_scale) == (
        4, 2, "softmax", True, True, True
    )  # fmt: skip


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(use_bidirectional_attention="all"), "Gemma4TextConfig.use_bidirectional_attention"),
        (dict(hidden_activation="relu"), "Gemma4TextConfig.hidden_activation"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "gemma4", **changes)), field)


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout converts to Gemma4ForCausalLM with the same logits, and back with every tensor bit for bit
    and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "Gemma4ForCausalLM", **ATTN)
    assert hf.config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize(
    "changes, field",
    [
        # a shared layer before one of its own (whose kind leaves kv_shared as the model's)
        (dict(pattern=["local", "local_shared", "global", "global_shared"]), "model.attention.kv_shared"),
        # values from the keys on a sliding layer
        (dict(local={"attention": {"v_from_k": True}}), "model.layers.kinds.local.attention.v_from_k"),
        # the last layer sliding
        (dict(pattern=["global", "local", "global_shared", "local_shared"]),
         "model.layers.kinds.local_shared.attention.window"),
        # one shared layer's MLP wider, the other's not
        (dict(local_shared={"mlp": {"d_ff": 96}}), "model.layers.kinds.global_shared.mlp.d_ff"),
        (dict(model={"norm": {"unit_offset": True}}), "model.norm.unit_offset"),
        (dict(model={"attention": {"v_norm": False}}), "model.attention.v_norm"),
    ],
)  # fmt: skip
def test_the_family_refuses_what_it_cannot_express(changes, field):
    parity.check_family_refuses("gemma4_text", layout(**changes), field)


@pytest.mark.parametrize("case", ["gemma4"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout (the full
    layers' heads travel as per_layer_config)."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)


def test_gemma4_unified_reads_as_gemma4_s_layers_and_exports_as_gemma4():
    """Gemma4UnifiedForCausalLM's logits and greedy and padded decoding, every weight redrawn, and back bit for
    bit; its layout with shared keys and values and no per-layer inputs exports as itself (transformers'
    Gemma 4 fails on it), the same without sharing as Gemma 4 (the record defers)."""
    hf = parity.hf_case(UNIFIED, "gemma4-unified", 1, **ATTN)
    assert hf.config.use_bidirectional_attention == "vision"
    model = parity.check_from_hf(hf)
    parity.check_to_hf_and_back(model, "Gemma4UnifiedForCausalLM", **ATTN)
    unshared = parity.hf_case(UNIFIED, "unshared", 2, **ATTN)
    parity.check_to_hf_and_back(parity.check_from_hf(unshared, family="gemma4_text"), "Gemma4ForCausalLM", **ATTN)
    parity.check_greedy_generation(hf)
    parity.check_padded_generation(hf)


@pytest.mark.parametrize(
    "changes",
    [
        {},  # Gemma4TextConfig()'s defaults: 30 layers of d 2304, per-layer inputs of 256
        # a MoE of 128 experts, top 8, beside each MLP
        dict(enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
             hidden_size_per_layer_input=0),
        # 10 shared layers with double-wide MLPs, K=V on the full layers with 2 key/value heads
        dict(num_kv_shared_layers=10, use_double_wide_mlp=True, attention_k_eq_v=True, num_global_key_value_heads=2),
    ],
)  # fmt: skip
def test_the_closed_form_count_is_transformers_count_at_full_size(changes):
    """archlab's count of the config it reads equals the parameters transformers builds (on the meta device)."""
    import torch

    config = transformers.Gemma4TextConfig(**changes)
    with torch.device("meta"):
        hf = transformers.Gemma4ForCausalLM(config)
    assert count_params(config_from_hf(config))["total"] == sum(p.numel() for p in hf.parameters())
