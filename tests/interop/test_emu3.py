"""Hugging Face parity of Emu3's language model (archlab/interop/families/emu3.py, ``Emu3ForCausalLM``,
model_type emu3_text_model): LLaMA's layers, each sublayer's output dropped at ``attention_dropout``.

A tiny random model (GQA, attention and MLP biases, Emu3's default dropout 0.1; every parameter redrawn:
matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²)) gives the same float32 logits in archlab and in
transformers' eager attention (in eval mode); greedy decoding (a padded batch too) equals HF ``generate``;
archlab -> HF -> archlab gives back every tensor bit for bit; a save_pretrained directory loads and saves
back. The dropout reads as archlab's residual dropout at the attention's rate, none on the embeddings, and a
layout that drops otherwise is refused naming the field. Its vision-language wrapper is
tests/interop/test_wrapped.py's."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL

from archlab.interop.hf import from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# Emu3TextConfig takes ints for bos and pad ids, as the record writes them
TEXT = dict(SMALL, bos_token_id=0, pad_token_id=0, num_key_value_heads=2, head_dim=16)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "emu3": (
        "Emu3ForCausalLM",
        "Emu3TextConfig",
        dict(TEXT, attention_bias=True, mlp_bias=True, attention_dropout=0.1),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "emu3", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=parity.MAPPED_TESTS[:3]))


def test_save_pretrained_directories_round_trip(tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> Emu3ForCausalLM.from_pretrained (transformers 5.24's
    AutoModelForCausalLM does not map Emu3TextConfig): the same logits."""
    parity.check_directory_round_trip(hf_model(seed=7), tmp_path, transformers.Emu3ForCausalLM, None, **ATTN)


def test_its_dropout_is_the_residual_dropout_at_the_attention_s_rate():
    cfg = from_hf(hf_model()).cfg
    assert (cfg.dropout, cfg.attention.dropout, cfg.embedding_dropout) == (0.1, 0.1, 0.0)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(dropout=0.2), "model.dropout"),
        (dict(embedding_dropout=0.1), "model.embedding_dropout"),
    ],
)
def test_a_layout_that_drops_otherwise_is_refused(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **change)
    parity.check_family_refuses("emu3_text_model", cfg, field)
