"""Hugging Face parity of DeepSeek-V4 (archlab/interop/families/deepseek_v4.py): dsv4 attention (shared-KV MQA,
sinks, the grouped output projection, a sliding window) in every layer, HCA and CSA blocks by ``layer_types``,
the compressing layers' own YaRN RoPE, mHC's streams, a hash-routed MoE layer beside top-k ones with a
correction bias, clamped SwiGLU experts and one shared expert.

Tiny random models (every parameter, correction bias and hash table redrawn; a window of 4, blocks of 4 (HCA)
and of 2 (CSA, 2 kept per query) under 12 tokens) give HF eager's float32 logits and map back to the family;
archlab -> HF -> archlab and HF -> archlab -> HF give back every tensor bit for bit; greedy generation equals HF ``generate``; a
left-padded batch generates what HF generates for each prompt alone (HF pools a padded row's blocks from its
first pad, pads pooled in: its own padded batch differs); a save_pretrained directory loads and saves again;
the closed-form count is transformers' on the default DeepseekV4Config (meta); what the record cannot hold is
refused both ways, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW, V

from archlab.accounting import count
from archlab.config.layers import layer_configs
from archlab.generate import generate
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

COMPRESS = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0}
COMPRESS |= {"beta_slow": 1.0}
HF = dict(HF_SIZES, num_hidden_layers=4, num_attention_heads=4, head_dim=16, partial_rotary_factor=0.25, **NO_TOKENS)
HF |= dict(q_lora_rank=12, o_groups=2, o_lora_rank=10, sliding_window=WINDOW, moe_intermediate_size=24)
HF |= dict(n_routed_experts=8, num_experts_per_tok=2, routed_scaling_factor=1.5, swiglu_limit=0.8)
HF |= dict(index_n_heads=8, index_head_dim=8, index_topk=2, hc_mult=2, hc_sinkhorn_iters=5)
HF |= dict(rope_theta=500.0, compress_rope_theta=2000.0, rope_parameters=COMPRESS)
HF |= dict(compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4})
HF |= dict(layer_types=["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention"] * 1)
HF["layer_types"] = [*HF["layer_types"], "compressed_sparse_attention"]
HF |= dict(mlp_layer_types=["hash_moe", "moe", "moe", "moe"])
CLASSES = ("DeepseekV4ForCausalLM", "DeepseekV4Config")
HF_CASES = {
    # a sliding layer (hash-routed), an HCA layer, two CSA layers; sqrtsoftplus scores
    "deepseek-v4": (*CLASSES, HF),
    # every layer sliding, no blocks (a padded row then computes as in transformers' padded batch)
    "deepseek-v4-sliding": (*CLASSES, dict(HF, layer_types=["sliding_attention"] * 4)),
    # sigmoid scores, every layer top-k routed, the compressing layers' RoPE unscaled
    "deepseek-v4-sigmoid": (
        *CLASSES,
        dict(HF, scoring_func="sigmoid", mlp_layer_types=["moe"] * 4, rope_parameters=None),
    ),
}


def hf_model(case: str, seed: int = 1):
    """The case's HF model, every parameter and correction bias redrawn, each hash table a random choice of
    distinct experts per token, the rotary embeddings' fixed frequencies as built."""
    hf = parity.hf_case(HF_CASES, case, seed, **EAGER)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, buffer in hf.named_buffers():
            if name.endswith("tid2eid"):
                buffer.copy_(torch.rand(V, 8, generator=g).argsort(-1)[:, : buffer.shape[1]])
    return hf


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=EAGER,
        only=(
            "test_from_hf_gives_hf_logits_and_maps_back_to_the_family",
            "test_correction_bias_changes_the_experts_chosen",
            "test_hf_to_archlab_to_hf_and_back",
            "test_greedy_generation_matches_hf_generate",
            "test_save_pretrained_directories_round_trip",
        ),
    )
)


def test_the_layers_are_read_as_their_kinds():
    cfg = config_from_hf(parity.hf_config(HF_CASES, "deepseek-v4"))
    layers = layer_configs(cfg)
    assert [lc.attention.compress for lc in layers] == ["none", "hca", "csa", "csa"]
    assert [lc.attention.compress_rate for lc in layers[1:]] == [4, 2, 2]
    assert [lc.position.theta for lc in layers] == [500.0, 2000.0, 2000.0, 2000.0]
    assert [lc.mlp.routing.selection for lc in layers] == ["hash", "scores", "scores", "scores"]
    assert cfg.layers.kinds["sliding_hash"]["mlp"]["routing"]["selection"] == "hash"
    assert cfg.attention.kind == "dsv4" and cfg.stream.kind == "mhc" and cfg.mlp.swiglu_limit == 0.8


@pytest.mark.parametrize("case", list(HF_CASES))
def test_archlab_to_hf_to_archlab_is_bit_identical(case):
    """An archlab model of the case's layout, every parameter and correction bias redrawn (its hash tables
    archlab's own draw), converts to DeepseekV4ForCausalLM with the same logits and back bit for bit."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, case))
    parity.check_exports(cfg, "DeepseekV4ForCausalLM", family="deepseek_v4", **EAGER)


def test_every_token_s_experts_and_weights_are_hf_s():
    parity.check_routed_as_hf(hf_model("deepseek-v4-sigmoid"))


def test_a_left_padded_batch_generates_each_prompt_as_hf_alone():
    """Prompts of 7, 3 and 5 tokens left-padded into one batch: archlab's greedy continuation of each row is
    HF ``generate``'s of the prompt alone (its blocks pooled at its own positions); HF's own padded batch
    pools a padded row's blocks from its first pad and continues otherwise."""
    hf = hf_model("deepseek-v4", seed=6)
    model = from_hf(hf)
    prompts = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 3, 5)]
    ids = torch.stack([torch.cat((torch.zeros(7 - len(p), dtype=torch.long), p)) for p in prompts])
    mask = torch.tensor([[0] * (7 - len(p)) + [1] * len(p) for p in prompts])
    got = generate(model, ids, max_new_tokens=12, attention_mask=mask)
    for row, p in enumerate(prompts):
        alone = hf.generate(
            p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=12, do_sample=False
        )
        assert torch.equal(got[row, 7 - len(p) :], alone[0]), row
    together = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert not torch.equal(together, got)


def test_without_blocks_a_padded_batch_generates_as_hfs():
    """Every layer sliding: prompts of 7, 3 and 5 tokens left-padded into one batch continue, and give at
    every step the logits, as HF ``generate``'s padded batch."""
    parity.check_padded_generation(hf_model("deepseek-v4-sliding", seed=6))


def test_the_count_is_transformers_on_the_default_config():
    """DeepseekV4Config's defaults (V4-Flash: 43 layers of 256 experts, the first 3 hash-routed, 2 HCA layers
    then CSA and HCA in turn): the closed form equals transformers' numel on the meta device."""
    config = transformers.DeepseekV4Config()
    cfg = config_from_hf(config)
    with torch.device("meta"):
        hf = transformers.DeepseekV4ForCausalLM(config)
    expected = sum(p.numel() for p in hf.parameters())
    assert count(cfg)["total"] == expected


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(num_key_value_heads=2), "DeepseekV4Config.num_key_value_heads"),
        (dict(hidden_act="gelu"), "DeepseekV4Config.hidden_act"),
        (dict(scoring_func="softmax"), "DeepseekV4Config.scoring_func"),
        (
            dict(
                rope_parameters={
                    "main": {"rope_type": "default", "rope_theta": 500.0},
                    "compress": {"rope_type": "linear", "factor": 2.0, "rope_theta": 2000.0},
                }
            ),
            "DeepseekV4Config.rope_parameters.compress.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    """Each key archlab cannot hold is refused naming it (the compressing layers' RoPE: its rope_type too)."""
    config = parity.hf_config(HF_CASES, "deepseek-v4")
    for key, value in changes.items():
        setattr(config, key, value)
    parity.check_refuses(lambda: config_from_hf(config), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(attention__window=None), "model.attention.window"),
        (dict(mlp__swiglu_limit=None), "model.mlp.swiglu_limit"),
        (dict(mlp__n_shared_experts=2), "model.mlp.n_shared_experts"),
        (dict(stream__kind="plain"), "model.stream.kind"),
        (dict(kinds__csa__position__theta=3000.0), "model.layers.kinds.csa.position.theta"),  # HCA's: 2000
        (dict(kinds__sliding_hash__attention__head_dim=8), "model.layers.kinds.sliding_hash.attention.head_dim"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "deepseek-v4")), **change)
    parity.check_family_refuses("deepseek_v4", cfg, field)
