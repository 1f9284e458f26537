"""Hugging Face parity of Apertus 1.5's text model (archlab/interop/families/apertus.py): Apertus's layers
with the head pruned to the first ``output_vocab_size`` ids of a larger input vocabulary (archlab's
``model.head.vocab``), and unpruned.

Tiny random models (every parameter redrawn) give the same float32 logits in archlab and transformers'
eager attention; greedy and padded decoding equal HF ``generate``; round trips are bit-identical; the
pruned head is counted as its rows × width, equal to transformers' own count; what it cannot hold is refused."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import build_model, compose_model, count_params
from archlab.errors import ConfigError
from archlab.interop.hf import from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SIZES = dict(
    HF_SIZES,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    **NO_TOKENS,
    intermediate_size=96,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
ROWS = HF_SIZES["vocab_size"] - 37  # the pruned head's rows
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "pruned": ("Apertus1p5TextForCausalLM", "Apertus1p5TextConfig", dict(SIZES, output_vocab_size=ROWS)),
    "full": ("Apertus1p5TextForCausalLM", "Apertus1p5TextConfig", dict(SIZES, tie_word_embeddings=True)),
}


def hf_model(case, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, {"pruned": HF_CASES["pruned"]}, impl=EAGER, only=parity.MAPPED_TESTS))


def test_an_unpruned_checkpoint_reads_as_apertus():
    """Without a pruned head the layout is Apertus's (its family comes first): the same logits, tied or not."""
    parity.check_from_hf(hf_model("full"), family="apertus")


def test_the_pruned_head_is_its_rows_and_counted_so():
    """Logits of ROWS columns; the head ROWS × 64, the embedding every id's row; the count is transformers'."""
    hf = hf_model("pruned")
    model = from_hf(hf)
    assert model.cfg.head.vocab == ROWS and model(parity.IDS).shape[-1] == ROWS
    counts = count_params(model.cfg)
    assert (counts["head"], counts["token_embedding"]) == (ROWS * 64, HF_SIZES["vocab_size"] * 64)
    assert counts["total"] == sum(p.numel() for p in hf.parameters())


def test_the_head_s_rows_are_checked():
    """More rows than the vocabulary, and a tied head with fewer, are refused naming model.head.vocab."""
    base = ["model=nano", "model.head.tied=false"]
    with pytest.raises(ConfigError, match="model.head.vocab"):
        build_model(compose_model([*base, f"model.head.vocab={10**6}"]))
    with pytest.raises(ConfigError, match="model.head.vocab"):
        build_model(compose_model(["model=nano", "model.head.vocab=10"]))


def test_an_apertus_layout_with_a_pruned_head_exports_as_apertus_1p5():
    """The plain layout stays Apertus's; with model.head.vocab it is Apertus 1.5's class."""
    cfg = from_hf(hf_model("pruned")).cfg
    parity.check_family_refuses("apertus", cfg, "model.head.vocab")
    cfg = parity.changed_cfg(cfg, head__vocab=None)
    assert parity.families_holding(cfg, set()) >= {"apertus", "apertus1p5_text"}
