"""Hugging Face parity of the Bailing (Ling) hybrid (archlab/interop/families/bailing_hybrid.py,
``BailingHybridForCausalLM``, transformers 5.24): KDA layers with full-size gates beside multi-head latent
attention with interleaved RoPE and a sigmoid gate per head, over DeepSeek-V3's MoE or dense layers.

Tiny random models (every parameter and buffer redrawn: matrices N(0, 0.2²); vectors, A_log, dt_bias and
the norm scales among them, 0.5 + N(0, 0.3²); the correction bias, which moves the experts chosen: checked)
give HF eager's float32 logits (KDA through its torch fallback) in archlab; the layout maps back to the
family; archlab -> HF -> archlab is bit-identical; greedy and left-padded batched generation equal HF
``generate``; a save_pretrained directory loads; a checkpoint's MTP layers and Ling's own tensor names are
read; what the record cannot hold is refused both ways, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, changed_cfg, randomize

from archlab import ConfigError, build_model, compose_model
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, to_hf
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LINEAR, FULL = "linear_attention", "full_attention"
BASE = dict(
    HF_SIZES,
    **NO_TOKENS,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    intermediate_size=96,
    moe_intermediate_size=16,
    short_conv_kernel_size=4,
)
YARN = dict(rope_type="yarn", rope_theta=10_000.0, factor=4.0, original_max_position_embeddings=16)
YARN |= dict(beta_fast=8.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # layer_group_size 2 (KDA, MLA, KDA, MLA), the first layer dense (first_k_dense_replace); queries direct;
    # 8 experts in 4 groups, 2 groups and 3 experts picked; the bounded decay above -3; RoPE base 10^4
    "groups": (
        "BailingHybridForCausalLM",
        "BailingHybridConfig",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_group_size=2,
            first_k_dense_replace=1,
            q_lora_rank=None,
            num_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            kda_lower_bound=-3.0,
            rope_theta=10_000.0,
        ),
    ),
    # layer types written out: MLA first, the middle KDA layer dense; low-rank queries, weights as scored,
    # two shared experts' width, Kimi's softplus decay (kda_safe_gate false), rms_norm_eps 1e-5 (the latent
    # norms keep 1e-6); DeepSeek's YaRN (factor 4 over 16 positions, mscale_all_dim scaling the softmax);
    # tie_word_embeddings, which the class ignores: read as an untied head
    "lora-softplus": (
        "BailingHybridForCausalLM",
        "BailingHybridConfig",
        dict(
            BASE,
            num_hidden_layers=3,
            layer_types=[FULL, LINEAR, LINEAR],
            mlp_layer_types=["sparse", "dense", "sparse"],
            q_lora_rank=24,
            num_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=2,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            kda_safe_gate=False,
            rms_norm_eps=1e-5,
            rope_parameters=YARN,
            tie_word_embeddings=True,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model, HF_CASES, impl=EAGER, only=(*parity.ROUTED_MOE_TESTS, "test_from_hf_gives_hf_logits_and_back")
    )
)


def test_the_layer_kinds_read_from_the_config():
    """layer_group_size and first_k_dense_replace become kinds kda / attention (_dense where dense) in the
    shortest first + pattern; KDA at gate rank 0 with the bounded decay; gated mla with interleaved RoPE;
    no field set that its part does not read; written back as both lists, the group size and dense count."""
    cfg = from_hf(hf_model("groups")).cfg
    assert ignored(cfg) == []
    assert (cfg.layers.first, cfg.layers.pattern) == (["kda_dense"], ["attention", "kda"])
    kda = {"kind": "kda", "n_head": 4, "head_dim": 16, "conv_kernel": 4, "gate_rank": 0, "decay": "bounded"}
    assert cfg.layers.kinds["kda"]["attention"] == kda | {"decay_lower_bound": -3.0}
    assert (cfg.attention.kind, cfg.attention.gate, cfg.attention.q_lora_rank) == ("mla", "head", None)
    assert (cfg.position.kind, cfg.position.pairing, cfg.position.theta) == ("rope", "interleaved", 10_000.0)
    r = cfg.mlp.routing
    assert (r.scoring, r.correction_bias, r.n_groups, r.top_groups, r.routed_scale) == ("sigmoid", True, 4, 2, 2.5)
    back = to_hf(build_model(cfg, device="meta")).config
    assert (back.layer_group_size, back.first_k_dense_replace, back.num_mtp_layers) == (2, 1, 0)
    assert back.layer_types == [LINEAR, FULL] * 2 and back.mlp_layer_types == ["dense"] + ["sparse"] * 3
    other = from_hf(hf_model("lora-softplus")).cfg
    assert [lc.attention.kind for lc in layer_configs(other)] == ["mla", "kda", "kda"]
    assert [lc.mlp.kind for lc in layer_configs(other)] == ["moe", "swiglu", "moe"]
    assert layer_configs(other)[1].attention.decay == "softplus"
    assert (other.attention.latent_norm_eps, other.head.tied) == (1e-6, False)
    assert (other.position.scaling.kind, other.position.scaling.factor) == ("yarn", 4.0)


def test_checkpoints_mtp_layers_and_ling_names_are_read():
    """A checkpoint as the Hub's Ling models save it (word_embeddings, attention, dense, f_proj and the
    forget gate's tensors on the attention, expert_bias, q/k/v convolutions apart, one tensor per expert)
    with an MTP layer after the decoder: read as the HF model's own tensors, the MTP layer dropped."""
    hf = hf_model("groups")
    cfg = from_hf(hf).cfg
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    saved: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k.endswith("conv1d.weight"):
            for name, part in zip("qkv", v.chunk(3)):
                saved[k.replace("conv1d", f"{name}_conv1d")] = part
            continue
        if k.endswith("experts.gate_up_proj"):
            for e, (gate, up) in enumerate(zip(*v.chunk(2, dim=1))):
                saved[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                saved[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
            continue
        if k.endswith("experts.down_proj"):
            for e, down in enumerate(v):
                saved[k.replace("down_proj", f"{e}.down_proj.weight")] = down
            continue
        k = k.replace("forget_gate.", "").replace("e_score_correction_bias", "expert_bias")
        k = k.replace("model.embed_tokens.", "model.word_embeddings.").replace(".o_proj.", ".dense.")
        saved[k.replace(".self_attn.", ".attention.")] = v
    saved["model.layers.4.attention.q_proj.weight"] = torch.zeros(3)  # the MTP layer: dropped
    read = FAMILIES["bailing_hybrid"].from_checkpoint(cfg, saved)
    assert read.keys() == state.keys()
    assert all(torch.equal(read[k], state[k]) for k in state)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "BailingHybridConfig.hidden_act"),
        (dict(attention_bias=True), "BailingHybridConfig.attention_bias"),
        (dict(num_key_value_heads=2), "BailingHybridConfig.num_key_value_heads"),
        (dict(n_shared_experts=0), "BailingHybridConfig.n_shared_experts"),
        (dict(layer_types=[LINEAR, FULL, "sliding_attention", FULL]), "BailingHybridConfig.layer_types"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "groups", **changes)), field)


CHANGES = [
    (dict(attention__gate="none"), "model.attention.gate"),
    (dict(attention__gate="elementwise"), "model.attention.gate"),
    (dict(position__pairing="half"), "model.position.pairing"),
    (dict(attention__n_head=2), "model.attention.n_head"),
    (dict(head__tied=True), "model.head.tied"),
    (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
    (dict(kinds__kda__attention__gate_rank=4), "model.layers.kinds.kda.attention.gate_rank"),
    (dict(kinds__kda__attention__decay="softplus"), "model.layers.kinds.kda.attention.decay"),
    (dict(kinds__kda_dense__attention__decay_lower_bound=-2.0), "model.layers.kinds.kda.attention.decay_lower_bound"),
    (dict(kinds__attention__mlp__kind="gelu"), "model.layers.kinds.attention.mlp.kind"),
]


@pytest.mark.parametrize("fields, field", CHANGES, ids=[f"{f}={list(c.values())[0]}" for c, f in CHANGES])
def test_to_hf_refuses_what_bailing_cannot_hold(fields, field):
    """The layout read from HF with one field changed: the record names it (the MLA layers' gate and
    pairing; KDA heads other than the MLA layers'; a KDA kind whose gates or decay differ from the first
    KDA layer's), and to_hf refuses the model."""
    cfg = changed_cfg(from_hf(hf_model("groups")).cfg, **fields)
    assert field in [p.field for p in FAMILIES["bailing_hybrid"].problems(cfg)]
    with pytest.raises(ConfigError):
        to_hf(build_model(cfg, device="meta"))


def test_the_default_config_reads_as_the_preset_and_back():
    """BailingHybridConfig()'s defaults (the ling-3.0-flash preset) read into the preset exactly, and the
    preset writes back their layer types, MLP layer types, group size, dense count and sizes."""
    default = transformers.BailingHybridConfig()
    assert config_from_hf(default) == compose_model(["model=ling-3.0-flash"])
    back = config_to_hf(compose_model(["model=ling-3.0-flash"]))
    keys = ["layer_types", "mlp_layer_types", "layer_group_size", "first_k_dense_replace", "hidden_size"]
    keys += ["num_experts", "n_group", "topk_group", "routed_scaling_factor", "rope_parameters", "kda_safe_gate"]
    keys += ["kda_lower_bound", "linear_num_heads", "linear_head_dim", "kv_lora_rank", "q_lora_rank"]
    assert {k: getattr(back, k) for k in keys} == {k: getattr(default, k) for k in keys}


def test_the_preset_shrunk_converts_to_hf_and_back():
    """The preset shrunk to 14 layers (two dense KDA, then twice KDA, KDA, KDA, MLA, KDA, KDA; 8 experts in 4 groups, 3 picked) gives HF's logits and comes
    back with every tensor bit for bit and the same config."""
    shrunk = ["model=ling-3.0-flash", "model.n_layer=14", "model.d_model=64", "model.vocab_size=96"]
    shrunk += ["model.context_length=64", "model.attention.n_head=4", "model.attention.kv_lora_rank=16"]
    shrunk += ["model.attention.qk_nope_head_dim=8", "model.attention.qk_rope_head_dim=8"]
    shrunk += ["model.attention.v_head_dim=12", "model.mlp.d_ff=96", "model.mlp.expert_d_ff=16"]
    shrunk += ["model.mlp.routing.n_experts=8", "model.mlp.routing.top_k=3", "model.mlp.routing.n_groups=4"]
    shrunk += ["model.mlp.routing.top_groups=2"]
    shrunk += [f"model.layers.kinds.{k}.attention.{n}={v}" for k in ("kda", "kda_dense") for n, v in SIZES]
    model = randomize(build_model(compose_model(shrunk)), seed=3)
    hf, back = parity.check_to_hf_and_back(model, "BailingHybridForCausalLM", lambda hf: hf, **EAGER)
    assert hf.config.layer_types == [FULL if i % 6 == 5 else LINEAR for i in range(14)]
    assert hf.config.mlp_layer_types == ["dense"] * 2 + ["sparse"] * 12
    assert (hf.config.layer_group_size, hf.config.first_k_dense_replace) == (6, 2)
    assert back.cfg == model.cfg


SIZES = (("n_head", 4), ("head_dim", 16))
