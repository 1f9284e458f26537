"""Closed-form parameter and FLOP counts from a config alone, and the check of a built model.

The formulas live beside each registry entry (``num_params``, ``extra_flops``), written from the
published layouts; nothing here looks at a module or names a variant. ``check_build`` then compares
them line by line with the module.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

from torch import nn

from archlab.config import ModelConfig, to_model_config
from archlab.config.layers import layer_configs
from archlab.config.loop import schedule
from archlab.nn import laurel, ngram_input, per_layer_inputs
from archlab.nn.head import embedding_width
from archlab.nn.mixers.base import MIXERS
from archlab.nn.mlp import MLPS
from archlab.nn.mtp import mtp_layer, mtp_layer_index
from archlab.nn.shared import shared_extra_flops, shared_kv_values, shared_params, shared_run_params
from archlab.nn.validation import Resolved, entries, resolve

COMPONENTS = (
    "token_embedding",
    "position_embedding",
    "embedding_norm",
    "embedding_projection",
    "per_layer_embedding",
    "per_layer_inputs",
    "ngram_embedding",
    "ngram_inputs",
    "attention",
    "mlp",
    "laurel",
    "shared",
    "norms",
    "streams",
    "final_norm",
    "head",
    "mtp",
)


def count(cfg: Any) -> dict[str, int]:
    """Per-component counts (per-layer parts summed over all layers), ``total``, ``inference`` (total less
    the multi-token prediction modules, ``mtp``), ``non_embedding``, ``active`` and
    ``active_non_embedding`` (of the model without those modules), ``per_block`` (the last block) and
    ``flops_per_token`` (of a training step, the modules' included).

    ``non_embedding`` drops the position table and the token table unless it doubles as the head,
    i.e. the parameters that take part in a matmul per token (nanoGPT's convention). ``active`` counts
    what one token's forward pass goes through: everything but the routed experts it is not sent to
    (the embedding in full). FLOPs per token of a training step are 6·active_non_embedding + 12·L·H·Q·T
    (PaLM, arXiv:2204.02311, appendix B). A looped layer (``model.layers.loop``) holds its weights once
    and counts them once; its FLOPs count per pass (``flops_per_token``); so do shared blocks
    (``model.layers.shared``: each block once, each use's adapters and linear, FLOPs per use). A
    ``Resolved`` config is read as it is, not validated again.
    """
    resolved = resolve(cfg if isinstance(cfg, Resolved) else to_model_config(cfg))
    cfg = resolved.cfg
    chosen, layers = entries(cfg), list(enumerate(resolved.layers))  # each layer by its own config
    attention = [entries(c).attention.num_params(c, i) for i, c in layers]
    mlp = [entries(c).mlp.num_params(c, i) for i, c in layers]
    block_norms = [entries(c).block.num_params(c, i) for i, c in layers]  # a block's own parameters: its norms
    norm = chosen.norm.num_params(cfg)
    # a sublayer's connection to several residual streams (model.stream): attention's, and the MLP's where present
    # or a layer's connection around its block (AltUp's)
    connections = [_connection_params(c) for _, c in layers]  # each layer's by its own stream config
    counts = {
        "token_embedding": cfg.vocab_size * embedding_width(cfg),
        "position_embedding": chosen.position.num_params(cfg),
        "embedding_norm": norm if cfg.embedding_norm else 0,  # a norm, not a table: in non_embedding
        # model.embedding_dim: in and out of d_model, e·d each (matmuls per token: in non_embedding)
        "embedding_projection": 0 if cfg.embedding_dim is None else 2 * cfg.embedding_dim * cfg.d_model,
        # model.per_layer_input: its table (an embedding), its projection and norm and each layer's gate
        "per_layer_embedding": per_layer_inputs.table_params(cfg),
        "per_layer_inputs": per_layer_inputs.model_params(cfg) + cfg.n_layer * per_layer_inputs.layer_params(cfg),
        # model.ngram_input: a hashed n-gram table per layer with one (embeddings), and its projections
        "ngram_embedding": ngram_input.table_params(cfg),
        "ngram_inputs": len(cfg.ngram_input.layers) * ngram_input.layer_params(cfg),
        "attention": sum(attention),
        "mlp": sum(mlp),
        "laurel": sum(laurel.params(c) for _, c in layers),  # model.block.laurel_rank: per layer, its own
        "shared": shared_params(cfg),
        "norms": sum(block_norms),
        "streams": sum(connections) + chosen.stream.num_params(cfg),
        "final_norm": norm if chosen.block.final_norm and cfg.block.final_norm else 0,
        "head": chosen.head.num_params(cfg),
        "mtp": cfg.head.mtp.depth * mtp_module_params(cfg),
    }
    counts["total"] = sum(counts[c] for c in COMPONENTS)
    counts["inference"] = counts["total"] - counts["mtp"]  # what next-token decoding holds
    shared = chosen.head.shared_embedding_params(cfg)
    tables = counts["token_embedding"] + counts["position_embedding"] + counts["per_layer_embedding"]
    tables += counts["ngram_embedding"]
    counts["non_embedding"] = counts["inference"] - tables + shared
    active = sum(entries(c).attention.active_params(c, i) + entries(c).mlp.active_params(c, i) for i, c in layers)
    inactive = counts["attention"] + counts["mlp"] - active
    counts["active"] = counts["inference"] - inactive
    counts["active_non_embedding"] = counts["non_embedding"] - inactive
    counts["per_block"] = attention[-1] + mlp[-1] + block_norms[-1] + connections[-1]
    counts["per_block"] += per_layer_inputs.layer_params(cfg) + laurel.params(resolved.layers[-1])
    counts["flops_per_token"] = flops_per_token(resolved, counts["active_non_embedding"])
    return counts


def flops_per_token(cfg: ModelConfig | Resolved, active_non_embedding: int, seq_len: int | None = None) -> int:
    """Training FLOPs per token at ``seq_len`` (default ``context_length``): 6 per parameter that takes
    part in a matmul for this token, plus what the chosen entries do beyond their weights (attention's
    scores); a looped layer's parameters and scores once per pass, a shared block's once per use."""
    model, layers = cfg if isinstance(cfg, Resolved) else (cfg, layer_configs(cfg))
    T = seq_len or model.context_length
    order = schedule(model)
    runs = [(i, layers[i]) for i, _ in order]  # each layer as often as it runs
    extra = sum(_extra_flops(c, T, i) for i, c in runs)  # a layer's connections to the streams among them
    extra += entries(model).stream.merge_flops(model)  # the streams' merge before the final norm
    again = sum(_run_params(layers[i], i) for i, p in order if p > 0)
    again += shared_run_params(model) - shared_params(model)  # a shared block's weights once per use after its first
    extra += shared_extra_flops(model, T)
    # a looped layer's weights once per pass after its first; the multi-token prediction modules
    return 6 * (active_non_embedding + again) + extra + mtp_flops_per_token(model, T)


def _extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
    """What one run of layer ``layer`` (of config ``cfg``) does beyond its weights: its attention's, MLP's and
    block's ``extra_flops`` (attention's scores), and its connections' to the residual streams (per sublayer,
    or around the layer)."""
    e = entries(cfg)
    streams = (1 + e.mlp.present) * e.stream.connection_flops(cfg) + e.stream.layer_extra_flops(cfg)
    return sum(part.extra_flops(cfg, seq_len, layer) for part in (e.attention, e.mlp, e.block)) + streams


def _connection_params(cfg: ModelConfig) -> int:
    """A layer's connections to the residual streams (``cfg``'s ``stream``): attention's, and the MLP's where
    present, or the one around its block (AltUp's)."""
    e = entries(cfg)
    return (1 + e.mlp.present) * e.stream.connection_params(cfg) + e.stream.layer_params(cfg)


def _run_params(cfg: ModelConfig, layer: int) -> int:
    """The parameters one token passes through in a run of layer ``layer`` (of config ``cfg``):
    its attention's and its MLP's (active), its block's norms and its sublayers' connections to the streams."""
    e = entries(cfg)
    active = e.attention.active_params(cfg, layer) + e.mlp.active_params(cfg, layer)
    own = e.block.num_params(cfg, layer) + laurel.params(cfg)
    return active + own + _connection_params(cfg) + per_layer_inputs.layer_params(cfg)


def mtp_module_params(cfg: ModelConfig, active: bool = False) -> int:
    """One multi-token prediction module's parameters (``active``: those one token passes through): three
    norms, the projection of 2·d_model to d_model, and its block's attention, MLP and norms."""
    layer, index = mtp_layer(cfg), mtp_layer_index(cfg, 0)
    own = 3 * entries(cfg).norm.num_params(cfg) + 2 * cfg.d_model * cfg.d_model
    if active:  # a module's block runs on one stream: no connections
        return own + _run_params(layer, index)
    chosen = entries(layer)
    sublayers = chosen.attention.num_params(layer, index) + chosen.mlp.num_params(layer, index)
    return own + sublayers + chosen.block.num_params(layer, index) + laurel.params(layer)


def mtp_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token of the multi-token prediction modules: 6 per active parameter, the head's
    matmuls once more per module (6·``logit_params``: vocab·width, a transform head's own too), and what
    each block does beyond its weights."""
    depth = cfg.head.mtp.depth
    if not depth:
        return 0
    layer = mtp_layer(cfg)
    extra = sum(_extra_flops(layer, seq_len, mtp_layer_index(cfg, k)) for k in range(depth))
    return 6 * depth * (mtp_module_params(cfg, active=True) + entries(cfg).head.logit_params(cfg)) + extra


def kv_cache_bytes(cfg: Any, length: Optional[int] = None, bytes_per_value: int = 4) -> int:
    """Bytes the KV cache holds for one sequence of ``length`` tokens (default ``context_length``), from
    the attention entry's closed form (a sliding-window layer keeps only its window), a stateful MLP's and
    an n-gram input's (``model.ngram_input``), for each pass of a looped layer. Not validated: the report reads it from runs recorded by earlier
    versions, whose checks were looser."""
    cfg = to_model_config(cfg)
    T = length or cfg.context_length
    layers = layer_configs(cfg)
    runs = [(i, layers[i]) for i, _ in schedule(cfg)]  # a looped layer's passes each keep their own
    per_layer = sum(
        MIXERS.get(c.attention.kind).kv_cache_values(c, T, i) + MLPS.get(c.mlp.kind).state_values(c) for i, c in runs
    )
    ngrams = sum(ngram_input.state_bytes(cfg, bytes_per_value) for i, _ in runs if i in cfg.ngram_input.layers)
    return bytes_per_value * (per_layer + shared_kv_values(cfg, T)) + ngrams  # shared blocks' keys and values


def built_counts(model: nn.Module) -> dict[str, int]:
    """The same breakdown, by summing the parameters of a built ``Decoder`` (tied tensors once)."""
    prefix = {
        "tok_emb": "token_embedding",
        "position": "position_embedding",
        "embedding_norm": "embedding_norm",
        "project_in": "embedding_projection",
        "project_out": "embedding_projection",
        "stream": "streams",
        "final_norm": "final_norm",
        "head": "head",
        "mtp": "mtp",
        "shared": "shared",
        "per_layer_inputs": "per_layer_inputs",
        "ngram_inputs": "ngram_inputs",
    }
    part = {"attn": "attention", "mlp": "mlp", "attn_stream": "streams", "mlp_stream": "streams"}  # else norms
    part["layer_stream"], part["laurel"] = "streams", "laurel"
    part["per_layer_input"] = "per_layer_inputs"
    counts: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        top = name.split(".")[0]
        component = part.get(name.split(".")[2], "norms") if top == "blocks" else prefix[top]
        if name == "per_layer_inputs.table.weight":
            component = "per_layer_embedding"
        if top == "ngram_inputs" and name.endswith(".embedding.table.weight"):
            component = "ngram_embedding"
        counts[component] += p.numel()
    out = {c: counts[c] for c in COMPONENTS}
    out["total"] = sum(out.values())
    return out


class ParameterMismatch(AssertionError):
    """A built model whose parameter count disagrees with the closed-form formula."""


def check_build(cfg: Any, model: nn.Module) -> dict[str, int]:
    """Compare every component of ``model`` with ``count(cfg)`` (a ``Resolved`` config: not validated
    again); raise naming each that differs."""
    analytic, built = count(cfg), built_counts(model)
    wrong = [
        f"{c}: analytic {analytic[c]:,} != built {built[c]:,}"
        for c in (*COMPONENTS, "total")
        if analytic[c] != built[c]
    ]
    if wrong:
        raise ParameterMismatch("parameter count mismatch — " + "; ".join(wrong))
    return built
