"""What the mixer tests share (``test_mixer_contract.py``, the per-mixer files): each registered mixer's
tiny sizes (``TINY``, one line per kind), the tiny models built from them (every layer the mixer, or a
hybrid beside another kind), weights drawn far from their init, and decoding a sequence in pieces
through the KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from omegaconf import OmegaConf

from archlab.config import ModelConfig, to_model_config
from archlab.nn.mixers.base import MIXERS

# kind -> its model.attention fields at tiny sizes (d_model 32), where its own defaults are too large or leave
# a part untested; a mixer without a line runs at its defaults with the model's 4 heads
TINY: dict[str, dict] = {
    # 4 heads of 8, 2 key/value heads (GQA), both projections' biases
    "causal": {"n_head": 4, "n_kv_head": 2},
    # 4 heads of 8, 2 key/value heads, Dory's scaled gate and output norm; s_qk and s_gate stored as used (scale 1)
    "ngpt": {"n_head": 4, "n_kv_head": 2, "qk_scale_scale": 1.0, "gate": "elementwise", "gate_scale_init": 1.0}
    | {"gate_scale_scale": 1.0, "out_norm": True},
    # 4 heads of nope 6 + rope 4 (v 5), queries through a rank-8 bottleneck, keys and values from a 16-dim latent;
    # dots.3-note's parts (the latents scaled, the shared rotated key normed) and A.X K2's (queries and an
    # elementwise gate from [normed, raw] query latent)
    "mla": {"n_head": 4, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4}
    | {"v_head_dim": 5, "latent_scale": True, "rope_key_norm": True}
    | {"q_latent": "both", "gate": "elementwise", "gate_input": "q_latent"},
    # mla's sizes, and an indexer of 4 heads of 8 (4 of them rotated) keeping 5 keys of the 12 a query may see
    # blocks of 2 pooled keys, of which an indexer of 4 heads of 8 keeps 3 blocks (6 tokens) per query
    "qsa": {"n_head": 4, "head_dim": 8, "index_n_heads": 4, "index_head_dim": 8, "index_budget": 6, "index_ratio": 2},
    "dsa": {"n_head": 4, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4}
    | {"v_head_dim": 5, "index_n_heads": 4, "index_head_dim": 8, "index_topk": 5},
    # 4 value heads of 6, 2 query/key heads of 8, conv 4, chunks of 5
    "gated_deltanet": {"n_head": 4, "key_heads": 2, "key_head_dim": 8, "v_head_dim": 6, "scan_chunk": 5},
    # 4 heads of 8 channels, B and C of 6 in 2 groups, conv 4 with its bias, chunks of 5; projection biases on
    # (a padded position's inputs are then not zero by themselves)
    "mamba2": {"n_head": 4, "head_dim": 8, "state_size": 6, "groups": 2, "scan_chunk": 5}
    | {"qkv_bias": True, "out_bias": True},
    # 24 channels of state 6, Δ of rank 3, conv 4 with its bias, chunks of 4; projection biases on; Δ, B and C
    # RMS-normed with learned scales (Jamba's: parameters the plain mixer lacks)
    "mamba": {"inner": 24, "state_size": 6, "dt_rank": 3, "scan_chunk": 4, "bias": True}
    | {"bc_dt_norm": True, "bc_dt_norm_scale": True},
    # 24 channels in 4 gate blocks of 6, conv 4, chunks of 4
    "rglru": {"n_head": 4, "width": 24, "scan_chunk": 4},
    # 4 heads of 8, decay and output gate of rank 3, conv 4, chunks of 5
    "kda": {"n_head": 4, "head_dim": 8, "gate_rank": 3, "scan_chunk": 5},
    # 4 heads of 4 query/key and 8 value dims, chunks of 5, every bias on (use_bias)
    "mlstm": {"n_head": 4, "scan_chunk": 5, "bias": True},
    # 24 WKV channels (attention_hidden_size apart from d_model), chunks of 5
    "rwkv4": {"width": 24, "scan_chunk": 5},
    # attention of 4 heads over 2 key/value heads beside Mamba-2 of 3 heads of 8 (B and C of 6, chunks of 5), its
    # norm before the gate; every multiplier away from 1
    "parallel": {"n_head": 4, "attention": {"n_kv_head": 2}}
    | {"ssm": {"n_head": 3, "head_dim": 8, "state_size": 6, "scan_chunk": 5, "qkv_bias": True, "gate_norm": "before"}}
    | {"attention_in_multiplier": 0.75, "attention_out_multiplier": 1.5, "ssm_in_multiplier": 1.25}
    | {"ssm_out_multiplier": 0.5},
    # DeepSeek-V4's: 4 query heads of 8 (the trailing 4 rotated) over one key/value head, queries through rank 6,
    # the outputs in 2 groups each projected to 5; no window (tests/test_dsv4.py runs these checks sliding too);
    # CSA's blocks of 2, of which an indexer of 8 heads of 6 keeps 2 per query
    "dsv4": {"n_head": 4, "head_dim": 8, "qk_rope_head_dim": 4, "q_lora_rank": 6, "o_groups": 2}
    | {"o_lora_rank": 5, "window": None, "compress": "csa", "compress_rate": 2}
    | {"index_n_heads": 8, "index_head_dim": 6, "index_topk": 2},
    # 4 heads of 6 (not d_model / n_head), blocks of 5
    "lightning": {"n_head": 4, "head_dim": 6, "block_size": 5},
    # 3 experts of 4 query heads of 6 (not d_model / n_head), 2 per token, over 4 shared key/value heads
    "moa": {"n_head": 4, "head_dim": 6, "n_experts": 3, "top_k": 2},
}

# the model around the mixer: d_model 32, vocab 48, context 12, RoPE (a left-padded row's positions must be
# renumbered), RMSNorm, a bias-free SwiGLU of 48, an untied head
BASE = {
    "vocab_size": 48,
    "context_length": 12,
    "n_layer": 2,
    "d_model": 32,
    "norm": {"kind": "rmsnorm", "eps": 1e-5},
    "position": {"kind": "rope"},
    "mlp": {"kind": "swiglu", "d_ff": 48, "bias": False},
    "head": {"tied": False},
}


def tiny_attention(kind: str) -> dict:
    """``model.attention`` of ``kind`` at its tiny sizes (its own defaults and 4 heads without a line in
    ``TINY``)."""
    return {"kind": kind, "n_head": 4, **TINY.get(kind, {})}


def mixer_config(kind: str, **overrides) -> ModelConfig:
    """A model whose every layer is mixer ``kind`` at its tiny sizes (2 layers); ``overrides`` merged in."""
    return to_model_config(OmegaConf.merge(BASE, {"attention": tiny_attention(kind)}, overrides))


def partner(kind: str) -> str:
    """The mixer ``kind`` sits beside in a hybrid: causal attention, or for causal the first other kind."""
    return "causal" if kind != "causal" else next(k for k in MIXERS.names() if k != "causal")


def layered_config(kinds: dict[str, dict], pattern: list[str], **overrides) -> ModelConfig:
    """A causal model at its tiny sizes (or of the mixer ``overrides["attention"]`` gives) whose layers
    ``model.layers`` gives: ``kinds`` (name -> its fields) cycled by ``pattern``; ``overrides`` merged in."""
    layers = {"layers": {"kinds": kinds, "pattern": pattern}}
    attention = overrides.pop("attention", tiny_attention("causal"))
    return to_model_config(OmegaConf.merge(BASE, {"attention": attention}, layers, overrides))


def hybrid_config(kind: str) -> ModelConfig:
    """3 layers: ``kind``, its ``partner``, ``kind`` again, by ``model.layers`` over a causal model; each
    layer kind sets its mixer's tiny sizes (a recurrent kind resetting the softmax fields it refuses)."""
    kinds = {"mixer": {"attention": tiny_attention(kind)}, "other": {"attention": tiny_attention(partner(kind))}}
    return layered_config(kinds, ["mixer", "other"], n_layer=3)


def _vector(p: torch.Tensor) -> torch.Tensor:
    """Magnitudes uniform in [0.3, 2.3], signs drawn: away from 0 and 1, and a sum of products of two such
    vectors (differential attention's λ = exp(λq·λk) − ...) as likely negative as positive, not exp(~14)."""
    return (torch.rand_like(p) * 2 + 0.3) * (torch.randint_like(p, 2) * 2 - 1)


def randomise(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every weight redrawn far from its init: matrices (and convolutions, tables) N(0, 0.3²); vectors
    (biases, norm scales, A_log, dt_bias, D, sinks) ``_vector``'s, away from their 0 or 1; float buffers
    likewise. Seeds the global generator, so the same ``seed`` draws the same weights."""
    torch.manual_seed(seed)
    with torch.no_grad():
        tensors = [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]
        for p in tensors:
            p.copy_(_vector(p) if p.ndim <= 1 else torch.randn_like(p) * 0.3)
    return module


def decode_in_pieces(
    model: torch.nn.Module, idx: torch.Tensor, cuts: Sequence[int], mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The logits of ``idx`` ``[B, T]`` fed through one KV cache in pieces ending at each of ``cuts`` (the
    last is T): a prefill, then chunks or single tokens; ``mask`` ``[B, T]`` the padding (1: a token)."""
    cache, start, out = model.new_cache(idx.shape[0], idx.shape[1]), 0, []
    with torch.no_grad():
        for end in cuts:
            out.append(model(idx[:, start:end], cache, None if mask is None else mask[:, :end]))
            start = end
    assert cache.length == idx.shape[1]
    return torch.cat(out, dim=1)


def check_trains_then_decodes_in_pieces(model: torch.nn.Module, idx: torch.Tensor, cuts: Sequence[int]) -> None:
    """8 AdamW steps on the fixed batch ``idx`` lower the loss by more than 0.2; then, every weight
    randomised, the logits decoded in pieces ending at ``cuts`` (``decode_in_pieces``) equal the whole
    sequence's. Leaves ``model`` randomised, in eval mode."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.2, losses
    randomise(model, seed=6).eval()
    with torch.no_grad():
        whole = model(idx)
    torch.testing.assert_close(decode_in_pieces(model, idx, cuts), whole, rtol=1e-4, atol=1e-4)


def assert_relative(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    """``actual`` within ``tolerance`` of ``expected``'s largest magnitude everywhere, compared in float32."""
    error = ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    assert error <= tolerance, f"{what}: {error:.2e} of its largest value"
