"""Hugging Face parity of Kimi-Linear (archlab/interop/families/kimi_linear.py, ``KimiLinearForCausalLM``,
transformers 5.24): Kimi Delta Attention layers beside multi-head latent attention without positions, over
DeepSeek-V3's MoE (sigmoid scores, correction bias, expert groups, shared experts) or dense layers.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), A_log too; vectors, dt_bias and the norm
scales among them, 0.5 + N(0, 0.3²); the correction bias N(0, 0.3²), which moves the experts chosen:
checked) give HF eager's float32 logits (KDA through its torch fallback, one chunk of 64) in archlab; the
layout maps back to the family; archlab -> HF -> archlab is bit-identical; greedy and left-padded batched
generation equal HF ``generate`` (its KDA layers zero the padded inputs, which from a zero state leaves the
state zero, as archlab's padding does); a save_pretrained directory loads; what the record cannot hold is
refused both ways, naming the field."""

import pytest
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
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    intermediate_size=96,
    moe_intermediate_size=16,
    linear_num_heads=2,
    linear_head_dim=16,
    linear_conv_kernel_dim=4,
)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # KDA, MLA, KDA, MLA; layer 0 dense; queries direct; 8 experts in 4 groups, 2 groups and 3 experts picked
    "mixed-groups": (
        "KimiLinearForCausalLM",
        "KimiLinearConfig",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_types=[LINEAR, FULL, LINEAR, FULL],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            q_lora_rank=None,
            num_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
        ),
    ),
    # MLA first, then two KDA layers, the middle one dense (not a first layer); low-rank queries, weights as
    # scored, two shared experts' width, eps 1e-6 (the latent norms' own); tie_word_embeddings, which the class
    # ignores (it ties nothing): read as an untied head
    "lora-dense-middle": (
        "KimiLinearForCausalLM",
        "KimiLinearConfig",
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
            rms_norm_eps=1e-6,
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
    """layer_types and mlp_layer_types become kinds: kda / attention, _dense where the layer is dense, in the
    shortest first + pattern; the model's own attention is mla without positions; no field is set that its
    part does not read."""
    cfg = from_hf(hf_model("mixed-groups")).cfg
    assert ignored(cfg) == []
    assert (cfg.layers.first, cfg.layers.pattern) == (["kda_dense"], ["attention", "kda"])
    assert cfg.layers.kinds["kda"]["attention"] == {"kind": "kda", "n_head": 2, "head_dim": 16, "conv_kernel": 4}
    assert cfg.layers.kinds["kda_dense"]["mlp"] == {"kind": "swiglu"}
    assert (cfg.attention.kind, cfg.position.kind, cfg.attention.q_lora_rank) == ("mla", "none", None)
    r = cfg.mlp.routing
    assert (r.scoring, r.correction_bias, r.n_groups, r.top_groups, r.routed_scale) == ("sigmoid", True, 4, 2, 2.5)
    middle = from_hf(hf_model("lora-dense-middle")).cfg
    assert [lc.mlp.kind for lc in layer_configs(middle)] == ["moe", "swiglu", "moe"]
    assert [lc.attention.kind for lc in layer_configs(middle)] == ["mla", "kda", "kda"]
    assert (middle.mlp.n_shared_experts, middle.attention.latent_norm_eps, middle.head.tied) == (2, None, False)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "KimiLinearConfig.hidden_act"),
        (dict(attention_bias=True), "KimiLinearConfig.attention_bias"),
        (dict(num_key_value_heads=2), "KimiLinearConfig.num_key_value_heads"),
        (dict(n_shared_experts=0), "KimiLinearConfig.n_shared_experts"),
        (dict(layer_types=[LINEAR, FULL, "sliding_attention", FULL]), "KimiLinearConfig.layer_types"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mixed-groups", **changes)), field)


CHANGES = [
    (dict(kinds__attention__position__kind="rope"), "model.layers.kinds.attention.position.kind"),
    (dict(head__tied=True), "model.head.tied"),
    (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
    (dict(mlp__expert="geglu"), "model.mlp.expert"),
    (dict(kinds__kda__attention__gate_rank=4), "model.layers.kinds.kda.attention.gate_rank"),
    (dict(kinds__kda_dense__attention__decay="bounded"), "model.layers.kinds.kda_dense.attention.decay"),
    (dict(kinds__kda__attention__head_dim=8), "model.layers.kinds.kda.attention.head_dim"),
    (dict(kinds__attention__mlp__kind="gelu"), "model.layers.kinds.attention.mlp.kind"),
    (dict(kinds__kda_dense__mlp__d_ff=48), "model.layers.kinds.kda_dense.mlp.d_ff"),
]


@pytest.mark.parametrize("fields, field", CHANGES, ids=[f for _, f in CHANGES])
def test_to_hf_refuses_what_kimi_linear_cannot_hold(fields, field):
    """The layout read from HF with one field changed: the record names it (a KDA kind whose sizes differ
    from the first KDA layer's; an MLA layer's MLP other than the MoE; a dense layer other than the
    experts' kind of d_ff), and to_hf refuses the model."""
    cfg = changed_cfg(from_hf(hf_model("mixed-groups")).cfg, **fields)
    assert field in [p.field for p in FAMILIES["kimi_linear"].problems(cfg)]
    with pytest.raises(ConfigError):
        to_hf(build_model(cfg, device="meta"))


def test_the_default_config_reads_as_the_preset_and_back():
    """KimiLinearConfig()'s defaults (the kimi-linear-48b-a3b preset) read into the preset exactly, and the
    preset writes back its layer types, MLP layer types and sizes."""
    default = transformers.KimiLinearConfig()
    assert config_from_hf(default) == compose_model(["model=kimi-linear-48b-a3b"])
    back = config_to_hf(compose_model(["model=kimi-linear-48b-a3b"]))
    for key in ("layer_types", "mlp_layer_types", "hidden_size", "num_experts", "routed_scaling_factor"):
        assert getattr(back, key) == getattr(default, key), key
    for key in ("linear_num_heads", "linear_head_dim", "kv_lora_rank", "qk_rope_head_dim", "q_lora_rank"):
        assert getattr(back, key) == getattr(default, key), key


SHRUNK = [
    "model=kimi-linear-48b-a3b",
    "model.n_layer=6",
    "model.d_model=64",
    "model.vocab_size=96",
    "model.context_length=64",
    "model.attention.n_head=4",
    "model.attention.kv_lora_rank=16",
    "model.attention.qk_nope_head_dim=8",
    "model.attention.qk_rope_head_dim=8",
    "model.attention.v_head_dim=12",
    "model.mlp.d_ff=96",
    "model.mlp.expert_d_ff=16",
    "model.mlp.routing.n_experts=6",
    "model.mlp.routing.top_k=2",
    *(
        f"model.layers.kinds.{k}.attention.{n}={v}"
        for k in ("kda", "kda_dense")
        for n, v in (("n_head", 2), ("head_dim", 16))
    ),
]


def test_the_preset_converts_to_hf_and_back():
    """The preset shrunk to 6 layers (KDA with the dense MLP, three KDA, one MLA, one KDA) gives HF's logits
    and comes back with every tensor bit for bit and the same config."""
    model = randomize(build_model(compose_model(SHRUNK)), seed=3)
    hf, back = parity.check_to_hf_and_back(model, "KimiLinearForCausalLM", lambda hf: hf, **EAGER)
    assert hf.config.layer_types == [LINEAR] * 4 + [FULL, LINEAR]
    assert hf.config.mlp_layer_types == ["dense"] + ["sparse"] * 5
    assert back.cfg == model.cfg
