"""The decoder's own parts around its blocks (archlab/nn/model.py, with the head of archlab/nn/head.py):
the token embeddings' width (``model.embedding_dim``, OPT-350m's, projected in and out), their norm
(``model.embedding_norm``, BLOOM's) and Granite's multipliers (embeddings ``model.embedding_multiplier``,
sublayer outputs ``model.block.residual_multiplier`` in every block kind, scores
``model.attention.scale``, logits ``model.head.logit_scale``, Cohere's too): each compared with an
independent expression written out here (float64, every weight random, norm scales and biases far from 1
and 0), its closed-form count, its validation, its Hugging Face refusal, a short fit and KV-cache
generation."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import parts
from helpers.parts import short_fit
from omegaconf import OmegaConf

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.accounting import check_build
from archlab.build import compose
from archlab.cli.check import run
from archlab.config import ModelConfig, to_model_config
from archlab.interop.families.dense import dense_family
from archlab.interop.hf import FAMILIES
from archlab.nn.validation import ignored, uses, validate

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


# ---- Granite's multipliers


def rms(x, w):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


@pytest.mark.parametrize("embedding_norm", [False, True])
def test_embedding_multiplier_scales_the_token_embeddings_before_the_positions(embedding_norm):
    """Times m_e after any embedding norm (a multiplier before a norm would be undone by it)."""
    cfg = tiny(embedding_multiplier=3.5, embedding_norm=embedding_norm)
    model, idx = build(cfg), tokens(cfg, T=6)
    x, _ = block_input(model, idx)
    rows = model.tok_emb.weight[idx]
    if embedding_norm:
        rows = layer_norm(rows, model.embedding_norm.weight, model.embedding_norm.bias)
    torch.testing.assert_close(x, rows * 3.5 + model.position.table.weight[:6])


def hand_block(kind, block, x, m):
    """Block ``kind`` written out: LayerNorms by hand, attention and MLP as the block's own sublayers,
    each sublayer's output times m where it joins the residual stream."""

    def norm(name, h):
        n = getattr(block, name)
        return layer_norm(h, n.weight, n.bias)

    def attn(h):
        return block.attn(h, None, None, None, 0)

    if kind == "pre":
        x = x + m * attn(norm("attn_norm", x))
        return x + m * block.mlp(norm("mlp_norm", x))
    if kind == "post":
        x = norm("attn_norm", x + m * attn(x))
        return norm("mlp_norm", x + m * block.mlp(x))
    if kind in ("parallel", "parallel_two_norms"):
        h = norm("attn_norm", x)
        return x + m * attn(h) + m * block.mlp(h if kind == "parallel" else norm("mlp_norm", x))
    if kind == "post_sublayer":
        x = x + m * norm("attn_out_norm", attn(x))
        return x + m * norm("mlp_out_norm", block.mlp(x))
    assert kind == "sandwich"
    x = x + m * norm("attn_out_norm", attn(norm("attn_norm", x)))
    return x + m * norm("mlp_out_norm", block.mlp(norm("mlp_norm", x)))


KINDS = ["pre", "post", "parallel", "parallel_two_norms", "post_sublayer", "sandwich"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_block_kind_multiplies_each_sublayer_output_by_the_residual_multiplier(kind):
    block_cfg = {"kind": "parallel", "shared_norm": False} if kind == "parallel_two_norms" else {"kind": kind}
    cfg = tiny(block={**block_cfg, "residual_multiplier": 0.37}, position={"kind": "none"})
    model = build(cfg)
    x = torch.randn(2, 6, 16, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model.blocks[0](x), hand_block(kind, model.blocks[0], x, 0.37))
        plain = tiny(block=block_cfg, position={"kind": "none"})
        assert not torch.allclose(model.blocks[0](x), build(plain).blocks[0](x))  # same weights, m = 1
    assert uses(cfg, "block.residual_multiplier") and ignored(cfg) == []
    assert count_params(cfg) == count_params(plain)  # no parameters


def test_logit_scale_multiplies_the_logits_before_the_softcap():
    cfg = tiny(head={"tied": False, "bias": True, "logit_scale": 0.25, "softcap": 4.0})
    model, idx = build(cfg), tokens(cfg, T=5)
    x, out = block_input(model, idx)
    with torch.no_grad():
        raw = model.final_norm(model.blocks[0](x)) @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(out, 4.0 * torch.tanh(raw * 0.25 / 4.0))


def test_granite_multipliers_together_against_a_forward_written_out():
    """Granite 3's forward of one pre-norm layer: x = E[ids]·m_e; x += m_r·attn(rms(x)) with scores
    q·k·attention_multiplier; x += m_r·swiglu(rms(x)); logits = rms(x)·Eᵀ / logits_scaling."""
    m_e, m_r, scale, logits_scaling = 12.0, 0.22, 0.0156, 8.0
    cfg = tiny(
        embedding_multiplier=m_e,
        norm={"kind": "rmsnorm"},
        block={"residual_multiplier": m_r},
        position={"kind": "none"},
        attention={"scale": scale, "qkv_bias": False, "out_bias": False},
        mlp={"kind": "swiglu", "bias": False},
        head={"logit_scale": 1 / logits_scaling},
    )
    model, idx = build(cfg), tokens(cfg, T=7)
    block, E = model.blocks[0], model.tok_emb.weight
    B, T, H, hd = 2, 7, 2, 8
    with torch.no_grad():
        x = E[idx] * m_e
        q, k, v = (rms(x, block.attn_norm.weight) @ block.attn.qkv.weight.T).split(H * hd, dim=-1)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~torch.ones(T, T).tril().bool(), -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + m_r * (y @ block.attn.proj.weight.T)
        gate, up = (rms(x, block.mlp_norm.weight) @ block.mlp.gate_up.weight.T).chunk(2, dim=-1)
        x = x + m_r * ((F.silu(gate) * up) @ block.mlp.down.weight.T)
        expected = rms(x, model.final_norm.weight) @ E.T / logits_scaling
        torch.testing.assert_close(model(idx), expected)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"embedding_multiplier": 0.0}, "model.embedding_multiplier"),
        ({"embedding_multiplier": float("nan")}, "model.embedding_multiplier"),
        ({"block": {"residual_multiplier": -1.0}}, "model.block.residual_multiplier"),
        ({"head": {"logit_scale": 0.0}}, "model.head.logit_scale"),
        ({"head": {"logit_scale": float("inf")}}, "model.head.logit_scale"),
    ],
)
def test_a_multiplier_must_be_a_positive_number(settings, field):
    with pytest.raises(ConfigError) as err:
        validate(tiny(**settings))
    assert err.value.field == field and "a positive number" in str(err.value)


def test_gemmas_sqrt_d_and_a_general_embedding_multiplier_are_one_factor():
    validate(tiny(scale_embedding=True, embedding_multiplier=1.0))
    with pytest.raises(ConfigError) as err:
        validate(tiny(scale_embedding=True, embedding_multiplier=2.0))
    assert err.value.field == "model.embedding_multiplier"
    assert "1.0 while model.scale_embedding is true" in str(err.value)


@pytest.mark.parametrize(
    "settings",
    [{"embedding_multiplier": 3.0}, {"block": {"residual_multiplier": 0.5}}, {"head": {"logit_scale": 0.5}}],
    ids=["embedding_multiplier", "residual_multiplier", "logit_scale"],
)
def test_each_multiplier_keeps_the_counts_is_refused_by_hf_trains_and_decodes(settings):
    cfg = tiny(**settings)
    assert count_params(cfg) == count_params(tiny())
    section, value = next(iter(settings.items()))
    field = f"model.{section}" if not isinstance(value, dict) else f"model.{section}.{next(iter(value))}"
    refused_by_gpt2(cfg, field)
    fits(cfg)
    cached_equals_full(cfg)


# ---- model.embedding_dim (OPT's word_embed_proj_dim)


def test_embedding_dim_projects_in_before_the_blocks_and_out_before_the_head():
    """The first block reads project_in(E[idx]) + the position row; the logits are the head's of
    project_out(final_norm(last block's output)), each written out here."""
    cfg = parts.tiny(embedding_dim=20, position={"kind": "learned"}, head={"tied": True})
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64).eval()
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.setdefault("first", args[0]))
    model.blocks[-1].register_forward_hook(lambda m, args, out: seen.setdefault("last", out))
    idx = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(idx)
    assert model.project_in is not None and model.project_out is not None and model.final_norm is not None
    E, W_in, W_out = model.tok_emb.weight, model.project_in.weight, model.project_out.weight
    assert E.shape == (48, 20) and W_in.shape == (32, 20) and W_out.shape == (20, 32)
    table = model.position.get_submodule("table").get_parameter("weight")
    torch.testing.assert_close(seen["first"], E[idx] @ W_in.T + table[:10])
    hidden = F.rms_norm(seen["last"], (32,), model.final_norm.get_parameter("weight"), 1e-3)
    torch.testing.assert_close(out, hidden @ W_out.T @ E.T)


def test_embedding_dim_is_counted_in_closed_form_and_validated():
    V, d, e = 48, 32, 20
    for tied in (True, False):
        cfg = parts.tiny(embedding_dim=e, head={"tied": tied})
        counts, plain = count_params(cfg), count_params(parts.tiny(head={"tied": tied}))
        assert counts["token_embedding"] == V * e and counts["embedding_projection"] == 2 * e * d
        assert counts["head"] == (0 if tied else V * e) and plain["embedding_projection"] == 0
        assert counts["total"] - plain["total"] == (V * e - V * d) * (1 if tied else 2) + 2 * e * d
        check_build(cfg, build_model(cfg, device="meta"))
    for bad in (0, -3, 2.5, True, "16", 32):  # 32 = d_model: no projection to add
        with pytest.raises(ConfigError) as err:
            validate(dataclasses.replace(parts.tiny(), embedding_dim=bad))
        assert err.value.field == "model.embedding_dim"


def test_archlab_check_counts_gpt2_with_narrower_embeddings_in_closed_form(capsys):
    """GPT-2 small (124,439,808) with token embeddings of 256: the table shrinks to 50257·256 and the
    projections add 2·256·768. OPT holds the projections; it drops no embeddings, so GPT-2's embedding
    dropout goes (model.embedding_dropout=0.0) for it to hold the rest."""
    overrides = ["model=gpt2", "model.embedding_dim=256", "model.embedding_dropout=0.0", "format=json"]
    assert run(compose("check", overrides), overrides) == 0
    result = json.loads(capsys.readouterr().out)
    total = 124_439_808 - 50257 * 768 + 50257 * 256 + 2 * 256 * 768
    assert result["analytic"]["total"] == result["built"]["total"] == total
    assert result["analytic"]["embedding_projection"] == 2 * 256 * 768
    assert result["hf_export"]["exports_to"] == "OPTForCausalLM"


def test_embedding_dim_trains_and_decodes_through_the_cache():
    cfg = parts.tiny(embedding_dim=20, head={"tied": False})
    torch.manual_seed(0)
    model = build_model(cfg)
    losses = short_fit(model, cfg.vocab_size, 16)
    assert losses[-1] < losses[0]
    assert model.project_in is not None and model.project_out is not None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        steps = [model(idx[:, :5], cache)] + [model(idx[:, t : t + 1], cache) for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


# ---- Gemma's scaled embeddings and the logits' soft-cap


def test_scaled_embedding_and_logit_softcap():
    cfg = parts.plain(n_layer=1, scale_embedding=True, head={"softcap": 3.0, "tied": False})
    model, idx = parts.build(cfg), parts.tokens(cfg, T=6)
    captured = {}
    model.blocks[0].register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0]))
    with torch.no_grad():
        out = model(idx)
        raw = model.final_norm(model.blocks[0](captured["x"])) @ model.head.weight.T
    torch.testing.assert_close(captured["x"], model.tok_emb.weight[idx] * math.sqrt(32))
    torch.testing.assert_close(out, 3.0 * torch.tanh(raw / 3.0))
    assert out.abs().max() < 3.0


@pytest.mark.parametrize("overrides, field", [(["model.head.softcap=0"], "model.head.softcap")])
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        compose_model(["model=nano", *overrides])
    assert info.value.field == field
