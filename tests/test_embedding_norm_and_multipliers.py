"""BLOOM's norm on the token embeddings (``model.embedding_norm``): each compared with an independent
expression written out here (float64, every weight random, norm scales and biases far from 1 and 0), its
closed-form count, its validation, its Hugging Face refusal, a short fit and KV-cache generation."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from archlab import ConfigError, build_model, count_params
from archlab.config import ModelConfig, to_model_config
from archlab.interop.hf import FAMILIES
from archlab.interop.hf_families import dense_family
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
EPS = 1e-5


def tiny(**overrides):
    """d_model 16, 2 heads of 8, 1 layer, vocab 40, context 12, LayerNorm with bias, learned positions."""
    base = {"vocab_size": 40, "context_length": 12, "n_layer": 1, "d_model": 16, "attention": {"n_head": 2}}
    return to_model_config(OmegaConf.merge(base, overrides))


def build(cfg, seed=0):
    """A float64 model, every weight random: norm scales around 1.5 and biases around 0.5, far from 1 and 0."""
    torch.manual_seed(seed)
    model = build_model(cfg, dtype=F64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (0.5 if p.ndim == 1 else 0.0))
            if p.ndim == 1 and p.shape[0] == cfg.d_model:
                p.add_(1.0)  # d_model-wide vectors: norm scales, biases: ~1.5
    return model


def tokens(cfg, T=None, B=2, seed=0):
    return torch.randint(0, cfg.vocab_size, (B, T or cfg.context_length), generator=torch.Generator().manual_seed(seed))


def block_input(model, idx):
    """The hidden state the first block receives, and the logits."""
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.setdefault("x", args[0]))
    with torch.no_grad():
        out = model(idx)
    return seen["x"], out


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + EPS) * w + b


def fits(cfg):
    """Five AdamW steps on one batch lower the loss, and every parameter gets a gradient."""
    torch.manual_seed(0)
    model = build_model(cfg)
    idx = tokens(cfg, T=cfg.context_length + 1, B=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def cached_equals_full(cfg):
    """Logits of a prompt then three tokens one at a time through the KV cache equal the full forward's."""
    model, idx = build(cfg), tokens(cfg, T=8)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(idx.shape[0])
        steps = [model(idx[:, :5], cache)] + [model(idx[:, t : t + 1], cache) for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def refused_by_gpt2(cfg, field):
    """The Hugging Face family the layout routes to (GPT-2's) refuses ``field``, naming it."""
    with pytest.raises(ConfigError) as err:
        FAMILIES[dense_family(cfg).model_type].check(cfg)
    assert err.value.field == field and "Hugging Face" in str(err.value)


# ---- model.embedding_norm


def test_embedding_norm_normalises_the_looked_up_rows_before_the_positions_are_added():
    cfg = tiny(embedding_norm=True, head={"tied": False})
    model, idx = build(cfg), tokens(cfg, T=7)
    x, _ = block_input(model, idx)
    norm = model.embedding_norm
    expected = layer_norm(model.tok_emb.weight[idx], norm.weight, norm.bias) + model.position.table.weight[:7]
    torch.testing.assert_close(x, expected)


def test_a_tied_head_reads_the_table_not_its_normed_rows():
    """Why a field and not LN folded into the table: a tied head multiplies by E itself."""
    cfg = tiny(embedding_norm=True, position={"kind": "none"})
    model, idx = build(cfg), tokens(cfg, T=5)
    x, out = block_input(model, idx)
    with torch.no_grad():
        h = model.final_norm(model.blocks[0](x))
    torch.testing.assert_close(out, h @ model.tok_emb.weight.T)


@pytest.mark.parametrize(("norm", "per_norm"), [({"kind": "layernorm"}, 32), ({"kind": "rmsnorm"}, 16)])
def test_embedding_norm_counts_one_norm_of_the_model_kind(norm, per_norm):
    cfg, plain = tiny(embedding_norm=True, norm=norm), tiny(norm=norm)
    counts = count_params(cfg)
    assert counts["embedding_norm"] == per_norm and count_params(plain)["embedding_norm"] == 0
    assert counts["total"] - count_params(plain)["total"] == per_norm
    assert counts["non_embedding"] - count_params(plain)["non_embedding"] == per_norm  # a norm, not a table
    assert sum(p.numel() for p in build_model(cfg, device="meta").embedding_norm.parameters()) == per_norm


def test_embedding_norm_is_validated_refused_by_hf_trains_and_decodes():
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig(embedding_norm="yes"))  # pyright: ignore[reportArgumentType]
    assert err.value.field == "model.embedding_norm" and "true or false" in str(err.value)
    cfg = tiny(embedding_norm=True)
    refused_by_gpt2(cfg, "model.embedding_norm")
    fits(cfg)
    cached_equals_full(cfg)
