"""Hugging Face parity of ModernBERT's decoder (archlab/interop/families/modernbert_decoder.py, model_type
modernbert-decoder): LayerNormed embeddings, a first layer without its attention norm, local and global
layers with RoPE per layer type, GeGLU MLPs and the dense + GELU + LayerNorm prediction head before the
decoder matrix.

A tiny random model (every weight, bias and norm scale redrawn) gives HF's float32 logits in archlab, maps
back to its family, round-trips bit for bit, generates as HF does (left-padded too, past the window) and
goes through save_pretrained directories; what the record cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# its config needs integer pad, bos, cls and sep ids: in the vocabulary, no eos (generation runs its length)
TOKENS = dict(NO_TOKENS, pad_token_id=0, bos_token_id=1, cls_token_id=1, sep_token_id=2)
SIZES = dict(HF_SIZES, num_hidden_layers=4, num_attention_heads=4, intermediate_size=96, **TOKENS)
BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True, decoder_bias=True)
# case -> (transformers model class, config class, config keys): windows of 4 on layers 1 and 2 (of 1 in 3 global)
HF_CASES = {
    "modernbert-decoder": (
        "ModernBertDecoderForCausalLM",
        "ModernBertDecoderConfig",
        dict(SIZES, **BIASES, local_attention=8, tie_word_embeddings=False),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "modernbert-decoder", seed, **EAGER)


globals().update(parity.family_tests(hf_model, impl=EAGER, only=parity.MAPPED_TESTS))


def test_the_layout_read():
    """Layer 0 alone without an attention norm; windows of local_attention // 2 = 4 on the sliding layers
    with their RoPE θ (10,000), the global layers' 160,000; a transform head of GELU over LayerNormed
    embeddings, GeGLU MLPs."""
    from archlab.config.layers import layer_configs

    model = from_hf(hf_model())
    assert [b.attn_norm is None for b in model.blocks] == [True, False, False, False]
    layers = [(lc.attention.window, lc.position.theta) for lc in layer_configs(model.cfg)]
    assert layers == [(None, 160000.0), (4, 10000.0), (4, 10000.0), (None, 160000.0)]
    cfg = model.cfg
    assert (cfg.head.kind, cfg.head.transform_activation, cfg.embedding_norm, cfg.mlp.kind) == (
        "transform", "gelu", True, "geglu"
    )  # fmt: skip


def test_a_tied_model_without_biases_converts_both_ways(tmp_path):
    """Its default head (the decoder matrix tied to the embeddings) and no biases anywhere, 7 layers (layer 0
    of its own kind, then local, local, global cycled): HF's logits, the round trip, its directory."""
    keys = dict(HF_CASES["modernbert-decoder"][2], num_hidden_layers=7, tie_word_embeddings=True)
    keys.update(dict.fromkeys(BIASES, False))
    hf = parity.randomize(
        transformers.ModernBertDecoderForCausalLM(transformers.ModernBertDecoderConfig(**keys, **EAGER)), 3
    )
    parity.check_converts_both_ways(hf, tmp_path, **EAGER)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_activation="silu"), "ModernBertDecoderConfig.hidden_activation"),
        (dict(mlp_dropout=0.1), "ModernBertDecoderConfig.mlp_dropout"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "modernbert-decoder", **changes)), field)


def test_every_layer_with_its_attention_norm_is_refused():
    cfg = from_hf(hf_model()).cfg
    cfg.layers.kinds = {k: {s: v for s, v in o.items() if s != "block"} for k, o in cfg.layers.kinds.items()}
    parity.check_family_refuses("modernbert-decoder", cfg, "model.block.attn_norm")
