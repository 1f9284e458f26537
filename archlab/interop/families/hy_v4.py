"""Hunyuan V4 (``hy_v4``, HYV4ForCausalLM): DeepSeek-V3's MoE under DeepSeek sparse attention, with HY V4's
parts: each layer dense or MoE (``mlp_layer_types``), its indexer its own or the last earlier one's choice
(``indexer_types`` "shared": dsa's ``index_shared``), the indexer's rotated dims last (``index_rope_at``),
attention sinks and an elementwise output gate, routed experts clamped at ``swiglu_limit`` (the shared and
dense ones not), and independent hyper-connections (``mhc`` with ``mix: none``: no comb, post scaled by
``hc_magnitude``, with ε; ``init: hy_v4``, its start-up values). Its checkpoints' multi-token prediction
layers, which transformers leaves out, are not read."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import STREAM_OPTIONS
from archlab.interop.families.base import LAYERS, Family, Problem, Rule, bare, first_per_field
from archlab.interop.families.deepseek import _DeepSeek, latent_eps_from_hf
from archlab.interop.families.deepseek_v32 import DSA_KEYS, dsa_layers, indexer_types, layer_attention
from archlab.interop.families.experts import is_dense, mlp_tensors, pre_norm_tensors
from archlab.interop.families.layered import view
from archlab.interop.families.mlps import dense_of
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.nn.mixers.dsa import DSAConfig


def dense_mlp(mlp: Any) -> Any:
    """The dense layers' MLP of a MoE section: one SwiGLU of the experts' kind and d_ff, unclamped."""
    return dataclasses.replace(dense_of(mlp), swiglu_limit=None)


class HYV4(_DeepSeek):
    """HYV4ForCausalLM: mla's latents (halves rotated) with dsa's indexer in every layer (``indexer_types``),
    V3's routing, shared experts, per-layer dense MLPs (``mlp_layer_types``), sinks, output gates, clamped
    routed experts and HY V4's hyper-connections."""

    model_type, title, model_class, config_class = ("hy_v4", "Hunyuan V4", "HYV4ForCausalLM", "HYV4Config")
    parts = (
        "dsa (indexer shared across layers, rotated dims last, sinks, gates), DeepSeekMoE clamped, per-layer "
        "dense MLPs, mhc without comb"
    )
    attention_kind = "dsa"
    keys = {**_DeepSeek.keys, **DSA_KEYS}
    scalings = ("none", "yarn")
    features = _DeepSeek.features | LAYERS | {"model.stream.kind", "model.attention.sinks", "model.attention.gate"}
    features |= {"model.mlp.swiglu_limit", "model.mlp.shared_swiglu_limit"}

    # the checkpoints' names of the hyper-connections, sinks and gates, as transformers' conversion_mapping reads them
    checkpoint_renames = {".hc_pre.hc_": ".hc_", ".learnable_sink_param": ".sinks", ".linear_gate": ".gate_proj"}
    checkpoint_renames |= {f".hc_{ours}_layer.hc_{p}": f".{theirs}_hc.{p}" for ours, theirs in (("attn", "attn"), ("mlp", "ffn")) for p in ("fn", "base", "scale")}  # fmt: skip
    checkpoint_renames |= {f".hc_head_{p}": f".hc_{p}" for p in ("fn", "base", "scale")}

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        eps = cfg.norm.eps
        return super().family_rules(cfg) + [
            ("model.position.pairing", ("half",), " (it rotates halves)"),
            ("model.attention.index_pairing", ("half", "model"), " (its indexer rotates halves)"),
            ("model.attention.index_rope_at", ("last",), " (its indexer rotates its last dims)"),
            ("model.attention.index_norm_eps", (eps,), " (its indexer's key norm uses rms_norm_eps)"),
            ("model.attention.gate", ("elementwise",), " (its heads' outputs are gated per value dim)"),
            ("model.attention.sinks", (True,), " (every head has a learned sink)"),
            ("model.stream.kind", ("mhc",), " (its hyper-connections)"),
            ("model.stream.mix", ("none",), " (its hyper-connections carry the streams unmixed)"),
            ("model.stream.post_eps", (True,), " (it adds hc_eps to post)"),
            ("model.stream.sinkhorn_iters", (20,), " (unread without a mix: the default)"),
            ("model.mlp.swiglu_clamp", ("gate",), " (its experts clamp the gate before SiLU)"),
            ("model.mlp.shared_swiglu_limit", (0.0,), " (its shared experts are unclamped)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = Family.part_problems(self, cfg)
        m = cfg.mlp
        if cfg.attention.q_lora_rank is None:
            why = " (its queries and its indexer's always pass the query latent)"
            found.append(Problem("model.attention.q_lora_rank", None, "a positive integer", why))
        if m.kind == "moe" and m.swiglu_limit is None:
            found.append(Problem("model.mlp.swiglu_limit", None, "a positive number", " (its routed experts clamp)"))
        if m.kind == "moe" and m.n_shared_experts < 1:
            why = " (its MoE layers always have shared experts)"
            found.append(Problem("model.mlp.n_shared_experts", m.n_shared_experts, "at least 1", why))
        return found + self.layer_problems(cfg)

    def layer_problems(self, cfg: ModelConfig) -> list[Problem]:
        """What a layer kind sets that the family cannot hold: anything but a dense MLP (the experts' kind,
        unclamped) and the indexer shared."""
        found: list[Problem] = []
        why = f" ({self.title}'s layers differ in their MLP being dense and their indexer being shared alone)"
        for i, lc in enumerate(layer_configs(cfg)):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            attention = dataclasses.replace(lc.attention, index_shared=cfg.attention.index_shared)
            mlp = dense_mlp(cfg.mlp) if is_dense(lc) and cfg.mlp.kind == "moe" else cfg.mlp
            for section, ours, want in (("attention", attention, cfg.attention), ("position", lc.position, cfg.position), ("mlp", lc.mlp, mlp)):  # fmt: skip
                for name, value, wanted in differences(ours, want):
                    field = kind_field(cfg, kind, f"model.{section}.{name}")
                    found.append(Problem(field, value, bare(wanted), why, (wanted,)))
        return first_per_field(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs, s = layer_configs(cfg), cfg.stream
        out = dict(
            self.mla_to_hf(cfg),
            mlp_layer_types=["dense" if is_dense(lc) else "sparse" for lc in lcs],
            indexer_types=indexer_types(cfg),
            layer_types=["indexed_attention"] * cfg.n_layer,
            hc_mult=s.n,
            hc_magnitude=s.post_scale,
            hc_eps=s.eps,
            swiglu_limit=cfg.mlp.swiglu_limit,
        )
        out.pop("first_k_dense_replace")  # mlp_layer_types says which layers are dense
        return out

    def from_hf(self, c: Any) -> ModelConfig:
        n = c.num_hidden_layers
        if c.q_lora_rank is None:
            refuse_hf(c, "q_lora_rank", "a positive integer (archlab's dsa: the indexer reads the query latent)")
        if list(c.layer_types) != ["indexed_attention"] * n:
            refuse_hf(c, "layer_types", "'indexed_attention' in every layer (what transformers' HYV4 builds)")
        mlps, indexers = list(c.mlp_layer_types), list(c.indexer_types)
        if len(mlps) != n or any(t not in ("dense", "sparse") for t in mlps):
            refuse_hf(c, "mlp_layer_types", "one 'dense' or 'sparse' per layer")
        if len(indexers) != n or any(t not in ("full", "shared") for t in indexers) or indexers[:1] != ["full"]:
            refuse_hf(c, "indexer_types", "one 'full' or 'shared' per layer, the first 'full' (a shared one reuses it)")
        if not c.swiglu_limit > 0:
            refuse_hf(c, "swiglu_limit", "a positive number (transformers' HYV4 clamps at any value, 0 too)")
        cfg = self.deepseek_from_hf(view(c, first_k_dense_replace=0), "half", **self.v3_routing(c))
        cfg.mlp = dataclasses.replace(cfg.mlp, swiglu_limit=float(c.swiglu_limit), shared_swiglu_limit=0.0)
        # init: a model trained from scratch starts its streams as HY V4's _init_weights does (conversion copies them)
        hc = dict(n=c.hc_mult, eps=float(c.hc_eps), mix="none", post_scale=float(c.hc_magnitude), post_eps=True)
        cfg.stream = STREAM_OPTIONS.make(kind="mhc", **hc, init="hy_v4")
        dense = {"mlp": {"kind": cfg.mlp.expert, "swiglu_limit": None}}
        return dsa_layers(cfg, [t == "dense" for t in mlps], indexers, dense)

    def attention_from_hf(self, c: Any) -> DSAConfig:
        return DSAConfig(
            dropout=float(c.attention_dropout),
            latent_norm_eps=latent_eps_from_hf(c),
            gate="elementwise",
            sinks=True,
            index_pairing="half",
            index_rope_at="last",
            index_norm_eps=float(c.rms_norm_eps),
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        maps = pre_norm_tensors(cfg, hy_attention, mlp_tensors)
        for i in range(cfg.n_layer):
            for ours, theirs in (("attn_stream", "attn_hc"), ("mlp_stream", "ffn_hc")):
                for name in ("fn", "base", "scale"):
                    maps.append(TensorMap(f"blocks.{i}.{ours}.{name}", (f"model.layers.{i}.{theirs}.{name}",)))
        for name in ("hc_fn", "hc_base", "hc_scale"):
            maps.append(TensorMap(f"stream.{name}", (f"model.hc_head.{name}",)))
        return maps


def hy_attention(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's latent attention, its indexer where it has one, its output gate and its sinks."""
    layer_attention(t, lc, archlab, hf)
    t.add(f"{archlab}.gate", f"{hf}.gate_proj")
    t.maps.append(TensorMap(f"{archlab}.sinks", (f"{hf}.sinks",)))


RECORDS: tuple[Family, ...] = (HYV4(),)
