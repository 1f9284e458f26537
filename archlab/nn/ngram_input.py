"""Hashed n-gram inputs (``model.ngram_input``, Qwen4-Exp's PLE: transformers' ``Qwen4ExpTextPLELayer``): before
a block, each of its ``n`` streams gains ``v·σ(ss(⟨k_i, H̄_i⟩/√d))`` (``v`` and keys ``k_i`` projected from the
tokens' hashed n-gram embeddings, ``H̄`` the normed streams, ss the signed square root) plus silu of a causal
depthwise convolution, dilated by the n-gram order, of that normed; its counts in closed form, its μP roles,
its checks. Decoding carries the last tokens (the n-grams') and the convolution's last inputs."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.config.loop import schedule
from archlab.errors import ConfigError
from archlab.nn.component import Component, Role
from archlab.nn.ngram_embedding import NGramEmbedding, table_rows
from archlab.nn.streams.base import STREAMS
from archlab.nn.streams.gated import stream_rms


class NGramState(NamedTuple):
    """What decoding carries of one layer's n-gram input: the last ``order − 1`` tokens ``[B, order − 1]``
    and the convolution's last ``(kernel − 1)·order`` inputs ``[B, n·d, (kernel − 1)·order]``."""

    tokens: Tensor
    conv: Tensor


def streams(cfg: ModelConfig) -> int:
    """The streams a block carries: ``model.stream.n`` where there are several, else 1."""
    return cfg.stream.n if STREAMS.get(cfg.stream.kind).multiple else 1


def width(cfg: ModelConfig) -> int:
    """The n-gram embeddings' width: ``dim``, else d_model."""
    dim = cfg.ngram_input.dim
    return cfg.d_model if dim is None else dim


def table_params(cfg: ModelConfig) -> int:
    """The tables, one per layer with an input: each its primes' rows (rounded up) × dim / ((order − 1)·heads)
    (embeddings: out of the non-embedding count)."""
    g = cfg.ngram_input
    total = (g.order - 1) * g.heads
    return sum(
        table_rows(g.table_base, total, index, g.table_multiple) * (width(cfg) // total)
        for index in range(len(g.layers))
    )


def state_bytes(cfg: ModelConfig, bytes_per_value: int) -> int:
    """What decoding keeps of one layer's n-gram input (``NGramState``): the convolution's last
    (kernel − 1)·order inputs of n·d values, and the last order − 1 token ids (int64)."""
    g = cfg.ngram_input
    conv = streams(cfg) * cfg.d_model * (g.conv_kernel - 1) * g.order
    return bytes_per_value * conv + torch.iinfo(torch.long).bits // 8 * (g.order - 1)


def layer_params(cfg: ModelConfig) -> int:
    """One layer's part beside its table: keys p × n·d, the value p × d, three norm scales n·d and the
    convolution n·d × kernel."""
    n, d, p = streams(cfg), cfg.d_model, width(cfg)
    return p * n * d + p * d + n * d * (3 + cfg.ngram_input.conv_kernel)


def validate(cfg: ModelConfig) -> None:
    """Sizes; layers inside the stack; a boundary token; streams the blocks run on per sublayer (or one)."""
    g = cfg.ngram_input
    if not g.layers:
        return
    for layer in g.layers:
        if not isinstance(layer, int) or not 0 <= layer < cfg.n_layer or g.layers.count(layer) > 1:
            raise ConfigError("model.ngram_input.layers", g.layers, f"distinct layers in [0, {cfg.n_layer})")
    checks.integer("model.ngram_input.order", g.order, 2, "an integer >= 2 (the longest n-gram)")
    checks.integer("model.ngram_input.heads", g.heads, 1, "a positive integer (hashed tables per order)")
    checks.integer("model.ngram_input.conv_kernel", g.conv_kernel, 1, "a positive integer (the convolution's taps)")
    checks.integer("model.ngram_input.table_base", g.table_base, 2, "an integer >= 2 (the first prime)")
    checks.integer("model.ngram_input.table_multiple", g.table_multiple, 1, "a positive integer")
    checks.integer("model.ngram_input.seed", g.seed, 0, "a whole number >= 0")
    total = (g.order - 1) * g.heads
    if g.dim is not None and (not isinstance(g.dim, int) or g.dim <= 0 or g.dim % total):
        raise ConfigError("model.ngram_input.dim", g.dim, f"a positive multiple of (order − 1)·heads = {total}")
    if g.dim is None and cfg.d_model % total:
        raise ConfigError("model.ngram_input.dim", g.dim, f"a multiple of (order − 1)·heads = {total} (d_model is not)")
    if not isinstance(g.boundary, int) or not 0 <= g.boundary < cfg.vocab_size:
        raise ConfigError("model.ngram_input.boundary", g.boundary, "a token id (the end of a document)")
    if STREAMS.get(cfg.stream.kind).wraps_layers:
        raise ConfigError("model.ngram_input.layers", g.layers, f"[] with model.stream.kind={cfg.stream.kind}")
    if cfg.head.mtp.depth:
        raise ConfigError("model.ngram_input.layers", g.layers, "[] with multi-token prediction modules")
    if len(schedule(cfg)) != cfg.n_layer:  # a looped layer would carry one state through its passes
        raise ConfigError("model.ngram_input.layers", g.layers, "[] with a loop (model.layers.loop)")


class NGramInput(Component, nn.Module):
    """One layer's n-gram input: the table (``embedding``), ``key`` ``[n·d, p]``, ``value`` ``[d, p]``, the
    norm scales ``norm_key``, ``norm_query``, ``norm_conv`` ``[n, d]`` (as the model's norm scales: ``1 + w``
    with ``model.norm.unit_offset``) and the depthwise ``conv`` ``[n·d, kernel]``."""

    def __init__(self, cfg: ModelConfig, index: int):
        """``index``: the layer's ordinal among those with an input, which seeds its hashes."""
        super().__init__()
        g = cfg.ngram_input
        self.n, self.d, self.order, self.kernel = streams(cfg), cfg.d_model, g.order, g.conv_kernel
        assert g.boundary is not None, "validate asks for model.ngram_input.boundary"
        self.boundary: int = g.boundary
        self.eps, self.unit_offset = cfg.norm.eps, cfg.norm.unit_offset
        p = width(cfg)
        self.embedding = NGramEmbedding(
            cfg.vocab_size, p, g.order, g.heads, g.table_base, g.table_multiple, g.seed, index
        )
        self.key = nn.Linear(p, self.n * self.d, bias=False)
        self.value = nn.Linear(p, self.d, bias=False)
        self.norm_key = nn.Parameter(torch.empty(self.n, self.d))
        self.norm_query = nn.Parameter(torch.empty(self.n, self.d))
        self.norm_conv = nn.Parameter(torch.empty(self.n, self.d))
        self.conv = nn.Parameter(torch.empty(self.n * self.d, self.kernel))

    def param_roles(self) -> dict[str, Role]:
        # the table's rows are width-sized (an input table); the projections read and write the width
        vectors = {name: Role.VECTOR for name in ("norm_key", "norm_query", "norm_conv", "conv")}
        return {"embedding.table.weight": Role.INPUT, "key.weight": Role.HIDDEN, "value.weight": Role.HIDDEN} | vectors

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """Qwen4-Exp's: norm scales 1 (stored 0 with the unit offset), the convolution 0, so the input starts
        as the gated value alone; the table and projections are the model's Embedding and Linears."""
        for scale in (self.norm_key, self.norm_query, self.norm_conv):
            scale.fill_(0.0 if self.unit_offset else 1.0)
        self.conv.zero_()
        self.embedding.reset_constants()

    def empty_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> NGramState:
        """Before the first token: boundary tokens and a zero convolution input."""
        tokens = torch.full((batch, self.order - 1), self.boundary, dtype=torch.long, device=device)
        return NGramState(
            tokens, torch.zeros(batch, self.n * self.d, (self.kernel - 1) * self.order, device=device, dtype=dtype)
        )

    def forward(
        self,
        h: Tensor,
        tokens: Tensor,
        state: Optional[NGramState] = None,
        present: Optional[Tensor] = None,
        documents: Optional[Tensor] = None,
    ) -> tuple[Tensor, NGramState]:
        """What the streams ``h`` ``[B, T, n, d]`` gain, from ``tokens`` ``[B, T]`` after ``state`` (None: the
        sequence's start), and the state after them; ``present`` ``[B, T]`` (False: padding) reads a padded
        position as the boundary token and adds nothing there; ``documents`` ``[B, T]`` (True where a packed
        document begins; whole rows, no state) keeps each document's n-grams and convolution to itself."""
        B, T = tokens.shape
        if state is None:
            state = self.empty_state(B, h.device, h.dtype)
        if present is not None:
            tokens = torch.where(present, tokens, self.boundary)
        embeddings = self.embedding(tokens.long(), state.tokens, self.boundary, documents)
        keys = stream_rms(
            self.key(embeddings).unflatten(-1, (self.n, self.d)), self.norm_key, self.eps, self.unit_offset
        )
        query = stream_rms(h, self.norm_query, self.eps, self.unit_offset)
        gate = (keys * query).sum(-1, keepdim=True) / self.d**0.5
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = torch.sigmoid(gate) * self.value(embeddings).unsqueeze(-2)  # [B, T, n, d]
        normed = stream_rms(gated, self.norm_conv, self.eps, self.unit_offset)
        if present is not None:
            gated, normed = gated * present[..., None, None], normed * present[..., None, None]
        inputs = torch.cat([state.conv, normed.flatten(-2).transpose(1, 2)], dim=-1)
        if documents is None:
            conv = F.conv1d(inputs, self.conv.unsqueeze(1), groups=self.n * self.d, dilation=self.order)
        else:  # tap j reads (kernel − 1 − j)·order back, where that is in the same document
            t = torch.arange(T, device=h.device)
            first = torch.where(documents, t, 0).cummax(dim=1).values  # [B, T]
            taps = [
                self.conv[:, j, None] * inputs[..., j * self.order : j * self.order + T]
                * (t - (self.kernel - 1 - j) * self.order >= first).unsqueeze(1).to(inputs.dtype)
                for j in range(self.kernel)
            ]  # fmt: skip
            conv = torch.stack(taps).sum(0)
        history = torch.cat([state.tokens, tokens], dim=1)
        after = NGramState(
            history[:, -(self.order - 1) :],
            inputs[..., -state.conv.shape[-1] :] if state.conv.shape[-1] else state.conv,
        )
        return gated + F.silu(conv).transpose(1, 2).unflatten(-1, (self.n, self.d)), after

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``ngram_input <order>-grams ×<heads>, dim <p>, layers [...]``."""
        g = cfg.ngram_input
        return f"ngram_input {g.order}-grams ×{g.heads}, dim {width(cfg)}, layers {g.layers}"
