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
from helpers.hf import ATTN, GQA, SMALL, TINY, WINDOW

from archlab import compose_model
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


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits(case):
    parity.check_from_hf(hf_model(case))  # the layout read maps back to the same family


def test_from_hf_reads_the_family_s_parts():
    cfg = from_hf(hf_model("qwen3")).cfg
    q3 = cfg.attention
    assert (q3.qk_norm, q3.head_dim, parity.windows(cfg)) == ("head", 24, [WINDOW, None])


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors."""
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **ATTN)


@pytest.mark.parametrize("case", list(PRESET_CASES))
def test_archlab_to_hf_to_archlab_is_bit_identical(case):
    """A shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit."""
    preset, expected_class, sizes = PRESET_CASES[case]
    parity.check_exports(compose_model([f"model={preset}", *TINY, *sizes]), expected_class, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt, past every window of 4: the same ids as HF ``generate``, and
    at every step archlab's logits through its KV cache equal the logits HF decoded with."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", list(HF_CASES))
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, with their attention mask: archlab's
    greedy continuation of each row, and its logits at every step, equal HF ``generate``'s."""
    parity.check_padded_generation(hf_model(case, seed=6))


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
