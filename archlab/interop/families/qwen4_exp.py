"""Qwen4-Exp's text decoder (``Qwen4ExpForCausalLM``, ``qwen4_exp_text``): Qwen3.5-MoE's layers (Gated DeltaNet
with q, k, v, z, b, a projected apart; gated attention with (1 + w) QK-norm and half-paired partial RoPE; a
softmax MoE beside a sigmoid-gated shared expert in every layer) inside ``hc_count`` gated residual streams of
rank ``hc_lowrank`` (``model.stream.kind=gated``), whose reads norm every sublayer's input and merge the streams
before the head, so no layer or final norm is built (``model.block`` attn_norm, mlp_norm and final_norm false).
Its attention layers (``indexed_attention``) are ``qsa``: each query narrowed to the ``indexer_budget`` tokens of
the blocks of ``indexer_compress_ratio`` that an indexer of ``indexer_n_heads`` queries and one key
(``indexer_kv_heads`` 1) of ``indexer_head_dim`` scores highest. Before the layers ``ple_layer_ids`` (counted
from 1; archlab's ``model.ngram_input.layers`` from 0) the streams gain hashed n-gram inputs (PLE): orders 2 to
``ngram_size``, ``heads_per_ngram`` hashes each, the tables' primes from ``ngram_vocab_size_base``, seeded by
``seed``; no n-gram crosses ``eos_token_id`` (its first id: archlab's ``boundary``). The linear layers gate
their norm by ``output_gate_type`` (else ``hidden_act``). Stored apart from archlab's layout: each stream norm's
scale flat, [n·d] (archlab's [n, d]); the depthwise convolutions [C, 1, K]; the n-gram hash constants as
buffers, which archlab computes from the config (written on export, checked on import); an n-gram table in
``split_ngram_parts`` checkpoint shards (``ngram_embedding.shard_<k>``, joined when loading; transformers'
save_pretrained splits them again). Its checkpoints' multi-token prediction layer (``mtp.*``) is left out, as
transformers leaves it: its config names no module count and transformers builds none, so no layout of it is
known (and archlab's n-gram inputs take no MTP modules)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import Tensor

from archlab.config import BlockConfig, ModelConfig
from archlab.config.layers import layer_configs
from archlab.config.model import NGramInputConfig
from archlab.errors import ConfigError
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.deltanet import (
    FULL,
    LINEAR,
    cfg_types,
    deltanet_layers,
    gated_attention_tensors,
    is_deltanet,
)
from archlab.interop.families.mtp import MTP_FEATURES
from archlab.interop.families.qwen3_5 import MROPE, Qwen3_5Moe
from archlab.interop.families.qwen3_next import Qwen3Next
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.qsa import QSAConfig
from archlab.nn.ngram_embedding import head_sizes, multipliers
from archlab.nn.rope import rotary_dim
from archlab.nn.streams.gated import GatedConfig

INDEXED = "indexed_attention"  # its attention layers' type (its configs' full_attention is read as this)
# the indexer's config keys -> qsa's fields (indexer_kv_heads: always 1, qsa's one key head)
INDEXER = {
    "indexer_n_heads": "index_n_heads",
    "indexer_head_dim": "index_head_dim",
    "indexer_budget": "index_budget",
    "indexer_compress_ratio": "index_ratio",
}
# the n-gram inputs' config keys -> model.ngram_input's fields (ple_layer_ids, ple_embed_dim, eos: apart)
NGRAM = {
    "ple_conv_kernel_size": "conv_kernel",
    "ngram_size": "order",
    "heads_per_ngram": "heads",
    "ngram_vocab_size_base": "table_base",
    "make_ngram_vocab_size_divisible_by": "table_multiple",
    "seed": "seed",
}
BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")  # a table's hash constants
SHARD = re.compile(r"^(.*\.ngram_embedding)\.shard_(\d+)\.weight$")  # a table's checkpoint shard


def ngram_constants(cfg: ModelConfig, index: int) -> dict[str, Tensor]:
    """The hash constants of the ``index``-th n-gram table (``BUFFERS``' order), as transformers holds them."""
    g = cfg.ngram_input
    total = (g.order - 1) * g.heads
    sizes = head_sizes(g.table_base, total, index)
    values = (multipliers(cfg.vocab_size, g.order, index, g.seed), sizes, [sum(sizes[:i]) for i in range(total)])
    return {name: torch.tensor(v, dtype=torch.long) for name, v in zip(BUFFERS, values)}


def _ple(i: int) -> str:
    return f"model.layers.{i}.ple"


class Qwen4Exp(Qwen3_5Moe):
    """Qwen4ExpForCausalLM: see the module docstring."""

    defers = False  # no other family holds its layouts
    model_type, title, model_class, config_class = (
        "qwen4_exp_text",
        "Qwen4-Exp",
        "Qwen4ExpForCausalLM",
        "Qwen4ExpTextConfig",
    )
    parts = (
        "Qwen3.5-MoE's layers (qsa for its attention, a silu or sigmoid output gate on Gated DeltaNet) in gated "
        "residual streams, hashed n-gram inputs, no layer or final norms"
    )
    attention_kind = "qsa"
    features = (Qwen3Next.features - MTP_FEATURES) | {
        "model.stream.kind",
        "model.ngram_input.layers",
        "model.block.attn_norm",
        "model.block.mlp_norm",
        "model.block.final_norm",
    }
    mtp_keys = ()  # its config counts no modules: its checkpoints' mtp.* are left out
    output_gates = ("silu", "sigmoid")

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        why = " (its gated streams' reads norm each sublayer's input and the head's)"
        return [
            *(r for r in Qwen3Next.rules(self, cfg) if r[0] != "model.head.mtp.layer"),
            ("model.stream.kind", ("gated",), " (its residual is hc_count gated streams)"),
            ("model.block.attn_norm", (False,), why),
            ("model.block.mlp_norm", (False,), why),
            ("model.block.final_norm", (False,), why),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """Qwen3.5-MoE's, then: two streams or more; an indexer head that holds the rotated dims; n-gram
        inputs on Gated DeltaNet layers alone, in ascending order."""
        found = super().part_problems(cfg)
        if cfg.stream.kind == "gated" and cfg.stream.n < 2:
            found.append(Problem("model.stream.n", cfg.stream.n, "at least 2", " (hc_count > 1)"))
        a = cfg.attention
        if a.kind == "qsa" and cfg.position.kind == "rope" and rotary_dim(cfg) > a.index_head_dim:
            why = " (its indexer rotates the queries' and keys' first rotary dims)"
            found.append(Problem("model.attention.index_head_dim", a.index_head_dim, f">= {rotary_dim(cfg)}", why))
        layers, lcs = cfg.ngram_input.layers, layer_configs(cfg)
        if layers != sorted(layers):
            why = " (ple_layer_ids is sorted: a table's hashes are seeded by its rank)"
            found.append(Problem("model.ngram_input.layers", layers, "ascending layers", why))
        elif any(not is_deltanet(lcs[i]) for i in layers):
            why = " (Qwen4-Exp's PLE precedes linear_attention layers alone)"
            found.append(Problem("model.ngram_input.layers", layers, "Gated DeltaNet layers", why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        out = Qwen3Next.to_hf(self, cfg)
        for key in ("intermediate_size", "decoder_sparse_step", "mlp_only_layers", "mtp_num_hidden_layers"):
            del out[key]
        lcs, a, g = layer_configs(cfg), cfg.attention, cfg.ngram_input
        linear = next((lc.attention for lc in lcs if is_deltanet(lc)), None)
        out["layer_types"] = [LINEAR if is_deltanet(lc) else INDEXED for lc in lcs]
        out |= {key: getattr(a, field) for key, field in INDEXER.items()} | {"indexer_kv_heads": 1}
        out |= {key: getattr(g, field) for key, field in NGRAM.items()}
        return out | dict(
            hc_count=cfg.stream.n,
            hc_lowrank=cfg.stream.rank,
            output_gate_type=linear.output_gate if linear is not None else "silu",
            ple_layer_ids=[i + 1 for i in g.layers],
            ple_embed_dim=g.dim if g.dim is not None else cfg.d_model,
            eos_token_id=g.boundary,
        )

    def check_hf(self, c: Any) -> None:
        """Refuse an activation other than SiLU, a layer type other than its two, key heads that do not
        divide the value heads, an indexer of other than one key head or unset beside indexed layers."""
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU experts; its linear layers' convolution is SiLU'd)")
        types = cfg_types(c)
        if len(types) != c.num_hidden_layers or set(types) - {LINEAR, INDEXED, FULL}:
            refuse_hf(c, "layer_types", f"num_hidden_layers entries, each '{LINEAR}' or '{INDEXED}'", types)
        if LINEAR in types and c.linear_num_value_heads % c.linear_num_key_heads:
            refuse_hf(c, "linear_num_key_heads", "a divisor of linear_num_value_heads (each serves a group of them)")
        if (c.output_gate_type or c.hidden_act) not in self.output_gates:
            refuse_hf(c, "output_gate_type", "'silu' or 'sigmoid' (the linear layers' output gate)")
        if c.indexer_kv_heads not in (None, 1):
            refuse_hf(c, "indexer_kv_heads", "1 (qsa's indexer has one key head)")
        if set(types) - {LINEAR}:
            for key in ("indexer_kv_heads", *INDEXER):
                if getattr(c, key) is None:
                    refuse_hf(c, key, "a positive integer (its attention layers always build the QSA indexer)")

    def from_hf(self, c: Any) -> ModelConfig:
        self.check_hf(c)
        if c.num_experts < 1:
            refuse_hf(c, "num_experts", "at least 1 (every Qwen4-Exp layer is a MoE)")
        cfg = self.common_from_hf(c, self.moe_from_hf(c, bool(c.norm_topk_prob), None), MROPE)
        indexer = {field: getattr(c, key) for key, field in INDEXER.items() if getattr(c, key) is not None}
        cfg.attention = QSAConfig(**{**dataclasses.asdict(cfg.attention), "kind": "qsa", **indexer})
        cfg.stream = GatedConfig(n=c.hc_count, rank=c.hc_lowrank)
        cfg.block = BlockConfig(kind="pre", attn_norm=False, mlp_norm=False, final_norm=False)
        eos = c.eos_token_id[0] if isinstance(c.eos_token_id, list) and c.eos_token_id else c.eos_token_id
        if c.ple_layer_ids and not (isinstance(eos, int) and 0 <= eos < c.vocab_size):
            refuse_hf(c, "eos_token_id", "a token id below vocab_size (the document end no n-gram crosses)")
        cfg.ngram_input = NGramInputConfig(
            layers=[i - 1 for i in c.ple_layer_ids],
            dim=None if c.ple_embed_dim == c.hidden_size else c.ple_embed_dim,
            boundary=eos if isinstance(eos, int) else None,
            **{field: getattr(c, key) for key, field in NGRAM.items()},
        )
        deltanet_layers(c, cfg, [False] * len(cfg_types(c)))
        gate = c.output_gate_type or c.hidden_act
        for kind in cfg.layers.kinds.values():
            if gate != "silu" and "attention" in kind:
                kind["attention"]["output_gate"] = gate
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, n, d = Tensors(cfg), cfg.stream.n, cfg.d_model
        t.add("tok_emb", "model.embed_tokens")
        inputs = set(cfg.ngram_input.layers)
        for i, (lc, b, h) in enumerate(t.layers()):
            if i in inputs:
                self.ngram_tensors(t, f"ngram_inputs.{i}", _ple(i), (n, d))
            if is_deltanet(lc):
                self.deltanet_tensors(t, lc, f"{b}.attn", f"{h}.linear_attn")
            else:
                self.qsa_tensors(t, lc, f"{b}.attn", f"{h}.self_attn")
            self.moe_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
            for ours, theirs in (("attn_stream", "attn_hyper_connection"), ("mlp_stream", "mlp_hyper_connection")):
                self.stream_tensors(t, f"{b}.{ours}", f"{h}.{theirs}", (n, d), inject=True)
        self.stream_tensors(t, "stream.mixer", "model.hyper_connection_mixer", (n, d), inject=False)
        return t.head()

    @staticmethod
    def qsa_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        """Gated attention's (Qwen3.5's), and the indexer's projection (queries, then its one key) and norms."""
        gated_attention_tensors(t, lc, archlab, hf)
        t.add(f"{archlab}.indexer.qk", f"{hf}.indexer.index_qk_proj")
        t.add(f"{archlab}.indexer.q_norm", f"{hf}.indexer.q_layernorm")
        t.add(f"{archlab}.indexer.k_norm", f"{hf}.indexer.k_layernorm")

    @staticmethod
    def stream_tensors(t: Tensors, archlab: str, hf: str, sizes: tuple[int, int], inject: bool) -> None:
        """A gated read (and write, ``inject``): the streams' norm scale (flat in HF), down, up, inject."""
        t.maps.append(TensorMap(f"{archlab}.norm_weight", (f"{hf}.hc_norm.weight",), "unflattened", sizes))
        t.add(f"{archlab}.down", f"{hf}.input_mix_weight_down")
        t.add(f"{archlab}.up", f"{hf}.input_mix_weight_up")
        if inject:
            t.add(f"{archlab}.inject", f"{hf}.block_inject_weight")

    @staticmethod
    def ngram_tensors(t: Tensors, archlab: str, hf: str, sizes: tuple[int, int]) -> None:
        """A layer's n-gram input: its table, key and value projections, three norm scales (flat in HF) and
        depthwise convolution ([C, 1, K] in HF)."""
        t.add(f"{archlab}.embedding.table", f"{hf}.ple_embedding.ngram_embedding")
        t.add(f"{archlab}.key", f"{hf}.key_proj")
        t.add(f"{archlab}.value", f"{hf}.value_proj")
        for name in ("norm_key", "norm_query", "norm_conv"):
            t.maps.append(TensorMap(f"{archlab}.{name}", (f"{hf}.{name}.weight",), "unflattened", sizes))
        t.maps.append(TensorMap(f"{archlab}.conv", (f"{hf}.conv1d.weight",), "depthwise_conv"))

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers' tensors less the n-gram hash constants, each checked against those its config gives
        (archlab computes them: a table whose constants differ is refused, naming the buffer)."""
        cfg = self.from_hf(c)
        out = dict(state)
        for k, i in enumerate(cfg.ngram_input.layers):
            for name, expected in ngram_constants(cfg, k).items():
                key = f"{_ple(i)}.ple_embedding.{name}"
                held = out.pop(key, None)
                if held is not None and not torch.equal(held.cpu(), expected):
                    allowed = "the hash constants its ngram_size, seed and vocab sizes give (archlab computes them)"
                    raise ConfigError(key, held.tolist(), allowed)
        return out

    def to_hf_weights(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The tensors with each n-gram table's hash constants, which transformers saves as buffers."""
        out = dict(state)
        for k, i in enumerate(cfg.ngram_input.layers):
            device = out[f"{_ple(i)}.ple_embedding.ngram_embedding.weight"].device
            out |= {f"{_ple(i)}.ple_embedding.{n}": v.to(device) for n, v in ngram_constants(cfg, k).items()}
        return out

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each n-gram table's checkpoint shards joined in their order, then Qwen3.5-MoE's reading (the
        vision tower and the multi-token prediction layer left out, the experts stacked)."""
        shards: dict[str, dict[int, Tensor]] = {}
        out = {}
        for name, tensor in state.items():
            match = SHARD.match(name)
            if match is None:
                out[name] = tensor
            else:
                shards.setdefault(match[1], {})[int(match[2])] = tensor
        for table, parts in shards.items():
            if sorted(parts) != list(range(len(parts))):
                raise ValueError(f"{table}: shards {sorted(parts)}; expected 0 to {len(parts) - 1}")
            out[f"{table}.weight"] = torch.cat([parts[k] for k in range(len(parts))])
        return super().from_checkpoint(cfg, out)


RECORDS: tuple[Family, ...] = (Qwen4Exp(),)
