"""What the effect tests of model parts share: tiny configs to vary (``tiny``, ``plain``, ``nano``), float64
models with every weight random and their inputs, the attention sublayer written out (``reference_attention``),
LongRoPE's test scaling, and a short fit on one repeated batch (the check that a part trains: ``check_fits``,
``check_trains``)."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from archlab import build_model, compose_model
from archlab.config import POSITION_OPTIONS, ModelConfig, to_model_config

F64 = torch.float64
# layers 1, 3, ... global, the others the model's window: Gemma 2's layout (conf/model/layers/every_other_global)
EVERY_OTHER_GLOBAL = {"kinds": {"local": {}, "global": {"attention": {"window": None}}}, "pattern": ["local", "global"]}
# LongRoPE over heads of 16 rotated whole (8 pairs), switching to its long factors past 16 positions
SHORT = [1.0 + 0.1 * i for i in range(8)]
LONG = [1.0 + 0.7 * i for i in range(8)]
LONGROPE = dict(scaling=dict(kind="longrope", short_factor=SHORT, long_factor=LONG, original_context=16, factor=4.0))


def tiny(**overrides) -> ModelConfig:
    """d_model 32, 4 heads of 8 (2 key/value heads), 2 layers, vocab 48, context 24, RMSNorm (eps 1e-3), no
    positions; ``overrides`` merged in (``attention={"sinks": True}``; an attention of another kind in place
    of the causal one, keeping its 4 heads)."""
    attention = {"n_head": 4, "n_kv_head": 2}
    if overrides.get("attention", {}).get("kind", "causal") != "causal":
        attention = {"n_head": 4}  # the causal kind's key/value heads are no field of another mixer
    base = {
        "vocab_size": 48,
        "context_length": 24,
        "n_layer": 2,
        "d_model": 32,
        "norm": {"kind": "rmsnorm", "eps": 1e-3},
        "position": {"kind": "none"},
        "attention": attention,
    }
    return to_model_config(OmegaConf.merge(base, overrides))


def short_fit(model: torch.nn.Module, vocab: int, length: int, steps: int = 15, lr: float = 3e-3) -> list[float]:
    """Losses of ``steps`` AdamW steps on 4 seeded sequences of ``length`` + 1 tokens (next-token targets);
    the gradients of the last step stay on the parameters for the caller to inspect."""
    idx = torch.randint(0, vocab, (4, length + 1), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def longrope(**scaling) -> dict:
    """LONGROPE with these fields of its scaling changed."""
    return {"scaling": {**LONGROPE["scaling"], **scaling}}


def plain(**overrides) -> ModelConfig:
    """d_model 32, 4 heads of 8 (one key/value head each), 2 layers, vocab 48, context 16, RMSNorm at its
    default eps, no positions; ``overrides`` merged in."""
    base = {
        "vocab_size": 48,
        "context_length": 16,
        "n_layer": 2,
        "d_model": 32,
        "norm": {"kind": "rmsnorm"},
        "position": {"kind": "none"},
        "attention": {"n_head": 4},
    }
    return to_model_config(OmegaConf.merge(base, overrides))


@functools.cache
def _nano() -> ModelConfig:
    return compose_model(["model=nano", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4",
                          "model.context_length=32", "model.vocab_size=64"])  # fmt: skip


def nano(kind: str, n_head: int = 4, **position) -> ModelConfig:
    """The nano preset with 2 layers, ``n_head`` heads of 16, context 32, vocab 64, and this position scheme
    (``kind`` and its fields)."""
    cfg = _nano()
    attention = dataclasses.replace(cfg.attention, n_head=n_head)
    return dataclasses.replace(cfg, d_model=16 * n_head, attention=attention,
                               position=POSITION_OPTIONS.make(kind=kind, **position))  # fmt: skip


def build(cfg, seed: int = 0):
    """A float64 model with every weight random: matrices N(0, 0.3²), vectors (biases, norm scales, sinks)
    0.5 + N(0, 0.3²), far from their init of 1 or 0 (so sinks sit far from 0 and gates' sigmoids spread
    over (0, 1))."""
    torch.manual_seed(seed)
    model = build_model(cfg, dtype=F64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (0.5 if p.ndim == 1 else 0.0))
    return model


def randomise(module, seed: int = 0):
    """``module`` with every weight random: matrices N(0, 0.3²), vectors (biases, norm scales)
    0.5 + N(0, 0.3²), far from their init, so a scale read from the wrong head or a missed bias fails."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (0.5 if p.ndim == 1 else 0.0))
    return module


def tokens(cfg, T: int | None = None, B: int = 2, seed: int = 0) -> torch.Tensor:
    """``B`` rows of ``T`` (by default the context's) seeded token ids."""
    T = T or cfg.context_length
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def inputs(T: int = 9, d: int = 32, dtype=F64, seed: int = 1) -> torch.Tensor:
    """Seeded hidden states ``[2, T, d]``."""
    return torch.randn(2, T, d, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attention(q, k, v, scale, softcap=None, visible=None):
    """softmax(cap(q·k·scale) masked) · v, queries and keys ``[B, H, T, hd]`` (keys repeated for GQA)."""
    s = q @ k.transpose(-2, -1) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    T = q.shape[2]
    visible = torch.ones(T, T, dtype=torch.bool).tril() if visible is None else visible
    return torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) @ v


def reference_attention(attn, x, norm_eps, qk_norm="none", softcap=None, scale=None, visible=None):
    """The attention sublayer written out from its weights: project, QK-norm (RMSNorm, per head or over the
    projection), attend, project back."""
    B, T, _ = x.shape
    H, KV, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
    if qk_norm == "full":
        q, k = rms(q, attn.q_norm.weight, norm_eps), rms(k, attn.k_norm.weight, norm_eps)
    q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    if qk_norm == "head":
        q, k = rms(q, attn.q_norm.weight, norm_eps), rms(k, attn.k_norm.weight, norm_eps)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    y = attention(q, k, v, scale if scale is not None else 1 / math.sqrt(hd), softcap, visible)
    return y.transpose(1, 2).reshape(B, T, H * hd) @ attn.proj.weight.T + (
        attn.proj.bias if attn.proj.bias is not None else 0
    )


def check_fits(cfg, length: int, steps: int = 15, every_grad: bool = False) -> None:
    """A few AdamW steps (``short_fit``) on one repeated batch of ``length`` tokens lower the loss by a
    tenth (and, with ``every_grad``, a gradient reaches every trainable parameter)."""
    torch.manual_seed(0)
    model = build_model(cfg)
    losses = short_fit(model, cfg.vocab_size, length, steps=steps)
    if every_grad:
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert losses[-1] < 0.9 * losses[0]


def check_trains(overrides: list[str], n_layer: int, length: int, steps: int) -> None:
    """The nano preset with d_model 32, ``n_layer`` layers, a context of ``length`` and ``overrides`` trains
    (``check_fits``, every parameter reached by a gradient)."""
    nano_cfg = ["model=nano", f"model.n_layer={n_layer}", "model.d_model=32", f"model.context_length={length}"]
    check_fits(compose_model([*nano_cfg, *overrides]), length, steps, every_grad=True)
