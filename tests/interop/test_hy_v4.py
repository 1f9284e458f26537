"""Hugging Face parity of Hunyuan V4 (archlab/interop/families/hy_v4.py, model_type hy_v4): DeepSeek sparse
attention whose later layers may keep an earlier indexer's choice (``indexer_types`` "shared": dsa's
``index_shared``), the indexer's rotated dims last, sinks and output gates, DeepSeek-V3's MoE with its routed
experts clamped, layers dense or MoE in any order, and HY V4's hyper-connections (``mhc``, ``mix: none``).

Tiny random models (every parameter and buffer redrawn: the indexer's projections and LayerNorm, the sinks,
the hyper-connections' matrices, biases and scales, the correction biases) over 12 tokens, each query keeping
4 keys, give HF eager's float32 logits in archlab; the sharing, the clamp and the sinks matter (checked);
HF -> archlab -> HF -> archlab is bit for bit; greedy and left-padded decoding equal HF ``generate``; a
save_pretrained directory loads; the closed-form count is transformers' on the default HYV4Config; what
archlab cannot hold is refused both ways, naming the field."""

import copy

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import build_model, count_params
from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf
from archlab.nn.mixers.shared_index import SharedChoice

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, **NO_TOKENS)
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
# 16 indexer heads of 16 (8 rotated), as DeepSeek-V3.2's test: fewer heads tie keys scoring 0 at the boundary
INDEXER = dict(index_n_heads=16, index_head_dim=16, index_topk=4)
MOE = dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3)
MOE |= dict(n_shared_experts=1, routed_scaling_factor=2.5, swiglu_limit=1.0)
HC = dict(hc_mult=3, hc_magnitude=1.5, hc_eps=1e-6)
YARN = dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=16, beta_fast=4.0)
YARN |= dict(beta_slow=0.25, mscale=1.0, mscale_all_dim=0.8)
HF_CASES = {
    # every kind of layer: dense and full, sparse and shared, sparse and full, dense and shared
    "mixed": (
        "HYV4ForCausalLM",
        "HYV4Config",
        dict(
            SMALL,
            **MLA,
            **INDEXER,
            **MOE,
            **HC,
            mlp_layer_types=["dense", "sparse", "sparse", "dense"],
            indexer_types=["full", "shared", "full", "shared"],
            rope_parameters=dict(rope_type="default", rope_theta=500.0),
        ),
    ),
    # the default layout of 6 layers (one dense, then MoE; full at 0, 1, 5), YaRN, expert groups
    "default-yarn-groups": (
        "HYV4ForCausalLM",
        "HYV4Config",
        dict(SMALL, **MLA, **INDEXER, **MOE, **HC, num_hidden_layers=6, n_group=4, topk_group=2, rope_parameters=YARN),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=EAGER,
        only=(
            "test_from_hf_gives_hf_logits",
            "test_hf_to_archlab_to_hf_and_back",
            "test_greedy_generation_matches_hf_generate",
            "test_padded_batch_generation_matches_hf_generate",
            "test_save_pretrained_directories_round_trip",
            "test_correction_bias_changes_the_experts_chosen",
        ),
    )
)


def test_from_hf_reads_the_layout():
    cfg = from_hf(hf_model("default-yarn-groups")).cfg
    a, s = cfg.attention, cfg.stream
    assert (a.kind, a.index_rope_at, a.index_norm_eps, a.gate, a.sinks) == ("dsa", "last", 1e-5, "elementwise", True)
    assert (s.kind, s.n, s.mix, s.post_scale, s.post_eps) == ("mhc", 3, "none", 1.5, True)
    assert (cfg.mlp.swiglu_limit, cfg.mlp.shared_swiglu_limit, cfg.position.pairing) == (1.0, 0.0, "half")
    lcs = layer_configs(cfg)
    assert [lc.attention.index_shared for lc in lcs] == [False, False, True, True, True, False]
    assert [lc.mlp.kind for lc in lcs] == ["swiglu"] + ["moe"] * 5
    assert lcs[0].mlp.swiglu_limit is None


@pytest.mark.parametrize(
    "fields, what",
    [
        (dict(kinds__shared__attention__index_shared=False), "the shared layers' narrowing"),
        (dict(mlp__swiglu_limit=None), "the routed experts' clamp"),
        (dict(attention__sinks=False), "the sinks"),
        (dict(attention__index_topk=12), "the indexer's choice"),
    ],
)
def test_each_part_moves_the_logits(fields, what):
    """The parity above compared each part: the same weights without it give other logits."""
    model = from_hf(hf_model("mixed")).eval()
    if "kinds__shared__attention__index_shared" in fields:  # the shared layers see every key instead
        other = copy.deepcopy(model)
        for block in other.blocks[1::2]:
            vars(block.attn)["choice_source"] = SharedChoice()
        with torch.no_grad():
            assert parity.max_diff(parity.logits(model), parity.logits(other)) > 1e-3, what
        return
    if "attention__sinks" in fields:
        state = {k: v for k, v in model.state_dict().items() if not k.endswith("attn.sinks")}
        other = build_model(parity.changed_cfg(model.cfg, **fields)).eval()
        other.load_state_dict(state)
        with torch.no_grad():
            assert parity.max_diff(parity.logits(model), parity.logits(other)) > 1e-3, what
        return
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, **fields), what)


def test_the_count_is_transformers_on_the_default_config():
    """The default HYV4Config (34 layers, d 2816, 256 experts): the closed form = the meta build =
    transformers' own count (its multi-token prediction layers it never builds)."""
    config = transformers.HYV4Config()
    cfg = config_from_hf(config)
    with torch.device("meta"):
        hf = transformers.HYV4ForCausalLM(config)
    theirs = sum(p.numel() for p in hf.parameters())
    ours = count_params(cfg)["total"]
    meta = sum(p.numel() for p in build_model(cfg, device="meta").parameters())
    assert ours == meta == theirs


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(layer_types=["sliding_attention"] * 4), "HYV4Config.layer_types"),
        (dict(indexer_types=["shared", "full", "full", "full"]), "HYV4Config.indexer_types"),
        (dict(swiglu_limit=0.0), "HYV4Config.swiglu_limit"),
        (dict(attention_bias=True), "HYV4Config.attention_bias"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mixed", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(stream__mix="sinkhorn"), "model.stream.mix"),
        (dict(stream__post_eps=False), "model.stream.post_eps"),
        (dict(attention__index_rope_at="first"), "model.attention.index_rope_at"),
        (dict(attention__index_norm_eps=1e-6), "model.attention.index_norm_eps"),
        (dict(attention__gate="head"), "model.attention.gate"),
        (dict(mlp__shared_swiglu_limit=None), "model.mlp.shared_swiglu_limit"),
        (dict(kinds__shared__attention__index_topk=8), "model.layers.kinds.shared.attention.index_topk"),
    ],
)
def test_the_record_refuses_what_the_family_cannot_hold(fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model("mixed")).cfg, **fields)
    parity.check_family_refuses("hy_v4", cfg, field)


def test_config_to_hf_writes_the_per_layer_lists():
    c = config_to_hf(from_hf(hf_model("mixed")).cfg)
    assert c.mlp_layer_types == ["dense", "sparse", "sparse", "dense"]
    assert c.indexer_types == ["full", "shared", "full", "shared"]
    assert (c.hc_mult, c.hc_magnitude, c.swiglu_limit) == (3, 1.5, 1.0)
