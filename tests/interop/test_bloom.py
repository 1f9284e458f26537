"""Hugging Face parity of BLOOM (archlab/interop/families/bloom.py): ALiBi (its slopes for head counts
that are not powers of two too) with a LayerNorm on the token embeddings.

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1) give HF eager's float32
logits; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and left-padded batched
decoding equal HF ``generate``; a save_pretrained directory loads; an archlab ALiBi layout with an
embedding norm exports to it; what it cannot hold is refused naming the field, and its tensor-parallel
settings read as the same model."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

BLOOM_SMALL = dict(vocab_size=96, hidden_size=64, n_layer=2, n_head=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys, the family archlab's layout maps back to)
HF_CASES = {
    "bloom": ("BloomForCausalLM", "BloomConfig", BLOOM_SMALL, "bloom"),
    # 6 heads: ALiBi's slopes for a head count that is not a power of two
    "bloom-6-heads-untied": (
        "BloomForCausalLM",
        "BloomConfig",
        dict(BLOOM_SMALL, hidden_size=48, n_head=6, tie_word_embeddings=False),
        "bloom",
    ),
}
NANO = ["model=nano", "model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.d_model=64"]
ALIBI = [*NANO, "model/position=alibi"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_maps_back(case):
    """HF eager's logits, and archlab -> HF -> archlab bit for bit."""
    hf = hf_model(case)
    parity.check_back_and_again(hf, parity.check_from_hf(hf, HF_CASES[case][3]), **ATTN)


def test_from_hf_reads_the_family_s_parts():
    bloom = from_hf(hf_model("bloom")).cfg
    assert (bloom.position.kind, bloom.embedding_norm, bloom.mlp.d_ff, bloom.context_length) == (
        "alibi",
        True,
        256,
        2048,
    )


@pytest.mark.parametrize("case", ["bloom-6-heads-untied"])
def test_greedy_and_padded_generation_match_hf_generate(case):
    parity.check_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["bloom"])
def test_save_pretrained_directory_loads_and_saves_again(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=5), tmp_path, **ATTN)


def test_archlab_layout_exports_to_the_family_and_back_bit_for_bit():
    parity.check_exports(compose_model([*ALIBI, "model.embedding_norm=true"]), "BloomForCausalLM", **ATTN)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ([*ALIBI], "model.embedding_norm"),
        ([*ALIBI, "model.embedding_norm=true", "model.mlp.d_ff=96"], "model.mlp.d_ff"),
        ([*ALIBI, "model.embedding_norm=true", "model.mlp.approximate=none"], "model.mlp.approximate"),
    ],
)
def test_layouts_the_family_cannot_hold_are_refused_naming_the_field(overrides, field):
    parity.check_refuses(lambda: config_to_hf(compose_model(overrides)), field, "Hugging Face")


def test_hf_settings_archlab_cannot_hold_are_refused_naming_the_key():
    keys = dict(BLOOM_SMALL, apply_residual_connection_post_layernorm=True)
    field = "BloomConfig.apply_residual_connection_post_layernorm"
    parity.check_refuses(lambda: config_from_hf(transformers.BloomConfig(**keys)), field)


def test_numerics_only_settings_are_read_as_the_same_model():
    """BLOOM's tensor-parallel slicing (the same sums in slices) leaves the layout as it is."""
    bloom = config_from_hf(transformers.BloomConfig(**BLOOM_SMALL))
    assert config_from_hf(transformers.BloomConfig(**BLOOM_SMALL, pretraining_tp=2, slow_but_exact=True)) == bloom
