"""Hugging Face parity of GraniteMoeHybrid (GraniteMoeHybridForCausalLM, Granite 4.0's hybrids): tiny random
models with Mamba-2 and attention layers under Granite's four multipliers (every parameter redrawn: biases,
norm scales, A_log, dt_bias, D and the convolution's bias 0.5 + N(0, 0.3²)) give the same float32 logits in
archlab and in transformers' torch path: NoPE with a MoE beside a shared MLP, RoPE, and the shared MLP alone
(``num_local_experts`` 0) with every bias and a tied head; greedy and left-padded decoding equal HF
``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a save_pretrained directory
(experts saved as ``input_linear``, ``output_linear``, ``router.layer``) reads back. With
``mamba_proj_bias`` HF's padded rows differ from each prompt alone, as Bamba's (tests/interop/test_bamba.py)."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, NO_TOKENS, TOL, V, logits, max_diff

from archlab import ConfigError, build_model
from archlab.config.layers import layer_kind
from archlab.generate import generate
from archlab.interop.hf import FAMILIES, config_from_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 3 layers, attention at 1 (4 heads of 16, 2 KV heads); Mamba-2: 8 heads of 16, 2 groups of B and C of 8, conv 4,
# chunks of 5; 4 experts of 16 (top 2) beside a shared MLP of 32; Granite's multipliers away from 1
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=16, shared_intermediate_size=32, num_hidden_layers=3)
SMALL |= dict(num_attention_heads=4, num_key_value_heads=2, layer_types=["mamba", "attention", "mamba"])
SMALL |= dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=5)
SMALL |= dict(max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=2.0)
SMALL |= dict(residual_multiplier=0.5, attention_multiplier=0.125, logits_scaling=0.5, **NO_TOKENS)
HF_CASES = {
    "moe-nope": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", SMALL),
    "moe-rope": (
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridConfig",
        dict(SMALL, position_embedding_type="rope", rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
    ),
    "dense-biases-tied": (
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridConfig",
        dict(SMALL, num_local_experts=0, mamba_proj_bias=True, attention_bias=True, mamba_conv_bias=False)
        | dict(tie_word_embeddings=True, layer_types=["attention", "mamba", "mamba", "attention"], num_hidden_layers=4),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back_bit_for_bit(case):
    """The logits (measured: 2.9e-6 to 3.3e-6, logits up to 10), the family the layout read maps back to, and HF -> archlab
    -> HF -> archlab with the same config and every tensor bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "granitemoehybrid"
    parity.check_back_and_again(hf, model, **EAGER)


def test_from_hf_reads_the_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    nope = cfgs["moe-nope"]
    assert [layer_kind(nope, i) for i in range(3)] == ["mamba2", "attention", "mamba2"]
    assert "scale" not in nope.layers.kinds["mamba2"]["attention"]  # mamba2 has no scores to scale
    assert (nope.position.kind, nope.attention.scale, nope.embedding_multiplier) == ("none", 0.125, 2.0)
    assert (nope.block.residual_multiplier, nope.head.logit_scale) == (0.5, 2.0)
    m = nope.mlp
    assert (m.kind, m.expert, m.routing.n_experts, m.routing.top_k, m.expert_d_ff, m.n_shared_experts) == (
        "moe",
        "swiglu",
        4,
        2,
        16,
        2,
    )
    assert (m.routing.scoring, m.routing.normalize_top_k) == ("softmax", True)
    rope = cfgs["moe-rope"].position
    assert (rope.kind, rope.theta, rope.rotary_fraction, rope.pairing) == ("rope", 500.0, None, "half")
    dense = cfgs["dense-biases-tied"]
    assert (dense.mlp.kind, dense.mlp.d_ff, dense.head.tied, dense.attention.qkv_bias) == ("swiglu", 32, True, True)
    assert dense.layers.kinds["mamba2"]["attention"]["qkv_bias"] is True


@pytest.mark.parametrize("case", ["moe-rope", "dense-biases-tied"])
def test_greedy_generation_equals_hf(case):
    parity.check_greedy_generation(hf_model(case))


def test_left_padded_generation_equals_hf():
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, without Mamba projection biases."""
    parity.check_padded_generation(hf_model("moe-rope"))


def test_left_padding_with_projection_biases_computes_each_prompt_as_alone():
    """With ``mamba_proj_bias`` HF's padded row differs from the prompt alone (its zeroed inputs still carry
    in_proj's bias into the convolution); archlab's padded row gives the prompt's logits alone."""
    hf = hf_model("dense-biases-tied")
    model = from_hf(hf)
    short = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(7))
    batch = torch.cat((torch.cat((torch.zeros(1, 4, dtype=torch.long), short), 1), long))
    mask = torch.tensor([[0] * 4 + [1] * 3, [1] * 7])
    alone = generate(model, short, 8)
    assert torch.equal(generate(model, batch, 8, attention_mask=mask)[0, 4:], alone[0])
    with torch.no_grad():
        assert max_diff(hf(batch, attention_mask=mask).logits[0, 4:], hf(short).logits[0]) > 1e-3
        assert max_diff(model(batch, attention_mask=mask)[0, 4:], hf(short).logits[0]) <= TOL


def test_an_archlab_layout_converts_to_hf_and_back(tmp_path):
    """An archlab model read from the MoE case, its weights redrawn, to GraniteMoeHybridForCausalLM with the
    same logits and back bit for bit; a save_pretrained directory (experts under the checkpoint names) read by
    load_hf_dir and written back."""
    model = parity.randomize(build_model(from_hf(hf_model("moe-rope")).cfg), 2)
    hf, back = parity.check_to_hf_and_back(
        model, "GraniteMoeHybridForCausalLM", attn_implementation="eager", experts_implementation="eager"
    )
    assert (hf.config.layer_types, hf.config.position_embedding_type) == (
        ["linear_attention", "full_attention", "linear_attention"],
        "rope",
    )
    assert back.cfg == model.cfg
    parity.check_directory_round_trip(hf, tmp_path, attn_implementation="eager", experts_implementation="eager")


def layout(**overrides):
    cfg = from_hf(hf_model("moe-nope")).cfg
    return parity.changed_cfg(cfg, **overrides)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
        (dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
        (dict(mlp__expert="geglu"), "model.mlp.expert"),
        (dict(attention__out_bias=True), "model.attention.out_bias"),
        (dict(kinds__mamba2__attention__dt_min=0.01), "model.layers.kinds.mamba2.attention.dt_min"),
        (dict(kinds__attention__attention__window=4), "model.layers.kinds.attention.attention.window"),
    ],
)
def test_the_record_refuses_what_granitemoehybrid_does_not_hold(overrides, field):
    assert field in {p.field for p in FAMILIES["granitemoehybrid"].problems(layout(**overrides))}


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "GraniteMoeHybridConfig.hidden_act"),
        (dict(shared_intermediate_size=24), "GraniteMoeHybridConfig.shared_intermediate_size"),
        (dict(position_embedding_type="alibi"), "GraniteMoeHybridConfig.position_embedding_type"),
        (dict(logits_scaling=-1.0), "GraniteMoeHybridConfig.logits_scaling"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(transformers.GraniteMoeHybridConfig(**{**SMALL, **changes}))
    assert err.value.field == field
