"""Hugging Face parity of Nemotron-H's dense layouts (NemotronHForCausalLM): tiny random models whose layers
are Mamba-2, NoPE GQA attention and ReLU² MLP layers, a mixer followed by an MLP or by another mixer (every
parameter redrawn: biases, norm scales, A_log, dt_bias, D and the convolution's bias 0.5 + N(0, 0.3²)), give
the same float32 logits in archlab (a mixer and the MLP after it one block) and in transformers' torch path;
greedy and left-padded decoding equal HF ``generate``; archlab -> HF -> archlab gives back every tensor bit
for bit; a save_pretrained directory (``backbone.`` names) reads back. With ``use_bias`` HF's padded rows
differ from each prompt alone, as Bamba's (tests/test_hf_bamba.py); ``moe`` layers and an MLP layer after no
mixer are refused."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, V, logits, max_diff

from archlab import ConfigError, build_model
from archlab.config.layers import layer_kind
from archlab.generate import generate
from archlab.interop.hf import FAMILIES, config_from_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 7 HF layers, 4 archlab blocks: Mamba-2 + MLP, attention + MLP, Mamba-2 alone, Mamba-2 + MLP; attention 4 heads
# of 16, 2 KV heads; Mamba-2 8 heads of 16, 2 groups of B and C of 8, conv 4, chunks of 5; ReLU² MLPs of 96
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
SMALL |= dict(layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba", "mamba", "mlp"], head_dim=16)
SMALL |= dict(mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4, chunk_size=5)
SMALL |= dict(max_position_embeddings=64, mlp_bias=True, **NO_TOKENS)
HF_CASES = {
    "nemotron-h": ("NemotronHForCausalLM", "NemotronHConfig", SMALL),
    "nemotron-h-biases": (
        "NemotronHForCausalLM",
        "NemotronHConfig",
        dict(SMALL, use_bias=True, use_conv_bias=False, layers_block_type=["attention", "mamba", "mlp", "attention"])
        | dict(time_step_min=0.01, time_step_max=0.2, time_step_floor=0.001),
    ),
}
KINDS = ["mamba2", "attention", "mamba2_alone", "mamba2"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back_bit_for_bit(case):
    """The logits (measured: 1.4e-6 to 1.7e-6), the family the layout read maps back to, and HF -> archlab ->
    HF -> archlab with the same config and every tensor bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "nemotron_h"
    parity.check_back_and_again(hf, model, **ATTN)


def test_from_hf_reads_the_parts():
    cfg = from_hf(hf_model("nemotron-h")).cfg
    assert cfg.n_layer == 4 and [layer_kind(cfg, i) for i in range(4)] == KINDS
    assert cfg.layers.kinds["mamba2_alone"]["mlp"] == {"kind": "none"}
    assert (cfg.position.kind, cfg.attention.head_dim, cfg.attention.n_kv_head) == ("none", 16, 2)
    assert (cfg.mlp.kind, cfg.mlp.d_ff, cfg.mlp.bias, cfg.head.tied) == ("relu2", 96, True, False)
    mamba = from_hf(hf_model("nemotron-h-biases")).cfg.layers.kinds["mamba2"]["attention"]
    assert (mamba["dt_min"], mamba["dt_limit_min"], mamba["dt_max"], mamba["dt_init_floor"]) == (0.01, 0.01, 0.2, 0.001)
    assert (mamba["qkv_bias"], mamba["conv_bias"]) == (True, False)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_generation_equals_hf(case):
    parity.check_greedy_generation(hf_model(case))


def test_left_padded_generation_equals_hf():
    parity.check_padded_generation(hf_model("nemotron-h"))


def test_left_padding_with_projection_biases_computes_each_prompt_as_alone():
    """With ``use_bias`` HF's padded row differs from the prompt alone; archlab's gives its logits alone."""
    hf = hf_model("nemotron-h-biases")
    model = from_hf(hf)
    short = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(7))
    batch = torch.cat((torch.cat((torch.zeros(1, 4, dtype=torch.long), short), 1), long))
    mask = torch.tensor([[0] * 4 + [1] * 3, [1] * 7])
    assert torch.equal(generate(model, batch, 8, attention_mask=mask)[0, 4:], generate(model, short, 8)[0])
    with torch.no_grad():
        assert max_diff(hf(batch, attention_mask=mask).logits[0, 4:], hf(short).logits[0]) > 1e-3
        assert max_diff(model(batch, attention_mask=mask)[0, 4:], hf(short).logits[0]) <= TOL


def test_an_archlab_layout_converts_to_hf_and_back(tmp_path):
    """An archlab model of the first case's layout, its weights redrawn, to NemotronHForCausalLM (the seven
    layers back) with the same logits and back bit for bit; a save_pretrained directory round trip."""
    model = parity.randomize(build_model(from_hf(hf_model("nemotron-h")).cfg), 2)
    hf, back = parity.check_to_hf_and_back(model, "NemotronHForCausalLM", attn_implementation="eager")
    assert hf.config.layers_block_type == [
        "linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "linear_attention", "mlp",
    ]  # fmt: skip
    assert back.cfg == model.cfg
    parity.check_directory_round_trip(hf, tmp_path, attn_implementation="eager")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(kinds__mamba2__attention__dt_limit_min=0.0), "model.layers.kinds.mamba2.attention.dt_limit_min"),
        # the first Mamba-2 layer's sizes are the reference: the other kind is named
        (dict(kinds__mamba2__attention__state_size=4), "model.layers.kinds.mamba2_alone.attention.state_size"),
        (dict(kinds__mamba2__mlp__d_ff=32), "model.layers.kinds.mamba2.mlp.d_ff"),
        (dict(attention__qkv_bias=True), "model.attention.qkv_bias"),
        (dict(head__tied=True), "model.head.tied"),
    ],
)
def test_the_record_refuses_what_nemotron_h_does_not_hold(overrides, field):
    cfg = parity.changed_cfg(from_hf(hf_model("nemotron-h")).cfg, **overrides)
    assert field in {p.field for p in FAMILIES["nemotron_h"].problems(cfg)}


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(layers_block_type=["mamba", "moe"]), "NemotronHConfig.layers_block_type"),
        (dict(layers_block_type=["mlp", "mamba"]), "NemotronHConfig.layers_block_type"),
        (dict(layers_block_type=["mamba", "mlp", "mlp"]), "NemotronHConfig.layers_block_type"),
        (dict(mlp_hidden_act="silu"), "NemotronHConfig.mlp_hidden_act"),
        (dict(sliding_window=4), "NemotronHConfig.sliding_window"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(transformers.NemotronHConfig(**{**SMALL, **changes}))
    assert err.value.field == field
