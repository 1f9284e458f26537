"""Hugging Face parity of Qwen3-Next (``Qwen3NextForCausalLM``, transformers 5.24).

Tiny random models hold both layer types: gated attention (GQA, partial RoPE, (1 + w) per-head QK-norm,
q_proj doubled into query and gate rows) and Gated DeltaNet (fewer query/key heads than value heads,
key and value heads of different sizes), a dense layer beside MoE ones with a sigmoid-gated shared
expert twice the routed width; every parameter redrawn (vectors, A_log and dt_bias among them, 0.5 ± 0.3,
so (1 + w) scales far from 0 and 1; conv1d and matrices N(0, 0.2²)). They give HF's float32 eager logits
within 1e-4; archlab -> HF -> archlab is bit-identical; greedy and left-padded batched generation equal HF
``generate`` (its linear layers zero the padded inputs, which from a zero state leaves the state zero, as
archlab's padding does); a save_pretrained directory, with a multi-token-prediction tensor as the
published checkpoints hold, reads back through load_hf_dir.
"""

from typing import Any

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, TOL, changed_cfg, logits, max_diff, randomize
from helpers.published import LAYOUT_CONFIGS
from safetensors.torch import load_file, save_file

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, to_hf
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LINEAR, FULL = "linear_attention", "full_attention"
BASE = dict(
    HF_SIZES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_parameters=dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.25),
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=8,
    shared_expert_intermediate_size=16,
    intermediate_size=24,
    hidden_act="silu",
    tie_word_embeddings=False,
)
CASES = {
    # linear, full, linear, full; layer 0 dense (mlp_only_layers); 2 query/key heads for 4 value heads
    "mixed": dict(BASE, num_hidden_layers=4, layer_types=[LINEAR, FULL, LINEAR, FULL], mlp_only_layers=[0]),
    # every other layer MoE (decoder_sparse_step 2), attention biases, weights as scored, one key head per
    # value head, the full layer first, a tied head
    "sparse-step": dict(
        BASE,
        num_hidden_layers=3,
        layer_types=[FULL, LINEAR, LINEAR],
        decoder_sparse_step=2,
        attention_bias=True,
        norm_topk_prob=False,
        linear_num_key_heads=4,
        tie_word_embeddings=True,
    ),
}


def hf_model(case: str, seed: int = 1) -> Any:
    config = transformers.Qwen3NextConfig(**CASES[case], **parity.NO_TOKENS, **EAGER)
    return randomize(transformers.Qwen3NextForCausalLM(config), seed)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf_and_convert_back_bit_for_bit(case):
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(model), logits(hf)) <= TOL
    back = parity.check_back_and_again(hf, model, **EAGER)
    assert back.config.layer_types == hf.config.layer_types
    assert back.config.mlp_only_layers == [i for i, lc in enumerate(layer_configs(model.cfg)) if lc.mlp.kind != "moe"]


def test_the_layer_kinds_read_from_the_config():
    """layer_types and mlp_only_layers become kinds: deltanet / attention, _dense where the layer is dense;
    decoder_sparse_step 2 makes layers 0 and 2 dense (HF: MoE where (i + 1) % step == 0). No field is set
    that its part does not read."""
    cfg = from_hf(hf_model("mixed")).cfg
    assert ignored(cfg) == []
    assert (cfg.layers.first, cfg.layers.pattern) == (["deltanet_dense"], ["attention", "deltanet"])
    linear = cfg.layers.kinds["deltanet"]["attention"]
    assert (linear["n_head"], linear["key_heads"], linear["key_head_dim"], linear["v_head_dim"]) == (4, 2, 8, 12)
    assert cfg.layers.kinds["deltanet_dense"]["mlp"] == {"kind": "swiglu"}
    assert (cfg.mlp.n_shared_experts, cfg.mlp.shared_expert_gate, cfg.position.rotary_fraction) == (2, True, 0.25)
    step = from_hf(hf_model("sparse-step")).cfg
    kinds = [lc.mlp.kind for lc in layer_configs(step)]
    assert kinds == ["swiglu", "moe", "swiglu"]


PARTS = [
    ("mlp__shared_expert_gate", False),  # sigmoid(shared_expert_gate) on the shared expert
    ("norm__unit_offset", False),  # (1 + w) norms, the QK-norms among them
    ("position__rotary_fraction", 1.0),  # RoPE on a quarter of each head
]


@pytest.mark.parametrize("field, value", PARTS, ids=[p[0] for p in PARTS])
def test_each_part_changes_the_logits(field, value):
    """The same weights with one part taken away give other logits: the parity above depends on each."""
    model = from_hf(hf_model("mixed"))
    cfg = changed_cfg(model.cfg, **{field: value})
    if field == "mlp__shared_expert_gate":
        state = {k: v for k, v in model.state_dict().items() if "shared_gate" not in k}
        changed = build_model(cfg, device="meta")
        changed.load_state_dict(state, assign=True)
        assert max_diff(logits(changed.eval()), logits(model)) > 1e-3
        return
    parity.check_changes_logits(model, cfg)


@pytest.mark.parametrize("case", list(CASES))
def test_generation_matches_hf_generate(case):
    """Greedy decoding, and left-padded prompts of 7, 3 and 5 tokens in one batch: the ids and every step's
    logits of HF ``generate`` (its cache holds the linear layers' conv and recurrent states)."""
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


def test_save_pretrained_directory_round_trip(tmp_path):
    """save_pretrained (each expert saved apart; a multi-token-prediction tensor added, as the published
    checkpoints hold ``mtp.*``) -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits."""

    def add_mtp(directory):
        path = directory / "model.safetensors"
        save_file({**load_file(path), "mtp.fc.weight": torch.zeros(64, 128)}, path)

    parity.check_directory_round_trip(hf_model("mixed", seed=7), tmp_path, edit=add_mtp, **EAGER)


TINY = [
    "model.n_layer=4",
    "model.d_model=64",
    "model.vocab_size=96",
    "model.context_length=64",
    "model.attention.n_head=4",
    "model.attention.head_dim=16",
    "model.mlp.routing.n_experts=6",
    "model.mlp.routing.top_k=2",
    "model.mlp.expert_d_ff=8",
    "model.mlp.d_ff=24",
    "model.layers.kinds.deltanet.attention.n_head=4",
    "model.layers.kinds.deltanet.attention.key_heads=2",
    "model.layers.kinds.deltanet.attention.key_head_dim=8",
    "model.layers.kinds.deltanet.attention.v_head_dim=12",
]


def test_the_preset_converts_to_hf_and_back():
    """The preset shrunk to 4 layers (three linear, one attention) gives HF's logits and comes back with
    every tensor bit for bit and the same config."""
    model = randomize(build_model(compose_model(["model=qwen3-next-80b-a3b", *TINY])), seed=3)
    hf, back = parity.check_to_hf_and_back(model, "Qwen3NextForCausalLM", lambda hf: hf, **EAGER)
    assert hf.config.layer_types == [LINEAR, LINEAR, LINEAR, FULL]
    assert back.cfg == model.cfg


def test_published_config_loads_as_the_preset_and_back():
    """Qwen/Qwen3-Next-80B-A3B-Instruct's config.json reads into the preset exactly and writes back its
    layer types, RoPE and sizes."""
    _, config_class, keys, _ = LAYOUT_CONFIGS["qwen3-next-80b-a3b"]
    published = getattr(transformers, config_class)(**keys)
    cfg = config_from_hf(published)
    assert cfg == compose_model(["model=qwen3-next-80b-a3b"])
    assert count_params(cfg)["total"] == 79_674_391_296
    back = config_to_hf(cfg)
    for key, value in keys.items():
        assert getattr(back, key) == value, key


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "Qwen3NextConfig.hidden_act"),
        (dict(shared_expert_intermediate_size=12), "Qwen3NextConfig.shared_expert_intermediate_size"),
        (dict(shared_expert_intermediate_size=0), "Qwen3NextConfig.shared_expert_intermediate_size"),
        (dict(rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0)), "Qwen3NextConfig.rope_parameters.rope_type"),
        (dict(linear_num_key_heads=3), "Qwen3NextConfig.linear_num_key_heads"),
        (dict(decoder_sparse_step=0), "Qwen3NextConfig.decoder_sparse_step"),
        (dict(num_experts=0), "Qwen3NextConfig.num_experts"),
        (dict(layer_types=[LINEAR, FULL, "sliding_attention", FULL]), "Qwen3NextConfig.layer_types"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    config = transformers.Qwen3NextConfig(**{**CASES["mixed"], **changes})
    with pytest.raises(ConfigError) as err:
        config_from_hf(config)
    assert err.value.field == field


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.norm.unit_offset=false"], "model.norm.unit_offset"),
        (["model.attention.gate=head"], "model.attention.gate"),
        (["model.attention.qk_norm=none"], "model.attention.qk_norm"),
        (["model.mlp.shared_expert_gate=false"], "model.mlp.shared_expert_gate"),
        (["model.mlp.routing.scoring=sigmoid"], "model.mlp.routing.scoring"),
        (["+model.layers.kinds.attention.position.theta=5.0"], "model.layers.kinds.attention.position.theta"),
        (["+model.layers.kinds.attention.mlp.routing.top_k=3"], "model.layers.kinds.attention.mlp.routing.top_k"),
        # the linear layers' own fields: β in (0, 2), a norm eps of their own, a sigmoid output gate
        (
            ["+model.layers.kinds.deltanet.attention.allow_neg_eigval=true"],
            "model.layers.kinds.deltanet.attention.allow_neg_eigval",
        ),
        (["+model.layers.kinds.deltanet.attention.norm_eps=0.001"], "model.layers.kinds.deltanet.attention.norm_eps"),
        (
            ["+model.layers.kinds.deltanet.attention.output_gate=sigmoid"],
            "model.layers.kinds.deltanet.attention.output_gate",
        ),
    ],
)
def test_to_hf_refuses_what_qwen3_next_cannot_hold(overrides, field):
    cfg = compose_model(["model=qwen3-next-80b-a3b", *TINY, *overrides])
    problems = {p.field for p in config_problems(cfg)}
    assert field in problems
    with pytest.raises(ConfigError):
        to_hf(build_model(cfg, device="meta"))


def config_problems(cfg):
    from archlab.interop.families import FAMILIES

    return FAMILIES["qwen3_next"].problems(cfg)


def test_two_linear_kinds_of_different_sizes_are_refused():
    """Qwen3-Next has one set of linear-attention sizes: a second deltanet kind whose convolution differs is
    named by its own field."""
    cfg = compose_model(["model=qwen3-next-80b-a3b", *TINY])
    cfg.layers.kinds["wide"] = {"attention": {**cfg.layers.kinds["deltanet"]["attention"], "conv_kernel": 2}}
    cfg.layers.pattern = ["deltanet", "wide", "deltanet", "attention"]
    assert [p.field for p in config_problems(cfg)] == ["model.layers.kinds.wide.attention.conv_kernel"]


def test_only_the_families_of_a_gated_shared_expert_hold_it():
    """Every other family of its mixer but Qwen3.5-MoE (the same MoE) and Qwen2-MoE (whose shared expert is
    gated alike) names model.mlp.shared_expert_gate among the fields it cannot hold (its FEATURES entry)."""
    from archlab.interop.families import FAMILIES

    cfg = compose_model(["model=qwen3-30b-a3b", "model.mlp.n_shared_experts=1", "model.mlp.shared_expert_gate=true"])
    holders = {
        n
        for n, f in FAMILIES.items()
        if not f.mixer_problems(cfg) and "model.mlp.shared_expert_gate" not in {p.field for p in f.problems(cfg)}
    }
    assert holders == {"qwen3_next", "qwen3_5_moe_text", "qwen2_moe"}  # Qwen3.5-MoE's MoE is Qwen3-Next's
    with pytest.raises(ConfigError):
        config_to_hf(cfg)
