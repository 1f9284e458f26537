"""Autoregressive decoding with the model's KV cache: greedy, or sampled with temperature and top-k."""

from __future__ import annotations

import math
from typing import Optional, cast

import torch
from torch import Tensor

from archlab import checks
from archlab.errors import ConfigError
from archlab.nn.mixers.base import KVCache
from archlab.nn.model import Decoder
from archlab.nn.positions import Position


def next_token(logits: Tensor, temperature: float = 0.0, top_k: Optional[int] = None, generator=None) -> Tensor:
    """One id per row of ``logits`` ``[B, V]``: the argmax when ``temperature`` is 0, else a draw
    from softmax(logits / temperature) over the ``top_k`` largest logits (all when None)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def check_request(
    model: Decoder,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: Optional[int],
    attention_mask: Optional[Tensor] = None,
) -> None:
    """One ConfigError naming the first bad argument of a decoding request, before any work."""
    if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        shape = tuple(prompt_ids.shape) if isinstance(prompt_ids, Tensor) else type(prompt_ids).__name__
        raise ConfigError("prompt_ids", shape, "a [batch, length >= 1] tensor of token ids")
    if prompt_ids.dtype != torch.long:
        raise ConfigError("prompt_ids.dtype", prompt_ids.dtype, "torch.long")
    checks.integer("max_new_tokens", max_new_tokens, 0, "an integer >= 0")
    if not 0 <= temperature < math.inf:
        raise ConfigError("temperature", temperature, "a finite number >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ConfigError("top_k", top_k, "null or an integer >= 1")
    bad = prompt_ids[(prompt_ids < 0) | (prompt_ids >= model.cfg.vocab_size)]
    if len(bad):
        raise ConfigError("prompt_ids", int(bad[0]), f"ids in [0, model.vocab_size={model.cfg.vocab_size})")
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(prompt_ids.shape):
        raise ConfigError(
            "attention_mask", tuple(attention_mask.shape), f"the prompt's shape {tuple(prompt_ids.shape)}"
        )


@torch.no_grad()
def generate(
    model: Decoder,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    attention_mask: Optional[Tensor] = None,
) -> Tensor:
    """``prompt_ids`` ``[B, T]`` followed by ``max_new_tokens`` new ids: ``[B, T + max_new_tokens]``.

    Each new token is conditioned on the last ``model.context_length`` tokens at most, as nanoGPT's
    ``generate`` does, so neither the prompt nor ``max_new_tokens`` is bounded by the context. Up to the
    context the KV cache serves: the prompt (its last ``context_length`` tokens) runs once (prefill),
    then each step feeds only the newest token. Once the sequence outgrows the context, each step
    re-encodes the last ``context_length`` tokens from position 0, without the cache: the window's
    positions shift by one each step, and the keys and values cached in every layer after the first were
    computed from tokens that have since left the window, so a rolling cache (dropping the oldest entry)
    would condition on more than the window, whatever the position scheme. Re-encoding equals decoding with
    no cache at all, feeding ``ids[:, -context_length:]`` each step, to floating-point rounding; past
    the context each step costs a forward over ``context_length`` tokens, as nanoGPT's does. A position
    scheme that encodes a sequence longer than its ``switches_at`` anew (LongRoPE's long factors) makes
    the cache stale when a row first grows past it: that step re-encodes the window into a new cache.

    ``temperature`` 0 is greedy; ``generator`` seeds the sampling. Dropout is off while decoding.
    ``attention_mask`` ``[B, T]`` (1 = token, 0 = padding) lets a batch hold prompts of different lengths,
    left-padded: each row then continues exactly as its prompt would alone (past the context too: the
    last ``context_length`` columns hold each row's last ``context_length`` tokens, or all of them).
    """
    check_request(model, prompt_ids, max_new_tokens, temperature, top_k, attention_mask)
    if not max_new_tokens:
        return prompt_ids.clone()
    was_training = model.training
    model.eval()
    try:
        ctx = model.cfg.context_length
        window = prompt_ids[:, -ctx:]  # the last ctx tokens: what the next step is conditioned on
        mask = None if attention_mask is None else attention_mask[:, -ctx:]
        cache: Optional[KVCache] = model.new_cache(window.shape[0], min(window.shape[1] + max_new_tokens - 1, ctx))
        logits = model(window, cache, mask)[:, -1]
        schemes = [model.position, *model.layer_positions.values()]
        switches = {s for s in (cast(Position, p).switches_at for p in schemes) if s is not None}
        lengths = [window.shape[1]] * window.shape[0] if mask is None or not switches else mask.sum(-1).tolist()
        out = [prompt_ids]
        for step in range(max_new_tokens):
            out.append(next_token(logits, temperature, top_k, generator))
            if step + 1 == max_new_tokens:
                break
            full = window.shape[1] == ctx
            window = torch.cat((window[:, int(full) :], out[-1]), dim=1)
            if mask is not None:  # every new token is a real one
                mask = torch.cat((mask[:, int(full) :], mask.new_ones(mask.shape[0], 1)), dim=1)
            crossed = any(n in switches for n in lengths)  # a row grows past a switch: re-encode into a new cache
            lengths = [n + 1 for n in lengths]
            if cache is not None and not full and crossed:
                cache = model.new_cache(window.shape[0], cache.max_len)
                logits = model(window, cache, mask)[:, -1]
            elif cache is not None and not full:  # room left in the context: feed the newest token
                logits = model(out[-1], cache, mask)[:, -1]
            else:  # past the context: re-encode the window from position 0 (see above)
                cache = None
                logits = model(window, None, mask)[:, -1]
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
