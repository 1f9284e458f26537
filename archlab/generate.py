"""Autoregressive decoding with the model's KV cache: greedy, or sampled with temperature and top-k."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from archlab import checks
from archlab.errors import ConfigError
from archlab.nn.model import Decoder


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


def _check(model: Decoder, prompt_ids: Tensor, max_new_tokens: int, temperature: float, top_k: Optional[int]) -> None:
    if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        shape = tuple(prompt_ids.shape) if isinstance(prompt_ids, Tensor) else type(prompt_ids).__name__
        raise ConfigError("prompt_ids", shape, "a [batch, length >= 1] tensor of token ids")
    if prompt_ids.dtype != torch.long:
        raise ConfigError("prompt_ids.dtype", prompt_ids.dtype, "torch.long")
    checks.integer("max_new_tokens", max_new_tokens, 0, "an integer >= 0")
    total, limit = prompt_ids.shape[1] + max_new_tokens, model.cfg.context_length
    if total > limit:
        raise ConfigError(
            "max_new_tokens",
            max_new_tokens,
            f"at most model.context_length={limit} minus the prompt length {prompt_ids.shape[1]}",
        )
    if not 0 <= temperature < math.inf:
        raise ConfigError("temperature", temperature, "a finite number >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ConfigError("top_k", top_k, "null or an integer >= 1")
    bad = prompt_ids[(prompt_ids < 0) | (prompt_ids >= model.cfg.vocab_size)]
    if len(bad):
        raise ConfigError("prompt_ids", int(bad[0]), f"ids in [0, model.vocab_size={model.cfg.vocab_size})")


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

    The prompt runs once (prefill, filling the KV cache), then each step feeds only the newest token.
    ``temperature`` 0 is greedy; ``generator`` seeds the sampling. Dropout is off while decoding.
    ``attention_mask`` ``[B, T]`` (1 = token, 0 = padding) lets a batch hold prompts of different lengths,
    left-padded: each row then continues exactly as its prompt would alone.
    """
    _check(model, prompt_ids, max_new_tokens, temperature, top_k)
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(prompt_ids.shape):
        raise ConfigError(
            "attention_mask", tuple(attention_mask.shape), f"the prompt's shape {tuple(prompt_ids.shape)}"
        )
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache(prompt_ids.shape[0], prompt_ids.shape[1] + max_new_tokens)
        out = [prompt_ids]
        mask = attention_mask
        if max_new_tokens:
            logits = model(prompt_ids, cache, mask)[:, -1]
            for step in range(max_new_tokens):
                out.append(next_token(logits, temperature, top_k, generator))
                if step + 1 < max_new_tokens:
                    if mask is not None:  # every new token is a real one
                        mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
                    logits = model(out[-1], cache, mask)[:, -1]
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
