"""Hugging Face parity of XGLM and CTRL (archlab/interop/families/sinusoidal.py): pre-norm LayerNorm blocks
over sinusoidal tables of sines then cosines, fairseq's for XGLM (``offset`` 2, ``endpoint``), CTRL's own;
embeddings scaled by √d_model; biases everywhere (CTRL's head too).

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1) give HF eager's float32
logits and map back to their family; archlab -> HF -> archlab gives back every tensor bit for bit; greedy
and left-padded generation equal HF ``generate``; a save_pretrained directory loads and saves again; each
table field moves the logits; what a record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

XGLM = dict(vocab_size=96, max_position_embeddings=64, d_model=64, num_layers=2, attention_heads=4, ffn_dim=96)
CTRL = dict(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4, dff=96)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "xglm": ("XGLMForCausalLM", "XGLMConfig", dict(XGLM, **NO_TOKENS)),
    "xglm-unscaled-relu-untied": (
        "XGLMForCausalLM",
        "XGLMConfig",
        dict(XGLM, scale_embedding=False, activation_function="relu", tie_word_embeddings=False, **NO_TOKENS),
    ),
    "ctrl": ("CTRLLMHeadModel", "CTRLConfig", dict(CTRL, **NO_TOKENS)),
    "ctrl-untied": ("CTRLLMHeadModel", "CTRLConfig", dict(CTRL, tie_word_embeddings=False, **NO_TOKENS)),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=parity.MAPPED_TESTS))


@pytest.mark.parametrize(
    "case, fields",
    [("xglm", ("layout", "offset", "endpoint")), ("ctrl", ("layout",))],
)
def test_each_table_field_moves_the_logits(case, fields):
    """The fields the family sets, each put back to its default in turn, give other logits."""
    model = from_hf(hf_model(case))
    default = {"layout": "interleaved", "offset": 0, "endpoint": False}
    parity.check_each_part_changes_logits(model, [(f"position__{f}", default[f]) for f in fields])


@pytest.mark.parametrize(
    "case, change, field",
    [
        ("xglm", dict(layerdrop=0.1), "XGLMConfig.layerdrop"),
        ("xglm", dict(activation_dropout=0.1), "XGLMConfig.activation_dropout"),
        ("xglm", dict(add_cross_attention=True), "XGLMConfig.add_cross_attention"),
        ("xglm", dict(pad_token_id=5), "XGLMConfig.pad_token_id"),
        ("ctrl", dict(layer_norm_epsilon=1e-5), "CTRLConfig.layer_norm_epsilon"),
    ],
)
def test_from_hf_refuses_what_the_record_cannot_hold(case, change, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **change)), field)


@pytest.mark.parametrize(
    "case, change, field",
    [
        ("xglm", dict(position__offset=0), "model.position.offset"),
        ("xglm", dict(position__endpoint=False), "model.position.endpoint"),
        ("xglm", dict(norm__eps=1e-6), "model.norm.eps"),
        ("ctrl", dict(position__layout="interleaved"), "model.position.layout"),
        ("ctrl", dict(scale_embedding=False), "model.scale_embedding"),
        ("ctrl", dict(head__bias=False), "model.head.bias"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(case, change, field):
    family = HF_CASES[case][1].removesuffix("Config").lower()
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, case)), **change)
    parity.check_family_refuses(family, cfg, field)
