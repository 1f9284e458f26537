"""Hugging Face parity of Qwen3.5's text decoders (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM``,
transformers 5.24).

Tiny random models hold both layer types: gated attention (GQA, partial RoPE with the multimodal sections
Qwen3.5's configs carry, (1 + w) per-head QK-norm) and Gated DeltaNet projecting q, k, v, z, b and a apart
(fewer query/key heads than value heads, key and value heads of different sizes); a dense SwiGLU in every
layer (Qwen3.5) or a MoE with a sigmoid-gated shared expert twice the routed width (Qwen3.5-MoE). Every
parameter redrawn (vectors, A_log and dt_bias among them, 0.5 ± 0.3; conv1d and matrices N(0, 0.2²)). They
give HF's float32 eager logits within 1e-4; archlab's tensors written back under the family's own names
equal HF's bit for bit, and archlab -> HF -> archlab is bit-identical (Qwen3.5-MoE exports as Qwen3-Next,
which holds the same model); greedy and left-padded batched generation equal HF ``generate``.
"""

from typing import Any

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, TOL, logits, max_diff, randomize
from safetensors.torch import load_file, save_file

from archlab import ConfigError, compose_model
from archlab.interop.families import FAMILIES
from archlab.interop.hf import archlab_state_to_hf, config_from_hf, from_hf, load_hf_dir
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LINEAR, FULL = "linear_attention", "full_attention"
BASE = dict(
    HF_SIZES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    # the published configs' multimodal sections: text positions are equal in all three, so plain RoPE
    rope_parameters=dict(
        rope_type="default",
        rope_theta=100.0,
        partial_rotary_factor=0.25,
        mrope_section=[1, 1, 0],
        mrope_interleaved=True,
    ),
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    tie_word_embeddings=False,
    num_hidden_layers=4,
    layer_types=[LINEAR, FULL, LINEAR, FULL],
)
MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=8, shared_expert_intermediate_size=16)
CASES = {
    "dense": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", dict(BASE, intermediate_size=24)),
    # attention biases, the full layer first, one key head per value head, a tied head
    "dense-bias": (
        "Qwen3_5ForCausalLM",
        "Qwen3_5TextConfig",
        dict(
            BASE,
            intermediate_size=24,
            num_hidden_layers=3,
            layer_types=[FULL, LINEAR, LINEAR],
            attention_bias=True,
            linear_num_key_heads=4,
            tie_word_embeddings=True,
        ),
    ),
    "moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", dict(BASE, **MOE)),
}


def hf_model(case: str, seed: int = 1) -> Any:
    model_class, config_class, keys = CASES[case]
    config = getattr(transformers, config_class)(**keys, **parity.NO_TOKENS, **EAGER)
    return randomize(getattr(transformers, model_class)(config), seed)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf_and_convert_back_bit_for_bit(case):
    """HF's logits; archlab's tensors under the family's names equal HF's bit for bit; archlab -> HF (the
    family's own class for Qwen3.5, Qwen3-Next's for Qwen3.5-MoE) -> archlab, the same config and tensors."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert ignored(model.cfg) == []
    assert max_diff(logits(model), logits(hf)) <= TOL
    state, reference = archlab_state_to_hf(model.cfg, model.state_dict(), hf.config.model_type), hf.state_dict()
    if hf.config.tie_word_embeddings:
        reference.pop("lm_head.weight")
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in state)
    if case == "moe":
        back = transformers.Qwen3NextForCausalLM(parity_config(model.cfg)).eval()
        back.load_state_dict(archlab_state_to_hf(model.cfg, model.state_dict()))
        assert max_diff(logits(back), logits(model)) <= TOL
        again = from_hf(back)
        assert again.cfg == model.cfg
        parity.assert_same_tensors(model, again)
    else:
        back = parity.check_back_and_again(hf, model, **EAGER)
        assert back.config.layer_types == hf.config.layer_types


def parity_config(cfg):
    from archlab.interop.hf import config_to_hf

    return config_to_hf(cfg, **EAGER)


def test_the_moe_record_writes_a_qwen3_5_moe_model():
    """Qwen3.5-MoE's own record, used directly: its config keys build a Qwen3_5MoeForCausalLM that loads
    archlab's tensors under its names and gives archlab's logits."""
    model = from_hf(hf_model("moe", seed=2))
    family = FAMILIES["qwen3_5_moe_text"]
    assert not family.problems(model.cfg)
    config = transformers.Qwen3_5MoeTextConfig(**family.to_hf(model.cfg), **parity.NO_TOKENS, **EAGER)
    hf = transformers.Qwen3_5MoeForCausalLM(config).eval()
    hf.load_state_dict(archlab_state_to_hf(model.cfg, model.state_dict(), "qwen3_5_moe_text"))
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert config_from_hf(config) == model.cfg


def test_the_layer_kinds_read_from_the_config():
    """layer_types become the kinds deltanet and attention; no dense kind (every layer has the model's MLP);
    the multimodal sections are left unread, so the RoPE is Qwen3-Next's."""
    cfg = from_hf(hf_model("dense")).cfg
    assert (cfg.layers.first, cfg.layers.pattern) == ([], ["deltanet", "attention"])
    linear = cfg.layers.kinds["deltanet"]["attention"]
    assert (linear["n_head"], linear["key_heads"], linear["key_head_dim"], linear["v_head_dim"]) == (4, 2, 8, 12)
    assert (cfg.mlp.kind, cfg.mlp.d_ff, cfg.position.rotary_fraction, cfg.position.theta) == ("swiglu", 24, 0.25, 100.0)
    moe = from_hf(hf_model("moe")).cfg
    assert (moe.mlp.kind, moe.mlp.n_shared_experts, moe.mlp.routing.normalize_top_k) == ("moe", 2, True)
    assert set(moe.layers.kinds) == {"deltanet", "attention"}


@pytest.mark.parametrize("case", ["dense", "moe"])
def test_generation_matches_hf_generate(case):
    """Greedy decoding, and left-padded prompts of 7, 3 and 5 tokens in one batch: the ids and every step's
    logits of HF ``generate`` (its linear layers zero the padded inputs, as archlab's padding does)."""
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


def as_published(directory):
    """The tensors renamed as the published checkpoints hold them (saved from the vision-language model:
    ``model.language_model.*``), with a vision-tower and a multi-token-prediction tensor beside them."""
    path = directory / "model.safetensors"
    state = {k.replace("model.", "model.language_model.", 1): v for k, v in load_file(path).items()}
    save_file({**state, "model.visual.patch_embed.weight": torch.zeros(4, 4), "mtp.fc.weight": torch.zeros(4, 4)}, path)


def test_save_pretrained_directories_read_back(tmp_path):
    """Qwen3.5: save_pretrained, renamed as published (``as_published``) -> load_hf_dir -> save_hf_dir ->
    from_pretrained, the same logits. Qwen3.5-MoE (each expert saved apart): save_pretrained -> load_hf_dir,
    the same logits."""
    parity.check_directory_round_trip(hf_model("dense", seed=7), tmp_path / "dense", None, as_published, **EAGER)
    hf = hf_model("moe", seed=7)
    hf.save_pretrained(tmp_path / "moe")
    assert max_diff(logits(load_hf_dir(tmp_path / "moe").eval()), logits(hf)) <= TOL


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("dense", dict(hidden_act="gelu"), "Qwen3_5TextConfig.hidden_act"),
        ("dense", dict(layer_types=[LINEAR, FULL, "sliding_attention", FULL]), "Qwen3_5TextConfig.layer_types"),
        ("dense", dict(linear_num_key_heads=3), "Qwen3_5TextConfig.linear_num_key_heads"),
        ("dense", dict(rope_parameters=dict(rope_type="default", rope_theta=1.0, mrope_x=1)), "Qwen3_5TextConfig.rope_parameters.mrope_x"),
        ("moe", dict(shared_expert_intermediate_size=12), "Qwen3_5MoeTextConfig.shared_expert_intermediate_size"),
        ("moe", dict(num_experts=0), "Qwen3_5MoeTextConfig.num_experts"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    _, config_class, keys = CASES[case]
    with pytest.raises(ConfigError) as err:
        config_from_hf(getattr(transformers, config_class)(**{**keys, **changes}))
    assert err.value.field == field


TINY = [
    "model=qwen3-next-80b-a3b",
    "model.n_layer=4",
    "model.d_model=64",
    "model.vocab_size=96",
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


@pytest.mark.parametrize(
    "family, overrides, field",
    [
        ("qwen3_5_text", ["model.mlp.kind=geglu"], "model.mlp.kind"),
        ("qwen3_5_text", ["model.mlp.kind=swiglu", "model.norm.unit_offset=false"], "model.norm.unit_offset"),
        ("qwen3_5_text", ["model.mlp.kind=swiglu", "+model.layers.kinds.attention.mlp.d_ff=8"], "model.layers.kinds.attention.mlp.d_ff"),
        ("qwen3_5_moe_text", ["model.mlp.routing.normalize_top_k=false"], "model.mlp.routing.normalize_top_k"),
        ("qwen3_5_moe_text", ["+model.layers.kinds.attention.mlp.kind=swiglu"], "model.layers.kinds.attention.mlp.kind"),
        ("qwen3_5_moe_text", ["model.attention.gate=head"], "model.attention.gate"),
    ],
)  # fmt: skip
def test_each_record_names_what_it_cannot_hold(family, overrides, field):
    """Qwen3.5 holds a dense SwiGLU of one width in every layer; Qwen3.5-MoE a MoE in every layer whose
    top-k weights are renormalised; both Qwen3-Next's gated attention."""
    cfg = compose_model([*TINY, *overrides])
    assert field in {p.field for p in FAMILIES[family].problems(cfg)}
