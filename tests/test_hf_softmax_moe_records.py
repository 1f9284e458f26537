"""Per-family Hugging Face parity of the softmax-routed mixtures of experts in ``families.softmax_moe``:
OLMoE, FlexOlmo, GraniteMoE, GraniteMoeShared, HunYuan-MoE, ERNIE 4.5 MoE, Aria's text decoder, GraniteMoE SWA and DBRX.

One tiny random model of each (GQA, 4 experts top-2; OLMoE and ERNIE without renormalised or with
shared experts and a dense first layer, Granite with its four multipliers and attention biases, GraniteMoE SWA with a sliding RoPE layer and a global NoPE one, DBRX clamping its fused q/k/v) gives
the same float32 logits in archlab and in transformers' eager attention and experts; its layout maps
back to its family; archlab -> HF -> archlab gives back every tensor bit for bit; a save_pretrained
directory (experts saved as the family's checkpoints hold them) loads. Three families decode as HF
``generate`` does, padded batches too. Each refuses the config values it cannot hold, naming the field.
"""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, WINDOW, logits, max_diff

from archlab import ConfigError
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf, hf_family, load_hf_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
MOE = dict(SMALL, intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(MOE, num_experts=4, norm_topk_prob=False)),
    "flex_olmo": ("FlexOlmoForCausalLM", "FlexOlmoConfig", dict(MOE, num_experts=4, norm_topk_prob=True)),
    "granitemoe": (
        "GraniteMoeForCausalLM",
        "GraniteMoeConfig",
        dict(
            MOE,
            num_local_experts=4,
            attention_bias=True,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.015625,
            logits_scaling=8.0,
        ),
    ),
    "granitemoeshared": (
        "GraniteMoeSharedForCausalLM",
        "GraniteMoeSharedConfig",
        dict(MOE, num_local_experts=4, shared_intermediate_size=64, embedding_multiplier=6.0, logits_scaling=4.0),
    ),
    "hunyuan_v1_moe": (
        "HunYuanMoEV1ForCausalLM",
        "HunYuanMoEV1Config",
        dict(SMALL, intermediate_size=32, num_experts=4, moe_topk=2, head_dim=16, attention_bias=True),
    ),
    "ernie4_5_moe": (
        "Ernie4_5_MoeForCausalLM",
        "Ernie4_5_MoeConfig",
        dict(
            SMALL,
            intermediate_size=48,
            moe_intermediate_size=32,
            moe_num_experts=4,
            moe_k=2,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
        ),
    ),
    "aria_text": (
        "AriaTextForCausalLM",
        "AriaTextConfig",
        dict(SMALL, intermediate_size=32, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2, head_dim=8),
    ),
    "granitemoe_swa": (
        "GraniteMoeSWAForCausalLM",
        "GraniteMoeSWAConfig",
        dict(
            MOE,
            num_local_experts=4,
            shared_intermediate_size=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            layer_rope_theta=[10000.0, 0.0],
            residual_multiplier=0.5,
        ),
    ),
    "dbrx": (
        "DbrxForCausalLM",
        "DbrxConfig",
        dict(
            vocab_size=96,
            max_seq_len=64,
            d_model=64,
            n_layers=2,
            n_heads=4,
            attn_config=dict(kv_n_heads=2, clip_qkv=0.5, rope_theta=10000.0),
            ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2),
            **NO_TOKENS,
        ),
    ),
}
GENERATES = ("olmoe", "ernie4_5_moe", "granitemoe_swa")


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_reads_its_logits_maps_back_and_loads_its_checkpoints(case, tmp_path):
    hf = hf_model(case)
    model = from_hf(hf)
    diff = max_diff(logits(hf), logits(model))
    assert diff <= TOL, diff
    assert hf_family(model.cfg) == case
    parity.check_back_and_again(hf, model, **EAGER)
    hf.save_pretrained(tmp_path)
    loaded = load_hf_dir(tmp_path)
    assert max_diff(logits(hf), logits(loaded)) <= TOL
    if case in GENERATES:
        parity.check_greedy_generation(hf, model)
        parity.check_padded_generation(hf, model)


def test_each_record_reads_the_parts_that_set_it_apart():
    cfgs = {case: config_from_hf(hf_model(case).config) for case in HF_CASES}
    assert (cfgs["olmoe"].attention.qk_norm, cfgs["olmoe"].mlp.routing.normalize_top_k) == ("full", False)
    assert cfgs["flex_olmo"].block.kind == "post_sublayer"
    g = cfgs["granitemoe"]
    assert (g.embedding_multiplier, g.block.residual_multiplier, g.attention.scale, g.head.logit_scale) == (
        12.0,
        0.22,
        0.015625,
        0.125,
    )
    assert cfgs["granitemoeshared"].mlp.n_shared_experts == 2
    h = cfgs["hunyuan_v1_moe"]
    assert (h.attention.qk_norm_after_rope, h.mlp.n_shared_experts, h.attention.out_bias) == (True, 1, True)
    e = cfgs["ernie4_5_moe"]
    assert cfgs["aria_text"].mlp.n_shared_experts == 2
    assert (e.position.pairing, e.mlp.routing.correction_bias, e.mlp.n_shared_experts, e.layers.first) == (
        "interleaved",
        True,
        2,
        ["dense"],
    )


REFUSALS = [
    ("olmoe", dict(clip_qkv=8.0), "OlmoeConfig.clip_qkv"),
    ("hunyuan_v1_moe", dict(moe_topk=[2, 1]), "HunYuanMoEV1Config.moe_topk"),
    ("granitemoeshared", dict(shared_intermediate_size=48), "GraniteMoeSharedConfig.shared_intermediate_size"),
    ("ernie4_5_moe", dict(use_bias=True), "Ernie4_5_MoeConfig.use_bias"),
    ("ernie4_5_moe", dict(moe_layer_interval=2), "Ernie4_5_MoeConfig.moe_layer_interval"),
    ("aria_text", dict(hidden_act="gelu"), "AriaTextConfig.hidden_act"),
    (
        "dbrx",
        dict(ffn_config=dict(moe_normalize_expert_weights=2.0)),
        "DbrxConfig.ffn_config.moe_normalize_expert_weights",
    ),
]


@pytest.mark.parametrize(("case", "keys", "field"), REFUSALS)
def test_from_hf_refuses_what_a_record_cannot_hold(case, keys, field):
    _, config_class, base = HF_CASES[case]
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_from_hf(getattr(transformers, config_class)(**{**base, **keys}))


@pytest.mark.parametrize(
    ("case", "field", "value"),
    [
        ("olmoe", "attention.qk_norm", "head"),
        ("flex_olmo", "block.kind", "pre"),
        ("granitemoe", "mlp.routing.normalize_top_k", False),
        ("hunyuan_v1_moe", "mlp.n_shared_experts", 2),
        ("ernie4_5_moe", "mlp.routing.correction_bias", False),
        ("aria_text", "mlp.n_shared_experts", 0),
        ("dbrx", "norm.bias", True),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(case, field, value):
    cfg = config_from_hf(hf_model(case).config)
    *path, name = field.split(".")
    section = cfg
    for part in path:
        section = getattr(section, part)
    setattr(section, name, value)
    assert f"model.{field}" in [p.field for p in FAMILIES[case].problems(cfg)]
