"""Hugging Face parity of Qwen3 (archlab/interop/families/qwen3.py): LLaMA's layout with a per-head QK-norm, its
own head_dim and sliding windows on any layers (layer_types).

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has
it; sequences longer than every window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; a save_pretrained directory loads and saves again; what the family cannot hold is refused,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, GQA, SMALL, WINDOW

from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "qwen3": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            head_dim=24,
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
}

# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "qwen3-0.6b": ("qwen3-0.6b", "Qwen3ForCausalLM", [*GQA, "model.attention.head_dim=24"]),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    cfg = from_hf(hf_model("qwen3")).cfg
    q3 = cfg.attention
    assert (q3.qk_norm, q3.head_dim, parity.windows(cfg)) == ("head", 24, [WINDOW, None])


@pytest.mark.parametrize(
    "case, changes, read",
    [
        ("qwen3", dict(layer_types=["full_attention", "sliding_attention"]), [None, WINDOW]),
    ],
)
def test_any_layers_sliding_read_as_layer_kinds(case, changes, read):
    """Which layers slide, in any order (once refused unless every N-th one was global), reads as model.layers
    kinds giving each layer its window, and writes back the same layer_types."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, case, **changes))
    assert parity.windows(cfg) == read
    assert config_to_hf(cfg).layer_types == ["full_attention" if w is None else "sliding_attention" for w in read]


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("qwen3", dict(layer_types=["full_attention", "chunked_attention"]), "Qwen3Config.layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


@pytest.mark.parametrize("case", ["qwen3"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
