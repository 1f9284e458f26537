"""dots.3-note's language model (``dots3_note_text``, ``Dots3NoteForCausalLM``): DeepSeek-V3's latent
attention with its normed latents scaled by sqrt(d / rank) (``latent_scale``), the shared rotated key normed
(``rope_key_norm``) and a sigmoid gate per head (``gate`` head), in three layer types: full, sliding
(their own heads, ranks and head sizes, ``per_layer_config``) and indexed (``dsa``, its indexer rotating
interleaved pairs), each type with its own RoPE base; over DeepSeek-V3's routing with shared experts and dense
first layers (``mlp_layer_types``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import LAYERS, NO_HEAD_BIAS, Family, Problem, Rule, bare
from archlab.interop.families.deepseek import mla_tensors
from archlab.interop.families.deepseek_v32 import DSA_KEYS, dsa_tensors
from archlab.interop.families.experts import dense_first, grouped_moe_to_hf, is_dense, pre_norm_tensors
from archlab.interop.families.layered import rope_of
from archlab.interop.families.layered_moe import _unique, apply_layout, distinct_layers, one_dense_width, one_window
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.sigmoid_moe import dense_prefix, mlp_layer_types
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.interop.families.windows import FULL, SLIDING, sliding_window
from archlab.nn.mixers.dsa import DSAConfig
from archlab.nn.mixers.mla import MLAConfig
from archlab.nn.rope import RoPEConfig

INDEXED = "indexed_attention"
TYPES = (FULL, SLIDING, INDEXED)
# what transformers reads per layer (``per_layer_config``) in its attention: archlab's mla fields of a layer kind
LAYER_KEYS = {
    "num_attention_heads": "n_head",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
}
PER_LAYER = frozenset({*LAYER_KEYS, "num_key_value_heads", "head_dim"})  # the per-layer keys it converts
MODEL_KEYS = {  # copied as they are; the heads are per layer (a heterogeneous config refuses them globally)
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layer",
    "max_position_embeddings": "context_length",
    "initializer_range": "init_std",
    "tie_word_embeddings": "head.tied",
    "rms_norm_eps": "norm.eps",
}


def layer_type(lc: ModelConfig) -> str:
    """transformers' layer type of a layer: indexed (dsa), sliding (a window) or full."""
    if lc.attention.kind == "dsa":
        return INDEXED
    return FULL if lc.attention.window is None else SLIDING


def attention_keys(lc: ModelConfig) -> dict[str, Any]:
    """The per-layer config keys of a layer's attention (``head_dim``: its query/key head, nope + rope)."""
    a = lc.attention
    keys = {hf: getattr(a, ours) for hf, ours in LAYER_KEYS.items()}
    return dict(keys, num_key_value_heads=a.n_head, head_dim=a.qk_nope_head_dim + a.qk_rope_head_dim)


class Dots3Note(_Sparse):
    """Dots3NoteForCausalLM: pre-norm RMSNorm blocks; latent attention with queries through ``q_lora_rank``,
    both normed latents times sqrt(hidden_size / rank), the shared rotated key RMS-normed before RoPE, rotated
    pairs interleaved, every norm at ``rms_norm_eps``, each head's output times sigmoid(``g_proj``(x)); per
    ``layer_types`` full, sliding (``sliding_window``) or indexed attention (DeepSeek sparse attention whose
    indexer reads the scaled query latent and rotates interleaved pairs), each type its own sizes and RoPE
    base; dense first layers (``mlp_layer_types``), then DeepSeek-V3's routing (sigmoid scores, correction
    bias, groups, ``norm_topk_prob``, ``routed_scaling_factor``) beside ``n_shared_experts`` shared experts.
    Kinds: ``full``, ``sliding``, ``indexed``, each with ``_dense``."""

    model_type, title = "dots3_note_text", "dots.3-note"
    model_class, config_class = "Dots3NoteForCausalLM", "Dots3NoteTextConfig"
    attention_kind = "mla"
    mixer_kinds = ("dsa",)
    position_why = " (it always rotates qk_rope_head_dim dims)"
    keys = MODEL_KEYS
    shared_experts = True
    features = (
        frozenset(
            {
                "model.attention.window",
                "model.attention.gate",
                "model.attention.latent_scale",
                "model.attention.rope_key_norm",
            }
        )
        | LAYERS
    )
    parts = "MLA with scaled latents, a normed rotated key and a head gate; sliding, full and DSA layers; V3 router"

    def mixer_problems(self, cfg: ModelConfig) -> list[Problem]:
        """Its model's mixer may be mla or dsa (each layer one of them)."""
        found = super().mixer_problems(cfg)
        return [p for p in found if not (p.field == "model.attention.kind" and p.value == "dsa")]

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        """What every layer (``cfg``: one layer's config, or the model's) holds."""
        a = cfg.attention
        rules: list[Rule] = [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.position.pairing", ("interleaved",), " (it rotates interleaved pairs)"),
            ("model.attention.latent_scale", (True,), " (its latents are times sqrt(hidden_size / rank))"),
            ("model.attention.rope_key_norm", (True,), " (its shared rotated key is normed)"),
            ("model.attention.gate", ("head",), " (each head's output times sigmoid(g_proj(x)))"),
        ]
        if a.kind == "dsa":
            rules += [
                ("model.attention.index_pairing", ("interleaved", "model"), " (its indexer rotates interleaved pairs)"),
                ("model.attention.window", (None,), " (its indexed layers do not slide)"),
            ]
        rules.append(("model.mlp.bias", (False,), " (its MLPs have no biases)"))
        if cfg.mlp.kind != "moe":
            return [*rules, ("model.mlp.kind", ("swiglu", "geglu", "moe"), " (its dense layers are gated)")]
        return [
            *rules,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """Each distinct layer's problems (named as its kind's fields), then the layout's: a MoE model, its
        dense layers first and of its experts' kind, one window, one configuration and RoPE per layer type,
        one RoPE but its base, one dropout, MoE layers alike, dense layers of one width."""
        found = Family.part_problems(self, cfg)  # not _Sparse's: its layer kinds differ only in the dense MLP
        if cfg.mlp.kind == "moe" and cfg.mlp.n_shared_experts < 1:
            why = " (its MoE layers always have shared experts)"
            found.append(Problem("model.mlp.n_shared_experts", cfg.mlp.n_shared_experts, "at least 1", why))
        layers = layer_configs(cfg)
        for kind, lc in distinct_layers(cfg):
            if kind is not None:
                found += [p._replace(field=kind_field(cfg, kind, p.field)) for p in Family.part_problems(self, lc)]
            if lc.attention.q_lora_rank is None:
                field = kind_field(cfg, kind, "model.attention.q_lora_rank")
                found.append(Problem(field, None, "a positive integer", " (its queries always pass q_a_proj)"))
        if cfg.mlp.kind != "moe":
            found.append(Problem("model.mlp.kind", cfg.mlp.kind, "moe", " (a mixture of experts)"))
        n_dense = dense_first(layers)
        first: dict[str, tuple[int, ModelConfig]] = {}
        for i, lc in enumerate(layers):
            kind = layer_kind(cfg, i)
            if is_dense(lc) and i >= n_dense:
                why = f" ({self.title}'s dense layers are its first ones)"
                found.append(Problem(kind_field(cfg, kind, "model.mlp.kind"), lc.mlp.kind, "moe", why))
            if is_dense(lc) and cfg.mlp.kind == "moe" and lc.mlp.kind != cfg.mlp.expert:
                why = f" ({self.title}'s dense layers are of its experts' kind)"
                found.append(Problem(kind_field(cfg, kind, "model.mlp.kind"), lc.mlp.kind, cfg.mlp.expert, why))
            ref_i, ref = first.setdefault(layer_type(lc), (i, lc))
            same_type = f" ({self.title} holds one configuration per layer type)"
            found += self._differ(cfg, kind, "attention", lc.attention, ref.attention, same_type)
            found += self._differ(cfg, kind, "position", lc.position, ref.position, same_type)
            if isinstance(lc.position, RoPEConfig) and isinstance(layers[0].position, RoPEConfig):
                base = dataclasses.replace(layers[0].position, theta=lc.position.theta)
                why = f" ({self.title}'s types differ in theta)"
                found += self._differ(cfg, kind, "position", lc.position, base, why)
            if lc.attention.dropout != layers[0].attention.dropout:
                found.append(Problem(kind_field(cfg, kind, "model.attention.dropout"), lc.attention.dropout,
                                     bare(layers[0].attention.dropout), f" ({self.title} has one attention_dropout)"))  # fmt: skip
            mates = [m for m in layers if is_dense(m) == is_dense(lc)]
            found += self._differ(cfg, kind, "mlp", lc.mlp, mates[0].mlp, f" ({self.title}'s MoE layers are alike)")
        found += one_window(layers) + one_dense_width(cfg, layers)
        return _unique(found)

    @staticmethod
    def _differ(cfg: ModelConfig, kind: str | None, section: str, have: Any, want: Any, why: str) -> list[Problem]:
        return [
            Problem(kind_field(cfg, kind, f"model.{section}.{name}"), value, bare(wanted), why, (wanted,))
            for name, value, wanted in differences(have, want)
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        types = [layer_type(lc) for lc in layers]
        by_type: dict[str, ModelConfig] = {}
        for t, lc in zip(types, layers):
            by_type.setdefault(t, lc)
        top = attention_keys(layers[0])
        per_layer = {}
        for i, lc in enumerate(layers):
            keys = attention_keys(lc)
            changed = {k: v for k, v in keys.items() if v != top[k]}
            if changed:
                per_layer[i] = changed
        dsa = by_type.get(INDEXED)
        index = DSAConfig() if dsa is None else dsa.attention
        moe = grouped_moe_to_hf(cfg)
        del moe["first_k_dense_replace"]
        return dict(
            self.base_to_hf(cfg),
            **top,
            **moe,
            **{hf: getattr(index, ours.split(".")[1]) for hf, ours in DSA_KEYS.items()},
            shared_experts_intermediate_size=moe["moe_intermediate_size"],
            mlp_layer_types=mlp_layer_types(cfg),
            attention_bias=False,
            layer_types=types,
            sliding_window=sliding_window(cfg, layers),
            rope_parameters={t: {"rope_type": "default", "rope_theta": lc.position.theta} for t, lc in by_type.items()},
            per_layer_config=per_layer,  # always given: without it, transformers makes full layers indexed
        )

    def from_hf(self, c: Any) -> ModelConfig:
        n = c.num_hidden_layers
        types = list(c.layer_types)
        if len(types) != n or set(types) - set(TYPES):
            refuse_hf(c, "layer_types", f"{n} entries, each one of {', '.join(map(repr, TYPES))}", types)
        others = sorted(set(c.per_layer_attributes or ()) - PER_LAYER)
        if others:
            refuse_hf(c, "per_layer_config", f"overrides of the attention's sizes alone ({', '.join(others)} found)")
        attention: dict[str, MLAConfig] = {}
        for t in set(types):  # transformers holds the layers of a type alike (its config checks them)
            lc = c.per_layer_config[types.index(t)]
            if lc.attention_bias:
                refuse_hf(c, "attention_bias", "false (archlab's mla projections have no biases)")
            if lc.q_lora_rank is None:
                refuse_hf(c, "q_lora_rank", "a positive integer (its queries always pass q_a_proj)")
            sizes = {ours: getattr(lc, hf) for hf, ours in LAYER_KEYS.items()}
            fields = dict(sizes, dropout=float(c.attention_dropout), latent_scale=True, rope_key_norm=True, gate="head")
            if t == INDEXED:
                made: MLAConfig = DSAConfig(**fields, **{ours.split(".")[1]: getattr(c, hf) for hf, ours in DSA_KEYS.items()},
                                            index_pairing="model")  # fmt: skip
            else:
                made = MLAConfig(**fields, window=c.sliding_window if t == SLIDING else None)
            attention[t] = made
        ropes = {t: self.rope_from_hf(c, t, types) for t in set(types)}
        if c.shared_experts_intermediate_size != c.moe_intermediate_size:
            why = f"moe_intermediate_size={c.moe_intermediate_size} (archlab's shared experts are of the routed width)"
            refuse_hf(c, "shared_experts_intermediate_size", why)
        mlp = self.moe_from_hf(
            c,
            c.n_routed_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.n_shared_experts,
            routed_scale=float(c.routed_scaling_factor),
            **self.v3_routing(c),
        )
        cfg = self.base_from_hf(c, ropes[types[0]], attention[types[0]], mlp)
        n_dense = dense_prefix(c)
        names, overrides = [], {}
        for i, t in enumerate(types):
            name = {FULL: "full", SLIDING: "sliding", INDEXED: "indexed"}[t] + "_dense" * (i < n_dense)
            over: dict[str, Any] = {}
            a, base = attention[t], cfg.attention
            if type(a) is not type(base):
                over["attention"] = dataclasses.asdict(a)
            elif a != base:
                over["attention"] = {k: v for k, v, _ in differences(a, base)}
            if ropes[t] != cfg.position:
                over["position"] = {"theta": ropes[t].theta}
            if i < n_dense:
                over["mlp"] = {"kind": mlp.expert}
            names.append(name)
            overrides[name] = over
        return apply_layout(cfg, names, overrides)

    def rope_from_hf(self, c: Any, t: str, types: list[str]) -> RoPEConfig:
        """The RoPE of layer type ``t``: its base; transformers' rotated dims (head_dim times the partial
        factor it computes) must be that type's ``qk_rope_head_dim``, which mla rotates."""
        params = (c.rope_parameters or {}).get(t)
        if not isinstance(params, dict):
            refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers", params)
        if params.get("rope_type", "default") != "default":
            why = "'default' (its attention's softmax scale takes no YaRN mscale; archlab converts unscaled RoPE)"
            refuse_hf(c, f"rope_parameters.{t}.rope_type", why, params.get("rope_type"))
        lc = c.per_layer_config[types.index(t)]
        rope = rope_of(c, params, lc.head_dim, t, partial=True)
        dims = int(lc.head_dim * params.get("partial_rotary_factor", 1.0))
        if dims != lc.qk_rope_head_dim:
            why = f"qk_rope_head_dim / head_dim (it rotates {dims} dims; mla rotates qk_rope_head_dim)"
            refuse_hf(c, f"rope_parameters.{t}.partial_rotary_factor", why, params.get("partial_rotary_factor"))
        return RoPEConfig(theta=rope.theta, pairing="interleaved")

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def attention(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            layer = Tensors(lc)
            (dsa_tensors if lc.attention.kind == "dsa" else mla_tensors)(layer, archlab, hf)
            layer.add(f"{archlab}.k_rope_norm", f"{hf}.k_rope_only_layernorm")
            layer.add(f"{archlab}.gate", f"{hf}.g_proj")
            t.maps += layer.maps

        return pre_norm_tensors(cfg, attention)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Without the multi-token prediction layers transformers leaves unread (``model.layers.<n_layer>.*``,
        ``model.mtp.*``), each expert stacked."""
        extra = (f"model.layers.{cfg.n_layer}.", "model.mtp.")
        return super().from_checkpoint(cfg, {k: v for k, v in state.items() if not k.startswith(extra)})


RECORDS: tuple[Family, ...] = (Dots3Note(),)
