"""Hugging Face parity of SmolLM3 (archlab/interop/families/smollm3.py), a dense family whose layers differ: NoPE
layers by ``no_rope_layers`` (every 4th in the published config), apart from its sliding windows, q/k/v/o and
MLP biases.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²), far
from 0 and 1; GQA; sequences longer than every window of 4) give the same float32 logits in archlab and in
transformers' eager implementation, from HF to archlab and from an archlab layout (smollm3-3b, shrunk) to HF;
archlab -> HF -> archlab gives back every tensor bit for bit and the same layer_types; greedy decoding, alone
and in a left-padded batch, equals HF ``generate``; the shipped preset's config is the published one
(tests/helpers/published.py LAYOUT_CONFIGS); what the family cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WIDTHS, WINDOW

from archlab.config import ModelConfig
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
LAYERS = dict(SMALL, num_hidden_layers=4, num_key_value_heads=2)  # four layers, grouped heads
# case -> (model class, config class, config keys)
HF_CASES = {
    # NoPE every 2nd layer, q/k/v/o and MLP biases
    "smollm3": (
        "SmolLM3ForCausalLM",
        "SmolLM3Config",
        dict(LAYERS, no_rope_layer_interval=2, attention_bias=True, mlp_bias=True),
    ),
    # windows and NoPE apart: four kinds of layer
    "smollm3-windows": (
        "SmolLM3ForCausalLM",
        "SmolLM3Config",
        dict(
            LAYERS,
            no_rope_layers=[1, 0, 1, 0],
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=[S, S, F, F],
        ),
    ),
}

# the archlab layout of smollm3-3b (overrides), shrunk
LAYOUT = ["model=smollm3-3b", *WIDTHS, "model.n_layer=4"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


def layout(**changes) -> ModelConfig:
    """The layout (Hydra composes it once: the slowest step of a refusal), its kinds and its own fields
    changed as ``helpers.hf.with_kinds`` does."""
    return parity.with_kinds(parity.composed(*LAYOUT), **changes)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_from_hf_gives_hf_logits_and_back",)))


def test_from_hf_reads_the_family_s_layers():
    W = WINDOW
    smol = config_from_hf(parity.hf_config(HF_CASES, "smollm3"))
    assert [x[:2] for x in parity.layer_positions(smol)] == [(None, "rope"), (None, "none")] * 2
    windows = config_from_hf(parity.hf_config(HF_CASES, "smollm3-windows"))
    assert [x[:2] for x in parity.layer_positions(windows)] == [
        (W, "rope"),
        (W, "none"),
        (None, "rope"),
        (None, "none"),
    ]
    assert smol.layers.kinds == {"rope": {}, "nope": {"position": {"kind": "none"}}}
    assert (smol.attention.qkv_bias, smol.mlp.bias) == (True, True)


@pytest.mark.parametrize("case", ["smollm3"])
def test_greedy_generation_matches_hf_generate(case):
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["smollm3-windows"])
def test_padded_batch_generation_matches_hf_generate(case):
    parity.check_padded_generation(hf_model(case, seed=6))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout (smollm3-3b) converts to SmolLM3ForCausalLM with the same logits, and back to archlab
    with every tensor bit for bit and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "SmolLM3ForCausalLM", **ATTN)
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize("preset", ["smollm3-3b"])
def test_preset_converts_to_the_published_config(preset):
    """config_to_hf of the preset gives the published config's layer types, windows and RoPE per layer,
    and the published config reads back into a layout with the preset's count and the same HF config."""
    parity.check_preset_is_published(preset)


@pytest.mark.parametrize(
    "changes, field",
    [
        # RoPE that differs where the family has one set
        (dict(nope={"position": {"kind": "rope", "theta": 1e3}}), "model.layers.kinds.nope.position.theta"),
        (dict(model={"attention": {"qk_norm": "head"}}), "model.attention.qk_norm"),
    ],
)
def test_the_family_refuses_what_it_cannot_express(changes, field):
    """The family's record (its ``check``, which config_to_hf and archlab-export call) names the field: a
    layer kind's own where the kind sets it."""
    parity.check_family_refuses("smollm3", layout(**changes), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        (
            "smollm3",
            dict(use_sliding_window=False, sliding_window=WINDOW, layer_types=[S, F, F, F]),
            "SmolLM3Config.use_sliding_window",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)
