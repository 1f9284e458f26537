"""Hugging Face parity of Falcon-H1 (FalconH1ForCausalLM), archlab's ``parallel`` mixer
(archlab/interop/families/falcon_h1.py): tiny random models (every parameter redrawn: biases, norm scales,
A_log, dt_bias, D and the convolution's bias 0.5 + N(0, 0.3²)) with every μP multiplier away from 1 give the
same float32 logits in archlab and in transformers' torch path: its gated norm after the gate, before it and
absent, with every bias, a tied head and a head_dim of its own, a time-step clamp; greedy and left-padded
decoding equal HF ``generate``; HF -> archlab -> HF -> archlab gives back every tensor bit for bit (the folded
multipliers written back as 1), and a save_pretrained directory round trips; an archlab layout converts to
HF and back; the refusals.

HF's Mamba part zeroes a padded position's input before ``in_proj``, as Bamba's: the left-padded case has no
``mamba_proj_bias`` (with it HF's padded row differs from the prompt alone). ``FalconH1Config()``'s defaults
count 8,514,961,408 parameters, not the 1.5B of the checkpoint its docstring names
(Falcon-H1-1.5B-Deep-Instruct): no published model, so no preset is read from them."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import NO_TOKENS, TOL, V, logits, max_diff, randomize

from archlab import ConfigError, build_model, count_params
from archlab.config import to_model_config
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 2 layers of width 64: attention of 4 heads of 16 over 2 KV heads; Mamba-2 of 4 heads of 16 (d_ssm 64), 2 groups
# of B and C of 8, conv 4, chunks of 5; every multiplier away from 1
MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, key_multiplier=0.7, attention_in_multiplier=0.9)
MULTIPLIERS |= dict(attention_out_multiplier=1.3, ssm_in_multiplier=1.1, ssm_out_multiplier=0.8)
MULTIPLIERS |= dict(ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9], mlp_multipliers=[0.6, 1.4])
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
SMALL |= dict(num_key_value_heads=2, max_position_embeddings=64, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16)
SMALL |= dict(mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=5, **MULTIPLIERS, **NO_TOKENS)
SMALL |= dict(mamba_rms_norm=True, mamba_norm_before_gate=False)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "falcon_h1": ("FalconH1ForCausalLM", "FalconH1Config", SMALL),
    "falcon_h1-before-gate": (
        "FalconH1ForCausalLM",
        "FalconH1Config",
        dict(SMALL, mamba_norm_before_gate=True, mamba_n_groups=1, rope_parameters={"rope_theta": 500.0}),
    ),
    "falcon_h1-no-norm-biases-tied": (
        "FalconH1ForCausalLM",
        "FalconH1Config",
        dict(SMALL, mamba_rms_norm=False, attention_bias=True, mlp_bias=True, mamba_proj_bias=True)
        | dict(projectors_bias=True, mamba_conv_bias=False, tie_word_embeddings=True, head_dim=8)
        | dict(mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8),
    ),
    "falcon_h1-dt-limit": ("FalconH1ForCausalLM", "FalconH1Config", dict(SMALL, time_step_limit=(0.2, 1.5))),
}
GENERATED = ["falcon_h1", "falcon_h1-before-gate", "falcon_h1-no-norm-biases-tied"]
# a Bamba of 2 layers (Mamba-2, then attention) at the same width
SMALL_BAMBA = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
SMALL_BAMBA |= dict(
    num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, **NO_TOKENS
)


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **parity.ATTN)


def cases(*names: str) -> dict[str, tuple]:
    return {name: HF_CASES[name] for name in names}


# logits, HF -> archlab -> HF -> archlab bit for bit, save_pretrained directories: every case; greedy generation
# where HF's one-token step computes what its full forward does (no time-step clamp); left padding without
# Mamba projection biases (with them HF's padded row differs from the prompt alone, as Bamba's)
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_the_family_converts_both_ways",)))
globals().update(parity.family_tests(hf_model, cases(*GENERATED), only=("test_greedy_generation_matches_hf_generate",)))
globals().update(
    parity.family_tests(
        hf_model,
        cases("falcon_h1", "falcon_h1-before-gate"),
        only=("test_padded_batch_generation_matches_hf_generate",),
    )
)


def test_decoding_with_a_time_step_clamp_equals_hfs_full_forward_not_its_decoding():
    """With ``time_step_limit`` transformers clamps dt in its chunked forward but not in its one-token step
    (as Bamba's): archlab's logits through its cache equal HF's full forward at every step, HF's own cached
    decoding does not."""
    parity.check_decoding_equals_hfs_full_forward_not_its_decoding(hf_model("falcon_h1-dt-limit"))


def test_from_hf_reads_the_parts_and_folds_the_rest():
    """The multipliers archlab holds read as fields; the others are folded into the weights: k_proj's rows
    times key_multiplier, in_proj's z, x, B, C and dt rows times ssm_multipliers, gate_proj and down_proj
    times mlp_multipliers (bias included), each against the HF tensor times the factor by hand."""
    hf = hf_model("falcon_h1-no-norm-biases-tied")
    cfg = config_from_hf(hf.config)
    a, m = cfg.attention, cfg.attention.ssm
    assert (a.kind, a.n_head, a.attention.n_kv_head, a.attention.head_dim, a.attention.qkv_bias) == (
        "parallel", 4, 2, 8, True,
    )  # fmt: skip
    assert (m.n_head, m.head_dim, m.groups, m.state_size, m.qkv_bias, m.out_bias, m.conv_bias, m.gate_norm) == (
        6, 8, 2, 8, True, True, False, "none",
    )  # fmt: skip
    assert (a.attention_in_multiplier, a.attention_out_multiplier, a.ssm_in_multiplier, a.ssm_out_multiplier) == (
        0.9, 1.3, 1.1, 0.8,
    )  # fmt: skip
    assert (cfg.embedding_multiplier, cfg.head.logit_scale, cfg.head.tied, cfg.mlp.bias) == (1.7, 0.6, True, True)
    assert [config_from_hf(hf_model(c).config).attention.ssm.gate_norm for c in GENERATED] == [
        "after",
        "before",
        "none",
    ]
    model = from_hf(hf)
    ours, theirs = model.blocks[1], hf.model.layers[1]
    with torch.no_grad():
        k_rows = slice(4 * 8, 6 * 8)  # q of 4 heads of 8, then k of 2
        torch.testing.assert_close(ours.attn.attention.qkv.weight[k_rows], theirs.self_attn.k_proj.weight * 0.7)
        torch.testing.assert_close(ours.attn.attention.qkv.bias[k_rows], theirs.self_attn.k_proj.bias * 0.7)
        # in_proj: z 48, x 48, B 16, C 16, dt 6 rows
        factors = torch.tensor([0.5] * 48 + [1.5] * 48 + [0.8] * 16 + [1.2] * 16 + [0.9] * 6)
        torch.testing.assert_close(ours.attn.ssm.in_proj.weight, theirs.mamba.in_proj.weight * factors[:, None])
        torch.testing.assert_close(ours.attn.ssm.in_proj.bias, theirs.mamba.in_proj.bias * factors)
        gate = ours.mlp.gate_up.weight[:96]
        torch.testing.assert_close(gate, theirs.feed_forward.gate_proj.weight * 0.6)
        torch.testing.assert_close(ours.mlp.down.bias, theirs.feed_forward.down_proj.bias * 1.4)
    assert ours.attn.ssm.norm_weight is None


def test_every_multiplier_moves_the_logits():
    """Each multiplier set back to 1 in the HF config, the same weights: HF's logits move by more than the
    tolerance (so each reaches the model), and archlab's read of that config follows them."""
    base = hf_model("falcon_h1")
    for name, one in [(n, 1.0) for n in MULTIPLIERS if not n.endswith("s")] + [
        ("ssm_multipliers", [1.0] * 5),
        ("mlp_multipliers", [1.0, 1.0]),
    ]:
        config = transformers.FalconH1Config(**{**SMALL, name: one}, **parity.ATTN)
        hf = transformers.FalconH1ForCausalLM(config).eval()
        hf.load_state_dict(base.state_dict())
        assert max_diff(logits(hf), logits(base)) > 1e-2, name
        assert max_diff(logits(from_hf(hf)), logits(hf)) <= TOL, name


def test_an_archlab_layout_converts_to_hf_and_back():
    """A parallel model written in archlab (MHA, Mamba-2 of 2 heads of 24 with its norm before the gate, the
    in/out multipliers, untied) exports to FalconH1ForCausalLM with the same logits and reads back bit for bit."""
    attention = {"kind": "parallel", "n_head": 4, "attention": {"qkv_bias": False, "out_bias": False}}
    attention |= {"ssm": {"n_head": 2, "head_dim": 24, "state_size": 8, "gate_norm": "before"}}
    attention |= {"attention_in_multiplier": 0.5, "ssm_out_multiplier": 2.0}
    cfg = to_model_config(
        dict(vocab_size=V, context_length=64, n_layer=2, d_model=32, norm={"kind": "rmsnorm", "eps": 1e-5})
        | dict(position={"kind": "rope"}, attention=attention, mlp={"kind": "swiglu", "d_ff": 48, "bias": False})
        | dict(head={"tied": False}, dropout=0.0, embedding_multiplier=2.0)
    )
    hf, _ = parity.check_to_hf_and_back(randomize(build_model(cfg), 2), "FalconH1ForCausalLM")
    c = hf.config
    assert (c.mamba_d_ssm, c.mamba_rms_norm, c.mamba_norm_before_gate, c.attention_in_multiplier) == (
        48,
        True,
        True,
        0.5,
    )
    assert (c.key_multiplier, c.mlp_multipliers, c.ssm_multipliers) == (1.0, [1.0, 1.0], [1.0] * 5)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(attention__attention__qk_norm="head"), "model.attention.attention.qk_norm"),
        (dict(attention__attention__out_bias=True), "model.attention.attention.out_bias"),  # one attention_bias
        (dict(attention__ssm__dt_min=0.01), "model.attention.ssm.dt_min"),
        (dict(mlp__bias=True, mlp__swiglu_limit=7.0), "model.mlp.swiglu_limit"),
        (dict(block__residual_multiplier=2.0), "model.block.residual_multiplier"),
        (dict(norm__kind="layernorm"), "model.norm.kind"),
    ],
)
def test_a_layout_falcon_h1_cannot_hold_is_refused(changes, field):
    cfg = from_hf(hf_model("falcon_h1")).cfg
    parity.check_problem("falcon_h1", cfg, field, **changes)


def test_hf_configs_archlab_cannot_hold_are_refused():
    for change, name in [({"hidden_act": "gelu"}, "hidden_act"), ({"ssm_out_multiplier": 0.0}, "ssm_out_multiplier")]:
        config = transformers.FalconH1Config(**{**SMALL, **change})
        with pytest.raises(ConfigError) as err:
            FAMILIES["falcon_h1"].from_hf(config)
        assert err.value.field == f"FalconH1Config.{name}"


def test_the_default_config_counts_as_transformers_meta_model():
    """``FalconH1Config()`` read into archlab: its closed-form count equals transformers' model built on the meta
    device, 8,514,961,408 (128 Mamba-2 heads of 8 over d_ssm 1024, state 256; untied)."""
    config = transformers.FalconH1Config()
    with torch.device("meta"):
        hf = transformers.FalconH1ForCausalLM(config)
    assert sum(p.numel() for p in hf.parameters()) == count_params(config_from_hf(config))["total"] == 8_514_961_408


def test_the_other_mamba2_families_refuse_a_gated_norm_they_lack():
    """Mamba-2's ``gate_norm`` before or none is Falcon-H1's: Mamba2ForCausalLM refuses it on the model's mixer,
    Bamba on its Mamba-2 layer kind, each naming the field."""
    sizes = dict(vocab_size=V, hidden_size=32, num_heads=4, head_dim=16, n_groups=1, state_size=8, **NO_TOKENS)
    mamba2 = config_from_hf(transformers.Mamba2Config(**sizes))
    parity.check_problem("mamba2", mamba2, "model.attention.gate_norm", attention__gate_norm="before")
    bamba = transformers.BambaConfig(**SMALL_BAMBA)
    field = "model.layers.kinds.mamba2.attention.gate_norm"
    parity.check_problem("bamba", config_from_hf(bamba), field, kinds__mamba2__attention__gate_norm="none")
