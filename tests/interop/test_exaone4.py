"""Hugging Face parity of EXAONE 4 (archlab/interop/families/exaone4.py), a dense family whose layers differ:
OLMo 2's post-sublayer norms with a per-head QK-norm, local RoPE and global NoPE layers in turn, its own
head_dim, Llama 3.1's RoPE scaling.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²), far
from 0 and 1; GQA; sequences longer than every window of 4) give the same float32 logits in archlab and in
transformers' eager implementation, from HF to archlab and from an archlab layout (exaone4-irope, shrunk) to
HF; archlab -> HF -> archlab gives back every tensor bit for bit and the same layer_types; greedy decoding,
alone and in a left-padded batch, equals HF ``generate``; what the family cannot hold is refused, naming the
field."""

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
    # local RoPE / global NoPE in turn, explicit head_dim, Llama 3.1 RoPE scaling
    "exaone4": (
        "Exaone4ForCausalLM",
        "Exaone4Config",
        dict(
            LAYERS,
            head_dim=24,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    # no window: every layer global with RoPE (layer_types given: Exaone4Config(sliding_window=None) alone divides by zero)
    "exaone4-no-window": (
        "Exaone4ForCausalLM",
        "Exaone4Config",
        dict(LAYERS, num_hidden_layers=2, sliding_window=None, layer_types=[F, F]),
    ),
}
EXAONE = ["model=olmo2-7b", "model.attention.qk_norm=head", "model.attention.head_dim=24"]
IROPE = ["model.n_layer=4", "model/layers=irope", f"model.layers.kinds.local.attention.window={WINDOW}"]
# the archlab layout of exaone4-irope (overrides), shrunk
LAYOUT = [*EXAONE, *WIDTHS, *IROPE]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


def layout(**changes) -> ModelConfig:
    """The layout (Hydra composes it once: the slowest step of a refusal), its kinds and its own fields
    changed as ``helpers.hf.with_kinds`` does."""
    return parity.with_kinds(parity.composed(*LAYOUT), **changes)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_from_hf_gives_hf_logits_and_back",)))


def test_from_hf_reads_the_family_s_layers():
    exaone = config_from_hf(parity.hf_config(HF_CASES, "exaone4"))
    assert [x[:2] for x in parity.layer_positions(exaone)] == [(WINDOW, "rope"), (None, "none")] * 2
    no_window = config_from_hf(parity.hf_config(HF_CASES, "exaone4-no-window"))
    assert [x[:2] for x in parity.layer_positions(no_window)] == [(None, "rope")] * 2
    assert (exaone.block.kind, exaone.attention.qk_norm, exaone.attention.head_dim, exaone.position.scaling.kind) == (
        "post_sublayer",
        "head",
        24,
        "llama3",
    )


@pytest.mark.parametrize("case", ["exaone4-no-window"])
def test_greedy_generation_matches_hf_generate(case):
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["exaone4"])
def test_padded_batch_generation_matches_hf_generate(case):
    parity.check_padded_generation(hf_model(case, seed=6))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout (exaone4-irope) converts to Exaone4ForCausalLM with the same logits, and back to archlab
    with every tensor bit for bit and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "Exaone4ForCausalLM", **ATTN)
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize(
    "changes, field",
    [
        # two window sizes
        (dict(global_={"attention": {"window": 8}}), "model.layers.kinds.global.attention.window"),
        # the family's rule on which layers have RoPE
        (dict(global_={"position": {"kind": "rope"}}), "model.layers.kinds.global.position.kind"),
        (dict(model={"attention": {"qkv_bias": True, "out_bias": True}}), "model.attention.qkv_bias"),
    ],
)
def test_the_family_refuses_what_it_cannot_express(changes, field):
    """The family's record (its ``check``, which config_to_hf and archlab-export call) names the field: a
    layer kind's own where the kind sets it."""
    parity.check_family_refuses("exaone4", layout(**changes), field)
