"""Self-speculative greedy decoding with the model's multi-token prediction modules (``model.head.mtp``):
each round the modules draft ``depth`` tokens after the last one, the model scores them all in one forward,
and the longest prefix equal to its own argmax is kept, with the model's next token after it. The tokens are
greedy decoding's (``archlab.generate``), in fewer forwards of the model when drafts are accepted."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, cast

import torch
from torch import Tensor

from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.generate import check_request
from archlab.nn.mixers.base import KVCache
from archlab.nn.model import Decoder, row_positions
from archlab.nn.mtp import MTPModule, mtp_layer
from archlab.nn.positions import Position


class Speculation(NamedTuple):
    """The prompt and its continuation ``[B, T + max_new_tokens]``, the model's forwards after the prompt
    (rounds) and the drafted tokens it kept, summed over rounds (each round keeps as many for every row)."""

    ids: Tensor
    rounds: int
    drafted: int
    accepted: int


def check_speculation(model: Decoder, prompt_ids: Tensor, max_new_tokens: int) -> None:
    """One ConfigError before any work: the model has modules to draft with, and the drafts' positions
    stay within the context under a position scheme that encodes every length alike."""
    if model.mtp is None:
        raise ConfigError("model.head.mtp.depth", 0, ">= 1 for speculative decoding (its modules draft the tokens)")
    depth, ctx = model.cfg.head.mtp.depth, model.cfg.context_length
    room = ctx - prompt_ids.shape[1] - depth
    if max_new_tokens > room:
        raise ConfigError(
            "max_new_tokens",
            max_new_tokens,
            f"at most {max(room, 0)} with speculative decoding: the prompt, the new tokens and the "
            f"{depth} drafted after the last stay within model.context_length={ctx}",
        )
    schemes = [model.position, *model.layer_positions.values()]
    if any(cast(Position, p).switches_at is not None for p in schemes):
        raise ConfigError(
            "speculative", True, "false with a position scheme that re-encodes past a length (LongRoPE's factors)"
        )


@torch.no_grad()
def speculate(
    model: Decoder, prompt_ids: Tensor, max_new_tokens: int, attention_mask: Optional[Tensor] = None
) -> Speculation:
    """Greedy continuation of ``prompt_ids`` ``[B, T]`` (left-padded rows with ``attention_mask``, as
    ``generate``), drafted by the multi-token prediction modules and checked by the model."""
    check_request(model, prompt_ids, max_new_tokens, 0.0, None, attention_mask)
    check_speculation(model, prompt_ids, max_new_tokens)
    if not max_new_tokens:
        return Speculation(prompt_ids.clone(), 0, 0, 0)
    was_training = model.training
    model.eval()
    try:
        return Drafting(model, prompt_ids, max_new_tokens, attention_mask).run()
    finally:
        model.train(was_training)


class Drafting:
    """One batch's speculative decoding. The model's cache holds every position before the last committed
    token; the modules' cache the positions whose inputs are all committed (module k reads token i + k), and
    ``pending`` the model's states from there on, which the modules read next round."""

    def __init__(self, model: Decoder, prompt: Tensor, max_new_tokens: int, mask: Optional[Tensor]):
        self.model, self.prompt, self.max_new = model, prompt, max_new_tokens
        self.depth = model.cfg.head.mtp.depth
        B, P = prompt.shape
        size = P + max_new_tokens + self.depth
        self.mask = None if mask is None else torch.cat((mask, mask.new_ones(B, size - P)), dim=1)
        self.cache = model.new_cache(B, size)
        dtype = model.tok_emb.weight.dtype
        slots = [*layer_configs(model.cfg), *[mtp_layer(model.cfg)] * self.depth]  # a module's block after them
        self.mtp_cache = KVCache(model.cfg, B, size, dtype, layers=slots)
        assert model.mtp is not None  # check_speculation refused a model without modules
        self.modules = cast("Sequence[MTPModule]", model.mtp.depths)

    def columns(self, cache: KVCache, length: int) -> Optional[Tensor]:
        """The attention mask of ``cache``'s positions and the next ``length``."""
        return None if self.mask is None else self.mask[:, : cache.length + length]

    def run(self) -> Speculation:
        model, P = self.model, self.prompt.shape[1]
        h = model.hidden(self.prompt, self.cache, self.columns(self.cache, P))
        tokens = torch.cat((self.prompt, model.logits(h[:, -1:]).argmax(-1)), dim=1)
        pending, rounds, drafted, accepted = h, 0, 0, 0
        while tokens.shape[1] - P < self.max_new:
            drafts, pending = self.draft(tokens, pending)
            kept, states = self.verify(tokens, drafts, self.max_new - (tokens.shape[1] - P))
            tokens = torch.cat((tokens, kept), dim=1)
            pending = torch.cat((pending, states), dim=1)
            rounds, drafted, accepted = rounds + 1, drafted + self.depth, accepted + kept.shape[1] - 1
        return Speculation(tokens, rounds, drafted, accepted)

    def verify(self, tokens: Tensor, drafts: Tensor, remaining: int) -> tuple[Tensor, Tensor]:
        """The tokens this round commits (the drafts every row's model agrees with, then its own next one)
        and the model's states at the positions they follow, with the cache left just before the last."""
        model, cache = self.model, self.cache
        fed = torch.cat((tokens[:, -1:], drafts), dim=1)
        before = cache.snapshot()
        states = model.hidden(fed, cache, self.columns(cache, fed.shape[1]))
        best = model.logits(states).argmax(-1)  # best[:, j]: the model's token after fed[:, j]
        agreed = (best[:, :-1] == drafts).long().cumprod(-1).sum(-1)
        n = min(int(agreed.min()), remaining - 1)  # as many drafts for every row: the caches stay aligned
        keep = n + 1
        if keep < fed.shape[1]:  # forget the positions after the kept ones
            if cache.truncatable():
                cache.length = before[0] + keep
            else:  # a window, a recurrent state: back to before the round, then the kept tokens again
                cache.restore(before)
                states = model.hidden(fed[:, :keep], cache, self.columns(cache, keep))
        return torch.cat((drafts[:, :n], best[:, n : n + 1]), dim=1), states[:, :keep]

    def draft(self, tokens: Tensor, pending: Tensor) -> tuple[Tensor, Tensor]:
        """``depth`` tokens after ``tokens`` ``[B, N]``, module k drafting token N + k − 1 from position N − 2;
        and ``pending`` less the positions the modules' cache now holds. Module k runs on the positions from
        its cache's end to N − 2: those whose token i + k is committed stay cached, the rest run after a
        snapshot that is restored, as their drafted tokens may be rejected."""
        model, cache = self.model, self.mtp_cache
        N, start = tokens.shape[1], cache.length
        committed = max(0, N - self.depth - start)  # positions i <= N - 1 - depth: token i + depth known
        known, state, drafts = tokens, pending, []
        for k, module in enumerate(self.modules, start=1):
            x = module.enter(model.embed(known[:, start + k : N - 1 + k]), state)
            layer = [(module.block, model.mtp_position, cache)]
            parts = []
            if committed:
                parts.append(self.through(layer, x[:, :committed]))
            if x.shape[1] > committed:
                cache.length = start + committed
                snapshot = cache.snapshot()
                parts.append(self.through(layer, x[:, committed:]))
                cache.restore(snapshot)
            cache.length = start
            state = module.norm(torch.cat(parts, dim=1))
            drafts.append(model.logits(state[:, -1:]).argmax(-1))
            known = torch.cat((known, drafts[-1]), dim=1)
        cache.length = start + committed
        return torch.cat(drafts, dim=1), pending[:, committed:]

    def through(self, layer: list, x: Tensor) -> Tensor:
        """``x`` through one module's block after the modules' cached positions."""
        mask = self.columns(self.mtp_cache, x.shape[1])
        return self.model.run(x, layer, self.mtp_cache, mask, row_positions(mask, None), None)
