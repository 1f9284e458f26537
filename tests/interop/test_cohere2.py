"""Hugging Face parity of Cohere2 (archlab/interop/families/cohere2.py), a dense family whose layers differ:
Cohere's parallel layers, local ones with interleaved RoPE and a global NoPE one by
``sliding_window_pattern``, biases, and a logit_scale (0.25) folded into the final norm.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1; GQA; sequences longer than every window of 4) gives the same float32 logits in archlab and
in transformers' eager implementation, from HF to archlab and from an archlab layout (cohere2-irope, shrunk)
to HF; archlab -> HF -> archlab gives back every tensor bit for bit and the same layer_types; greedy decoding,
alone and in a left-padded batch, equals HF ``generate``; a save_pretrained directory loads and saves again;
what the family cannot hold is refused, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WIDTHS, WINDOW, logits

from archlab import ConfigError
from archlab.config import ModelConfig
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
LAYERS = dict(SMALL, num_hidden_layers=4, num_key_value_heads=2)  # four layers, grouped heads
# case -> (model class, config class, config keys)
HF_CASES = {
    # two local layers with interleaved RoPE, a global NoPE one; biases; logits times 0.25
    "cohere2": (
        "Cohere2ForCausalLM",
        "Cohere2Config",
        dict(
            LAYERS,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            sliding_window_pattern=3,
            logit_scale=0.25,
            attention_bias=True,
        ),
    ),
}
COHERE = ["model=nano", "model/position=rope", "model.position.pairing=interleaved", "model/block=parallel"]
COHERE += ["model.norm.bias=false", "model/mlp=swiglu", "model.mlp.bias=false", "model.attention.qkv_bias=false"]
COHERE += ["model.attention.out_bias=false", "model.position.theta=50000.0"]
IROPE = ["model.n_layer=4", "model/layers=irope", f"model.layers.kinds.local.attention.window={WINDOW}"]
# the archlab layout of cohere2-irope (overrides), shrunk
LAYOUT = [*COHERE, *WIDTHS, *IROPE]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


def layout(**changes) -> ModelConfig:
    """The layout (Hydra composes it once: the slowest step of a refusal), its kinds and its own fields
    changed as ``helpers.hf.with_kinds`` does."""
    return parity.with_kinds(parity.composed(*LAYOUT), **changes)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_from_hf_gives_hf_logits_and_back",)))


def test_from_hf_reads_the_family_s_layers():
    cohere = config_from_hf(parity.hf_config(HF_CASES, "cohere2"))
    assert [x[:2] for x in parity.layer_positions(cohere)] == [(WINDOW, "rope"), (WINDOW, "rope"), (None, "none")]
    assert cohere.layers.kinds == {"local": {"attention": {"window": WINDOW}}, "global": {"position": {"kind": "none"}}}
    assert (cohere.block.kind, cohere.norm.kind, cohere.norm.bias, cohere.position.pairing) == (
        "parallel",
        "layernorm",
        False,
        "interleaved",
    )


def test_cohere2_logit_scale_folds_into_the_final_norm_bit_for_bit():
    """logit_scale 0.25 is a power of two: in transformers' own Cohere2, scaling the logits by it and
    scaling the final norm's weight by it instead give the same logits to the last bit, which is what
    archlab's final norm holds; the model exports with logit_scale 1."""
    hf = hf_model("cohere2", seed=8)
    model = from_hf(hf)
    assert torch.equal(model.final_norm.weight, hf.model.norm.weight * 0.25)
    config = parity.hf_config(HF_CASES, "cohere2", logit_scale=1.0, attn_implementation="eager")
    folded = transformers.Cohere2ForCausalLM(config)
    folded.load_state_dict({**hf.state_dict(), "model.norm.weight": hf.model.norm.weight * 0.25})
    assert torch.equal(logits(hf), logits(folded.eval()))
    assert to_hf(model).config.logit_scale == 1.0


def test_config_to_hf_names_what_the_nearest_family_lacks():
    with pytest.raises(ConfigError) as err:
        config_to_hf(layout(local={"position": {"kind": "none"}}))
    assert err.value.field == "model.layers.kinds.local.position.kind"


@pytest.mark.parametrize("case", ["cohere2"])
def test_greedy_generation_matches_hf_generate(case):
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["cohere2"])
def test_padded_batch_generation_matches_hf_generate(case):
    parity.check_padded_generation(hf_model(case, seed=6))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout (cohere2-irope) converts to Cohere2ForCausalLM with the same logits, and back to archlab
    with every tensor bit for bit and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "Cohere2ForCausalLM", **ATTN)
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize(
    "changes, field",
    [
        # a part that differs per layer beyond window and position
        (dict(global_={"mlp": {"d_ff": 48}}), "model.layers.kinds.global.mlp.d_ff"),
        # the family's rule on which layers have RoPE
        (dict(local={"position": {"kind": "none"}}), "model.layers.kinds.local.position.kind"),
        (dict(model={"attention": {"head_dim": 32}}), "model.attention.head_dim"),
        (dict(model={"norm": {"bias": True}}), "model.norm.bias"),
    ],
)
def test_the_family_refuses_what_it_cannot_express(changes, field):
    """The family's record (its ``check``, which config_to_hf and archlab-export call) names the field: a
    layer kind's own where the kind sets it."""
    parity.check_family_refuses("cohere2", layout(**changes), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("cohere2", dict(logit_scale=0.3), "Cohere2Config.logit_scale"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


@pytest.mark.parametrize("case", ["cohere2"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout (the logit_scale folded on loading from files too)."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
