"""``model.embedding_dropout``: the embeddings' dropout rate apart from ``model.dropout`` (null: the same
rate), its validation, and the Hugging Face families whose embedding and residual dropouts differ (GPT-2,
GPT-J, Phi, GPTBigCode and StarCoder 2 with two rates; OPT, BLOOM and Phi-3 dropping no embeddings), each
read into the two fields and written back as the same values."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.hf import NO_TOKENS
from omegaconf import OmegaConf

from archlab import ConfigError, build_model
from archlab.config import to_model_config
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def tiny(**overrides):
    """d_model 16, 2 heads, 2 layers, vocab 40, context 12, learned positions."""
    base = {"vocab_size": 40, "context_length": 12, "n_layer": 2, "d_model": 16, "attention": {"n_head": 2}}
    return to_model_config(OmegaConf.merge(base, overrides))


def block_inputs(model, idx, seed):
    """What the first block receives and the logits, of one forward after ``torch.manual_seed(seed)``."""
    seen = []
    hook = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    torch.manual_seed(seed)
    logits = model(idx)
    hook.remove()
    return seen[0], logits


def model_and_tokens(cfg):
    torch.manual_seed(0)
    model = build_model(cfg, dtype=F64)
    idx = torch.randint(0, cfg.vocab_size, (4, cfg.context_length), generator=torch.Generator().manual_seed(1))
    return model, idx


def test_embedding_dropout_drops_the_embeddings_as_a_dropout_of_that_rate():
    """Train mode, embedding_dropout 0.4 and no other dropout: the first block's input is the embeddings
    (token + position rows, as eval mode passes them) through F.dropout(p=0.4) drawn from the same seed,
    about 40% of them zero and the rest scaled by 1/0.6."""
    cfg = tiny(embedding_dropout=0.4)
    model, idx = model_and_tokens(cfg)
    model.eval()
    embeddings, _ = block_inputs(model, idx, seed=5)
    torch.testing.assert_close(embeddings, model.tok_emb(idx) + model.position.table.weight[: idx.shape[1]])
    model.train()
    dropped, _ = block_inputs(model, idx, seed=5)
    torch.manual_seed(5)
    expected = F.dropout(embeddings, p=0.4, training=True)
    torch.testing.assert_close(dropped, expected, rtol=0, atol=0)
    zeroed = (dropped == 0).double().mean().item()
    assert 0.33 < zeroed < 0.47
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], embeddings[kept] / 0.6)
    assert all(block.drop.p == 0.0 for block in model.blocks)  # model.dropout 0: the blocks drop nothing


def test_embedding_dropout_zero_leaves_the_embeddings_while_the_blocks_still_drop():
    cfg = tiny(dropout=0.5, embedding_dropout=0.0)
    model, idx = model_and_tokens(cfg)
    model.eval()
    embeddings, clean = block_inputs(model, idx, seed=3)
    model.train()
    first, a = block_inputs(model, idx, seed=3)
    second, b = block_inputs(model, idx, seed=4)
    torch.testing.assert_close(first, embeddings, rtol=0, atol=0)
    torch.testing.assert_close(second, embeddings, rtol=0, atol=0)
    assert (a - b).abs().max() > 1e-3 and (a - clean).abs().max() > 1e-3  # residual dropout still drops


def test_null_embedding_dropout_is_model_dropout():
    """Null (every earlier config) drops the embeddings at model.dropout's rate: the same masks as
    embedding_dropout set to that rate, and a model other than embedding_dropout 0."""
    same, idx = model_and_tokens(tiny(dropout=0.3))
    spelled, _ = model_and_tokens(tiny(dropout=0.3, embedding_dropout=0.3))
    same.train(), spelled.train()
    x, a = block_inputs(same, idx, seed=7)
    y, b = block_inputs(spelled, idx, seed=7)
    torch.testing.assert_close((x, a), (y, b), rtol=0, atol=0)
    assert (x == 0).any()
    assert tiny().embedding_dropout is None and ignored(tiny(embedding_dropout=0.1)) == []


@pytest.mark.parametrize("value", [1.0, -0.1, float("nan"), float("inf"), True])
def test_embedding_dropout_must_be_a_probability(value):
    cfg = dataclasses.replace(tiny(), embedding_dropout=value)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.field == "model.embedding_dropout"
    assert "a probability in [0, 1), or null" in str(err.value)


@pytest.mark.parametrize("value", [None, 0.0, 0.5])
def test_embedding_dropout_accepts_null_and_probabilities(value):
    assert validate(tiny(embedding_dropout=value)).embedding_dropout == value


# ---------------------------------------------------------------- Hugging Face

GPT = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, **NO_TOKENS)
LLAMA_LIKE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    **NO_TOKENS,
)
OPT = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    ffn_dim=64,
    max_position_embeddings=32,
    enable_bias=False,
    **NO_TOKENS,
)
BLOOM = dict(vocab_size=64, hidden_size=32, n_layer=2, n_head=4, **NO_TOKENS)

# config class, its keys, then (HF key, value) of each dropout, and archlab's (dropout, embedding_dropout)
HF_DROPOUTS = {
    "gpt2": ("GPT2Config", GPT, {"resid_pdrop": 0.1, "embd_pdrop": 0.25}, (0.1, 0.25)),
    "gpt2-no-embedding": ("GPT2Config", GPT, {"resid_pdrop": 0.1, "embd_pdrop": 0.0}, (0.1, 0.0)),
    "gpt2-one-rate": ("GPT2Config", GPT, {"resid_pdrop": 0.1, "embd_pdrop": 0.1}, (0.1, None)),
    "gptj": ("GPTJConfig", dict(GPT, rotary_dim=4), {"resid_pdrop": 0.0, "embd_pdrop": 0.2}, (0.0, 0.2)),
    "phi": (
        "PhiConfig",
        dict(LLAMA_LIKE, num_key_value_heads=4),
        {"resid_pdrop": 0.1, "embd_pdrop": 0.0},
        (0.1, 0.0),
    ),
    "gpt_bigcode": ("GPTBigCodeConfig", GPT, {"resid_pdrop": 0.05, "embd_pdrop": 0.15}, (0.05, 0.15)),
    "starcoder2": (
        "Starcoder2Config",
        LLAMA_LIKE,
        {"residual_dropout": 0.1, "embedding_dropout": 0.3},
        (0.1, 0.3),
    ),
    "opt": ("OPTConfig", OPT, {"dropout": 0.1}, (0.1, 0.0)),
    "opt-no-dropout": ("OPTConfig", OPT, {"dropout": 0.0}, (0.0, None)),
    "bloom": ("BloomConfig", BLOOM, {"hidden_dropout": 0.2}, (0.2, 0.0)),
    "phi3": ("Phi3Config", LLAMA_LIKE, {"resid_pdrop": 0.1, "embd_pdrop": 0.0}, (0.1, 0.0)),
}


@pytest.mark.parametrize("case", list(HF_DROPOUTS))
def test_hf_embedding_and_residual_dropouts_read_exactly_and_write_back(case):
    config_class, keys, rates, expected = HF_DROPOUTS[case]
    hf = getattr(transformers, config_class)(**keys, **rates)
    cfg = config_from_hf(hf)
    assert (cfg.dropout, cfg.embedding_dropout) == expected
    back = config_to_hf(cfg)
    assert type(back) is type(hf)
    assert {k: getattr(back, k) for k in rates} == rates


def test_phi3_never_reads_embd_pdrop():
    """transformers' Phi-3 has no embedding dropout (its modeling never reads ``embd_pdrop``): a
    config's embd_pdrop changes nothing, and the record writes it 0.0."""
    _, keys, _, _ = HF_DROPOUTS["phi3"]
    cfg = config_from_hf(transformers.Phi3Config(**keys, resid_pdrop=0.1, embd_pdrop=0.3))
    assert (cfg.dropout, cfg.embedding_dropout) == (0.1, 0.0)
    assert config_to_hf(cfg).embd_pdrop == 0.0


def test_a_pre_norm_opt_with_biases_goes_to_gpt2_without_embedding_dropout():
    """OPT's layout with biases is GPT-2's: its dropout is GPT-2's resid_pdrop, embd_pdrop 0."""
    cfg = config_from_hf(transformers.OPTConfig(**dict(OPT, enable_bias=True), dropout=0.1))
    back = config_to_hf(cfg)
    assert (type(back).__name__, back.resid_pdrop, back.embd_pdrop) == ("GPT2Config", 0.1, 0.0)


# a config each family reads, and the embedding_dropout it cannot hold beside that config's model.dropout
REFUSED = {
    "llama": ("LlamaConfig", LLAMA_LIKE, 0.1),  # no dropout at all
    "llama-spelled-zero": ("LlamaConfig", LLAMA_LIKE, 0.0),  # the absent value is null
    "gpt_neox": ("GPTNeoXConfig", dict(LLAMA_LIKE, num_key_value_heads=4, hidden_dropout=0.1), 0.0),  # one rate
    "opt": ("OPTConfig", dict(OPT, dropout=0.1), None),  # null: the embeddings at 0.1, which OPT never drops
    "opt-no-dropout": ("OPTConfig", dict(OPT, dropout=0.0), 0.1),
    "opt-spelled-zero": ("OPTConfig", dict(OPT, dropout=0.0), 0.0),  # without dropout, one spelling: null
    "bloom": ("BloomConfig", dict(BLOOM, hidden_dropout=0.1), None),
    "phi3": ("Phi3Config", dict(LLAMA_LIKE, resid_pdrop=0.1), 0.05),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_family_that_cannot_hold_the_embedding_dropout_refuses_it(case):
    config_class, keys, value = REFUSED[case]
    hf = getattr(transformers, config_class)(**keys)
    cfg = dataclasses.replace(config_from_hf(hf), embedding_dropout=value)
    family = FAMILIES[hf.model_type]
    assert [p.field for p in family.problems(cfg)] == ["model.embedding_dropout"]
    with pytest.raises(ConfigError) as err:
        family.check(cfg)
    assert err.value.field == "model.embedding_dropout" and f"Hugging Face {family.title}" in str(err.value)
    with pytest.raises(ConfigError):  # nor does any other family hold it
        config_to_hf(cfg)
