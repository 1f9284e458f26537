"""Shared blocks (``model.layers.shared``): weight-shared transformer blocks run before some layers, Zamba's
[hidden, embeddings] blocks. Their check, the uses (which layer each precedes, which block it runs), the
sizes the model, the closed-form counts and the KV cache read, and the fields left unread without a use."""

from __future__ import annotations

from typing import Any

from archlab import checks
from archlab.config.model import ModelConfig, SharedConfig
from archlab.errors import ConfigError


def shared_uses(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(layer, block) of each use, in order: block ``u mod blocks`` for the u-th layer listed (round-robin)."""
    s = cfg.layers.shared
    return [(layer, u % s.blocks) for u, layer in enumerate(s.layers)]


def shared_head_dim(cfg: ModelConfig) -> int:
    """A shared head's width: 2·d_model / n_head (the heads split the concatenation [hidden, embeddings])."""
    return 2 * cfg.d_model // cfg.layers.shared.n_head


def shared_kv_head(cfg: ModelConfig) -> int:
    s = cfg.layers.shared
    return s.n_head if s.n_kv_head is None else s.n_kv_head


def shared_d_ff(cfg: ModelConfig) -> int:
    s = cfg.layers.shared
    return 4 * cfg.d_model if s.d_ff is None else s.d_ff


def check_shared(cfg: ModelConfig) -> None:
    """``layers`` increasing layer indices, ``blocks`` at most as many as the uses, heads that split 2·d_model
    (an even width with RoPE), key/value heads dividing them, positive widths and a non-negative rank; the
    model's blocks pre-norm (a use joins a layer's input before its norm), one residual stream, no loop."""
    s, n = cfg.layers.shared, cfg.n_layer
    if not s.layers:
        return
    where = "model.layers.shared"
    allowed = f"increasing layer indices in [0, model.n_layer={n}), or [] for no shared block"
    layers = list(s.layers)
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n for i in layers):
        raise ConfigError(f"{where}.layers", layers, allowed)
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise ConfigError(f"{where}.layers", layers, allowed)
    checks.integer(f"{where}.blocks", s.blocks, allowed=f"a positive integer, at most the {len(layers)} uses")
    if s.blocks > len(layers):
        raise ConfigError(f"{where}.blocks", s.blocks, f"at most the {len(layers)} uses ({where}.layers)")
    checks.integer(f"{where}.n_head", s.n_head, allowed="a positive integer dividing 2·d_model")
    if 2 * cfg.d_model % s.n_head:
        raise ConfigError(f"{where}.n_head", s.n_head, f"a divisor of 2·d_model={2 * cfg.d_model}")
    if s.n_kv_head is not None:
        checks.integer(f"{where}.n_kv_head", s.n_kv_head, allowed=f"null or a divisor of n_head={s.n_head}")
        if s.n_head % s.n_kv_head:
            raise ConfigError(f"{where}.n_kv_head", s.n_kv_head, f"null or a divisor of n_head={s.n_head}")
    if s.rope and shared_head_dim(cfg) % 2:
        raise ConfigError(f"{where}.rope", True, f"false with odd heads of {shared_head_dim(cfg)} (RoPE turns pairs)")
    if s.rope:
        checks.positive(f"{where}.rope_theta", s.rope_theta)
    if s.d_ff is not None:
        checks.integer(f"{where}.d_ff", s.d_ff, allowed="a positive integer, or null (4·d_model)")
    checks.integer(f"{where}.adapter_rank", s.adapter_rank, 0, "a non-negative integer (0: no adapters)")
    if s.attention_adapters and s.adapter_rank == 0:
        raise ConfigError(f"{where}.attention_adapters", True, f"false with {where}.adapter_rank=0 (no adapters)")
    joined = "with model.layers.shared.layers set (a use joins a layer's input before its norm)"
    if cfg.block.kind != "pre":
        raise ConfigError("model.block.kind", cfg.block.kind, f"pre {joined}")
    if cfg.stream.kind != "plain":
        raise ConfigError("model.stream.kind", cfg.stream.kind, f"plain {joined}")
    if cfg.layers.loop.passes != 1:
        raise ConfigError("model.layers.loop.passes", cfg.layers.loop.passes, f"1 {joined}")


def unread_shared(cfg: ModelConfig) -> list[tuple[str, Any, str]]:
    """(field, value, why) of each shared-block field set away from its default that nothing reads: every one
    while no layer has a use, ``rope_theta`` without RoPE."""
    s, default = cfg.layers.shared, SharedConfig()
    if not s.layers:
        names, why = [name for name in vars(default) if name != "layers"], "model.layers.shared.layers=[]: no use"
    else:
        names, why = (["rope_theta"], "model.layers.shared.rope=false") if not s.rope else ([], "")
    changed = [name for name in names if getattr(s, name) != getattr(default, name)]
    return [(f"model.layers.shared.{name}", getattr(s, name), why) for name in changed]


def describe_shared(cfg: ModelConfig) -> str:
    """The shared blocks in a few words, for ``archlab-check``'s layout line; '' for none."""
    s = cfg.layers.shared
    if not s.layers:
        return ""
    rank = f", rank-{s.adapter_rank} adapters" if s.adapter_rank else ""
    return f"{s.blocks} block{'s' * (s.blocks > 1)} before layers {','.join(map(str, s.layers))}{rank}"
