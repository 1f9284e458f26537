"""Hugging Face parity of Nemotron-H (NemotronHForCausalLM): tiny random models whose layers are Mamba-2, NoPE
GQA attention and ReLU² MLP layers or MoE layers (Nemotron 3's: sigmoid top-k with a correction bias, expert
groups, a routed scale, shared experts), a mixer followed by an MLP or by another mixer (every parameter
redrawn: biases, norm scales, A_log, dt_bias, D, the convolution's bias 0.5 + N(0, 0.3²), the correction
bias N(0, 0.3²)), give
the same float32 logits in archlab (a mixer and the MLP after it one block) and in transformers' torch path;
greedy and left-padded decoding equal HF ``generate``; archlab -> HF -> archlab gives back every tensor bit
for bit; a save_pretrained directory (``backbone.`` names) reads back. With ``use_bias`` HF's padded rows
differ from each prompt alone, as Bamba's (tests/interop/test_bamba.py); an MLP layer after no mixer, and 'mlp'
beside 'moe' layers, are refused."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, NO_TOKENS, TOL, V, logits, max_diff

from archlab import ConfigError, build_model, compose_model
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
    # the same layers with MoE layers: 8 experts of 16 in 2 groups (top 1 group, top 2 experts), x2.5, shared 32
    "nemotron-h-moe": (
        "NemotronHForCausalLM",
        "NemotronHConfig",
        dict(SMALL, layers_block_type=["mamba", "moe", "attention", "moe", "mamba", "mamba", "moe"], mlp_bias=False)
        | dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_group=2, topk_group=1)
        | dict(moe_shared_expert_intermediate_size=32, routed_scaling_factor=2.5),
    ),
}
KINDS = ["mamba2", "attention", "mamba2_alone", "mamba2"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back_bit_for_bit(case):
    """The logits (measured: 1.4e-6 to 2.0e-6), the family the layout read maps back to, and HF -> archlab ->
    HF -> archlab with the same config and every tensor bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "nemotron_h"
    parity.check_back_and_again(hf, model, **EAGER)


def test_from_hf_reads_the_parts():
    cfg = from_hf(hf_model("nemotron-h")).cfg
    assert cfg.n_layer == 4 and [layer_kind(cfg, i) for i in range(4)] == KINDS
    assert cfg.layers.kinds["mamba2_alone"]["mlp"] == {"kind": "none"}
    assert (cfg.position.kind, cfg.attention.head_dim, cfg.attention.n_kv_head) == ("none", 16, 2)
    assert (cfg.mlp.kind, cfg.mlp.d_ff, cfg.mlp.bias, cfg.head.tied) == ("relu2", 96, True, False)
    mamba = from_hf(hf_model("nemotron-h-biases")).cfg.layers.kinds["mamba2"]["attention"]
    assert (mamba["dt_min"], mamba["dt_limit_min"], mamba["dt_max"], mamba["dt_init_floor"]) == (0.01, 0.01, 0.2, 0.001)
    assert (mamba["qkv_bias"], mamba["conv_bias"]) == (True, False)
    moe = from_hf(hf_model("nemotron-h-moe")).cfg
    assert [layer_kind(moe, i) for i in range(4)] == KINDS
    m = moe.mlp
    assert (m.kind, m.expert, m.routing.n_experts, m.routing.top_k, m.expert_d_ff, m.n_shared_experts) == (
        "moe",
        "relu2",
        8,
        2,
        16,
        2,
    )
    assert (
        m.routing.scoring,
        m.routing.correction_bias,
        m.routing.n_groups,
        m.routing.top_groups,
        m.routing.routed_scale,
    ) == ("sigmoid", True, 2, 1, 2.5)


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


def test_a_moe_layout_converts_to_hf_and_back(tmp_path):
    """The MoE case's layout, its weights redrawn: NemotronHForCausalLM with 'moe' layers, the same logits,
    back bit for bit; a save_pretrained directory (``backbone.``, each expert saved apart) read back."""
    model = parity.randomize(build_model(from_hf(hf_model("nemotron-h-moe")).cfg), 2)
    hf, back = parity.check_to_hf_and_back(
        model, "NemotronHForCausalLM", attn_implementation="eager", experts_implementation="eager"
    )
    assert hf.config.layers_block_type.count("moe") == 3 and back.cfg == model.cfg
    parity.check_directory_round_trip(hf, tmp_path, attn_implementation="eager", experts_implementation="eager")


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


def test_a_layer_kind_of_another_mlp_is_named_not_a_crash():
    """A layout whose layer kinds hold an MLP of another kind than the model's (Step-3.5's SwiGLU dense
    layers beside a GELU model): Nemotron-H names each kind's MLP kind, where it read a field the other
    option lacks (an AttributeError, through family_of and exportability alike)."""
    cfg = compose_model(["model=step-3.5-flash", "model.mlp.kind=gelu"])
    kinds = {p.field: (p.value, p.wants) for p in FAMILIES["nemotron_h"].problems(cfg) if p.field.endswith("mlp.kind")}
    assert kinds == {f"model.layers.kinds.{k}.mlp.kind": ("swiglu", "gelu") for k in ("full_dense", "sliding_dense")}


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(layers_block_type=["moe", "mamba"]), "NemotronHConfig.layers_block_type"),
        (dict(layers_block_type=["mlp", "mamba"]), "NemotronHConfig.layers_block_type"),
        (dict(layers_block_type=["mamba", "mlp", "mlp"]), "NemotronHConfig.layers_block_type"),
        (dict(mlp_hidden_act="silu"), "NemotronHConfig.mlp_hidden_act"),
        (dict(sliding_window=4), "NemotronHConfig.sliding_window"),
        (dict(layers_block_type=["mamba", "mlp", "mamba", "moe"]), "NemotronHConfig.layers_block_type"),
        (dict(HF_CASES["nemotron-h-moe"][2], moe_latent_size=8), "NemotronHConfig.moe_latent_size"),
        (dict(HF_CASES["nemotron-h-moe"][2], mlp_bias=True), "NemotronHConfig.mlp_bias"),
        (
            dict(HF_CASES["nemotron-h-moe"][2], moe_shared_expert_intermediate_size=24),
            "NemotronHConfig.moe_shared_expert_intermediate_size",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(transformers.NemotronHConfig(**{**SMALL, **changes}))
    assert err.value.field == field
