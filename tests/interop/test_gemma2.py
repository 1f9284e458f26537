"""Hugging Face parity of Gemma 2 (archlab/interop/families/gemma2.py): Gemma's (1 + w) RMSNorms in a sandwich
block, soft-capped scores and logits, its own query scale, sliding and global layers.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has
it; sequences longer than every window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; a save_pretrained directory loads and saves again; what the family cannot hold is refused,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WINDOW

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "gemma2": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        dict(
            SMALL,
            num_hidden_layers=3,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
        ),
    ),
}
D64 = ["model.d_model=64", "model.attention.n_head=4"]
# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "gemma2-2b": (
        "gemma2-2b",
        "Gemma2ForCausalLM",
        [
            *D64,
            "model.n_layer=3",
            "model.attention.head_dim=16",
            f"model.attention.window={WINDOW}",
            "model.attention.softcap=2.0",
            "model.head.softcap=5.0",
        ],
    ),
    "gemma2-2b-no-window": (
        "gemma2-2b",
        "Gemma2ForCausalLM",
        [*D64, "model.attention.head_dim=16", "model.attention.window=null", "model/layers=none"],
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    g2 = from_hf(hf_model("gemma2")).cfg
    assert (g2.block.kind, g2.attention.scale, g2.attention.softcap, g2.head.softcap) == (
        "sandwich",
        24**-0.5,
        2.0,
        5.0,
    )
    assert parity.windows(g2) == [WINDOW, None, WINDOW]  # layers 0, 2 slide; 1 is global (model.layers kinds)


@pytest.mark.parametrize(
    "case, changes, read",
    [
        (
            "gemma2",
            dict(layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
            [WINDOW, WINDOW, None],
        ),
    ],
)
def test_any_layers_sliding_read_as_layer_kinds(case, changes, read):
    """Which layers slide, in any order (once refused unless every N-th one was global), reads as model.layers
    kinds giving each layer its window, and writes back the same layer_types."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, case, **changes))
    assert parity.windows(cfg) == read
    assert config_to_hf(cfg).layer_types == ["full_attention" if w is None else "sliding_attention" for w in read]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (
            ["model=gemma2-2b", "+model.layers.kinds.global.attention.window=8"],
            "model.layers.kinds.global.attention.window",
        ),
        (["model=gemma2-2b", "model.attention.scale=0.3"], "model.attention.scale"),
        (["model=gemma2-2b", "model.scale_embedding=false"], "model.scale_embedding"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("gemma2", compose_model(overrides), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("gemma2", dict(hidden_activation="relu"), "Gemma2Config.hidden_activation"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


@pytest.mark.parametrize("case", ["gemma2"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
