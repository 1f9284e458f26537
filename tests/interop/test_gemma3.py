"""Hugging Face parity of Gemma 3 (text) (archlab/interop/families/gemma3.py, model_type gemma3_text), a dense
family whose layers differ: local and global layers by ``sliding_window_pattern``, each type with its own RoPE
base and scaling (a linear scaling on the global layers), a (1 + w) QK-norm per head, sandwich norms, capped
final logits.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1; GQA; sequences longer than every window of 4) gives the same float32 logits in archlab and
in transformers' eager implementation, from HF to archlab and from an archlab layout (gemma3-1b, shrunk) to
HF; archlab -> HF -> archlab gives back every tensor bit for bit and the same layer_types; greedy decoding,
alone and in a left-padded batch, equals HF ``generate``; a save_pretrained directory loads and saves again;
the shipped preset's config is the published one (tests/helpers/published.py LAYOUT_CONFIGS); what the family
cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WIDTHS, WINDOW

from archlab.config import ModelConfig
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
LAYERS = dict(SMALL, num_hidden_layers=4, num_key_value_heads=2)  # four layers, grouped heads
PER_TYPE_ROPE = {
    S: {"rope_type": "default", "rope_theta": 10000.0},
    F: {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0},
}
# case -> (model class, config class, config keys)
HF_CASES = {
    # local, global, local: a (1 + w) QK-norm per head, RoPE bases and scaling per type, capped final logits
    "gemma3": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            LAYERS,
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            final_logit_softcapping=5.0,
            rope_parameters=PER_TYPE_ROPE,
        ),
    ),
}
LOCAL_GLOBAL = [
    "model.n_layer=3",
    "model.layers.pattern=[local,global]",
    f"model.layers.kinds.local.attention.window={WINDOW}",
]
# the archlab layout of gemma3-1b (overrides), shrunk
LAYOUT = ["model=gemma3-1b", *WIDTHS, *LOCAL_GLOBAL, "model.attention.head_dim=16"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


def layout(**changes) -> ModelConfig:
    """The layout (Hydra composes it once: the slowest step of a refusal), its kinds and its own fields
    changed as ``helpers.hf.with_kinds`` does."""
    return parity.with_kinds(parity.composed(*LAYOUT), **changes)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_from_hf_gives_hf_logits_and_back",)))


def test_from_hf_reads_the_family_s_layers():
    local, glob = (WINDOW, "rope", 1e4, "none"), (None, "rope", 5e5, "linear")
    gemma3 = config_from_hf(parity.hf_config(HF_CASES, "gemma3"))
    assert parity.layer_positions(gemma3) == [local, glob, local]
    # the layout, in the shipped layouts' names
    assert (gemma3.layers.first, gemma3.layers.pattern) == ([], ["local", "global"])
    assert gemma3.layers.kinds["local"]["attention"] == {"window": WINDOW}
    assert (gemma3.attention.qk_norm, gemma3.block.kind, gemma3.norm.unit_offset, gemma3.head.softcap) == (
        "head",
        "sandwich",
        True,
        5.0,
    )


@pytest.mark.parametrize("case", ["gemma3"])
def test_greedy_generation_matches_hf_generate(case):
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["gemma3"])
def test_padded_batch_generation_matches_hf_generate(case):
    parity.check_padded_generation(hf_model(case, seed=6))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout (gemma3-1b) converts to Gemma3ForCausalLM with the same logits, and back to archlab
    with every tensor bit for bit and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "Gemma3ForCausalLM", **ATTN)
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize("preset", ["gemma3-1b", "gemma3-27b"])
def test_preset_converts_to_the_published_config(preset):
    """config_to_hf of the preset gives the published config's layer types, windows and RoPE per layer,
    and the published config reads back into a layout with the preset's count and the same HF config."""
    parity.check_preset_is_published(preset)


@pytest.mark.parametrize(
    "changes, field",
    [
        # RoPE that differs within a layer type
        (dict(pattern=["local", "other", "global"], other={"attention": {"window": WINDOW}}), "model.position.theta"),
        # NoPE where the family has RoPE
        (dict(global_={"position": {"kind": "none"}}), "model.layers.kinds.global.position.kind"),
        (dict(model={"attention": {"softcap": 50.0}}), "model.attention.softcap"),
        (dict(model={"attention": {"qk_norm": "none"}}), "model.attention.qk_norm"),
    ],
)
def test_the_family_refuses_what_it_cannot_express(changes, field):
    """The family's record (its ``check``, which config_to_hf and archlab-export call) names the field: a
    layer kind's own where the kind sets it."""
    parity.check_family_refuses("gemma3_text", layout(**changes), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("gemma3", dict(attn_logit_softcapping=50.0), "Gemma3TextConfig.attn_logit_softcapping"),
        (
            "gemma3",
            dict(
                rope_parameters={
                    S: {"rope_type": "default", "rope_theta": 1e4},
                    F: {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0},
                }
            ),
            "Gemma3TextConfig.rope_parameters.full_attention.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


@pytest.mark.parametrize("case", ["gemma3"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
