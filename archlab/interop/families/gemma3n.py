"""Gemma 3n's text decoder (``Gemma3nForCausalLM``, ``gemma3n_text``): Gemma 4's sandwich layers of sliding and
full attention (plain RMSNorm scales, an unscaled value RMSNorm, unscaled scores, QK-norm per head), the last
``num_kv_shared_layers`` layers reading the keys and values of the last earlier layer of their type
(``attention.kv_shared``) and per-layer input embeddings (``model.per_layer_input``), on Gemma 3n's own parts:
AltUp's copies of the hidden state (``model.stream.kind: altup``), LAuReL beside attention
(``model.block.laurel_rank``), an MLP width per layer and the first layers' activation sparsity
(``mlp.d_ff`` and ``mlp.activation_sparsity`` by layer kind). Kinds: ``local`` and ``global`` by layer type,
with ``_shared``, ``_sparse`` and the width where those differ from layer 0's; the model's own parts are
layer 0's."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import STREAM_OPTIONS, LayersConfig, PerLayerInputConfig, shortest_layout
from archlab.interop.families.base import (
    LAYERS,
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
)
from archlab.interop.families.gemma4 import (
    ACTIVATIONS,
    GEMMA_NORMS,
    KIND,
    _activation,
    attention_tensors,
    layer_input_tensors,
    per_layer_input_tensors,
)
from archlab.interop.families.layered import per_type_rope, rope_per_type_to_hf
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, layer_types, sliding_window
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.sparsity import sparsity

WHY = " (Gemma 3n's layers)"


class Gemma3n(Family):
    """Gemma3nForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "gemma3n_text", "Gemma 3n", "Gemma3nForCausalLM", "Gemma3nTextConfig"
    prefix = "model."
    parts = "Gemma 4's sandwich layers with AltUp copies, LAuReL, per-layer widths and activation sparsity"
    features = LAYERS | {
        "model.scale_embedding",
        "model.attention.qk_norm",
        "model.attention.scale",
        "model.attention.window",
        "model.attention.v_norm",
        "model.attention.kv_shared",
        "model.head.softcap",
        "model.per_layer_input.dim",
        "model.stream.kind",
        "model.block.laurel_rank",
        "model.mlp.activation_sparsity",
    }
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps", "attention_dropout": "attention.dropout"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("sandwich",), ""),
            ("model.stream.kind", ("altup",), " (its AltUp copies of the hidden state)"),
            ("model.mlp.kind", ("geglu", "swiglu"), " (a gated MLP)"),
            ("model.scale_embedding", (True,), " (embeddings are multiplied by sqrt(d_model))"),
            NO_HEAD_BIAS,
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            ("model.attention.v_norm", (True,), " (its v_norm)"),
            ("model.attention.scale", (1.0,), " (its scores are unscaled)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.bias", (False,), ""),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts; the per-layer inputs and LAuReL present, the clip and the
        logits' cap numbers; each layer's attention the model's but for its type's window and kv_shared, its RoPE
        the first of its type's, its MLP layer 0's but for the width and
        the sparsity; the shared layers last, after a layer of each type; one activation for the MLP and the
        per-layer inputs."""
        found = super().part_problems(cfg)
        # the sizes it needs (the export hint sets Gemma3nTextConfig's defaults): per-layer inputs and LAuReL
        # present, the coefficients' clip and the logits' cap numbers (transformers' fields are floats)
        needed = (
            ("model.per_layer_input.dim", cfg.per_layer_input.dim, 256, "a positive width"),
            ("model.block.laurel_rank", cfg.block.laurel_rank, 64, "a positive rank"),
            ("model.stream.coef_clip", getattr(cfg.stream, "coef_clip", 120.0), 120.0, "a number"),
            ("model.head.softcap", cfg.head.softcap, 30.0, "a number"),
        )
        for field, value, default, wants in needed:
            if (value is None) if wants == "a number" else not value:
                found.append(Problem(field, value, wants, WHY, (default,)))
        lcs = layer_configs(cfg)
        types = layer_types(lcs)
        first = {t: next(lc for lc, u in zip(lcs, types) if u == t) for t in types}
        shared_from = next((i for i, lc in enumerate(lcs) if lc.attention.kv_shared), len(lcs))
        layered: list[Problem] = []
        for i, (lc, t) in enumerate(zip(lcs, types)):
            kind, ref = layer_kind(cfg, i), first[t]
            same = dataclasses.replace(cfg.attention, window=ref.attention.window, kv_shared=lc.attention.kv_shared)
            wanted = [
                ("attention", lc.attention, same, "one attention, and a window and RoPE per layer type"),
                ("position", lc.position, ref.position, "one attention and RoPE per layer type"),
            ]
            if type(lc.mlp) is type(lcs[0].mlp) and hasattr(lc.mlp, "activation_sparsity"):  # else: the rules' kind
                mlp = dataclasses.replace(lcs[0].mlp, d_ff=d_ff(lc), activation_sparsity=sparsity(lc))
                wanted.append(("mlp", lc.mlp, mlp, "one MLP but for its width and sparsity"))
            layered.extend(section_problems(cfg, kind, wanted, self.title))
            if i > shared_from and not lc.attention.kv_shared:
                field = kind_field(cfg, kind, "model.attention.kv_shared")
                layered.append(Problem(field, False, "true", f" ({self.title} shares the keys of its last layers)"))
        if shared_from < len(lcs) and set(types[:shared_from]) != set(types):
            field = kind_field(cfg, layer_kind(cfg, shared_from), "model.attention.kv_shared")
            why = " (transformers needs a layer of each type before the shared ones)"
            layered.append(Problem(field, True, "false", why))
        if _activation(cfg) is None:
            field = "model.per_layer_input.activation" if cfg.per_layer_input.dim else "model.mlp.kind"
            layered.append(Problem(field, cfg.mlp.kind, "geglu or swiglu, the per-layer inputs' activation its own"))
        return first_per_field(found + layered)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        pli, stream = cfg.per_layer_input, cfg.stream
        return dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            intermediate_size=[d_ff(lc) for lc in lcs],
            activation_sparsity_pattern=[float(sparsity(lc)) for lc in lcs],
            hidden_activation=_activation(cfg),
            layer_types=layer_types(lcs),
            sliding_window=sliding_window(cfg, lcs),
            rope_parameters=rope_per_type_to_hf(lcs),
            attention_bias=cfg.attention.qkv_bias,
            num_kv_shared_layers=sum(lc.attention.kv_shared for lc in lcs),
            final_logit_softcapping=cfg.head.softcap,
            tie_word_embeddings=cfg.head.tied,
            hidden_size_per_layer_input=pli.dim,
            vocab_size_per_layer_input=cfg.vocab_size if pli.vocab is None else pli.vocab,
            altup_num_inputs=stream.n,
            altup_active_idx=0,
            altup_correct_scale=True,
            altup_coef_clip=stream.coef_clip,
            laurel_rank=cfg.block.laurel_rank,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hidden = c.hidden_activation
        if hidden not in ACTIVATIONS:
            refuse_hf(c, "hidden_activation", " or ".join(repr(a) for a in ACTIVATIONS), hidden)
        for key, wanted, allowed in (
            ("altup_active_idx", 0, "0 (the first copy active)"),
            ("altup_correct_scale", True, "true"),
        ):
            if getattr(c, key) != wanted:
                refuse_hf(c, key, allowed)
        for key in ("hidden_size_per_layer_input", "laurel_rank"):
            if not getattr(c, key):
                refuse_hf(c, key, "a positive size (archlab's AltUp and LAuReL have them)")
        kind, approximate, act = ACTIVATIONS[hidden]
        types, n = checked_types(c), c.num_hidden_layers
        ropes = per_type_rope(c, types, c.head_dim)
        for t, rope in ropes.items():
            if rope.scaling.kind != "none":
                refuse_hf(c, f"rope_parameters.{t}.rope_type", "'default' (unscaled)", rope.scaling.kind)
        bias = bool(c.attention_bias)
        window = {t: c.sliding_window if t == SLIDING else None for t in types}
        attention = AttentionConfig(
            window=window[types[0]],
            head_dim=c.head_dim,
            n_kv_head=c.num_key_value_heads,
            qkv_bias=bias,
            out_bias=bias,
            qk_norm="head",
            v_norm=True,
            scale=1.0,
        )
        widths, sparse = list(c.intermediate_size), [float(s) for s in c.activation_sparsity_pattern]
        vocab = c.vocab_size_per_layer_input
        cfg = ModelConfig(
            dropout=0.0,
            scale_embedding=True,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="sandwich", laurel_rank=c.laurel_rank),
            position=ropes[types[0]],
            attention=attention,
            mlp=mlp_section(kind, approximate, d_ff=widths[0], bias=False, activation_sparsity=sparse[0]),
            stream=STREAM_OPTIONS.make(kind="altup", n=c.altup_num_inputs, coef_clip=c.altup_coef_clip),
            head=HeadConfig(bias=False, softcap=c.final_logit_softcapping, tied=bool(c.tie_word_embeddings)),
            per_layer_input=PerLayerInputConfig(
                dim=c.hidden_size_per_layer_input, vocab=None if vocab == c.vocab_size else vocab, activation=act
            ),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.dropout = float(cfg.attention.dropout)
        first_shared = n - c.num_kv_shared_layers
        names, kinds = [], {}
        for i, t in enumerate(types):
            over: dict[str, Any] = {}
            attention_over: dict[str, Any] = {"window": window[t]} if window[t] != attention.window else {}
            if i >= first_shared:
                attention_over["kv_shared"] = True
            if attention_over:
                over["attention"] = attention_over
            position = {f: v for f, v, _ in differences(ropes[t], cfg.position)}
            if position:
                over["position"] = position
            mlp_over = {
                k: v for k, v in (("d_ff", widths[i]), ("activation_sparsity", sparse[i])) if v != getattr(cfg.mlp, k)
            }
            if mlp_over:
                over["mlp"] = mlp_over
            name = KIND[t] + ("_shared" if i >= first_shared else "") + ("_sparse" if sparse[i] else "")
            name += f"_{widths[i]}" if widths[i] != widths[0] else ""
            base, k = name, 2
            while name in kinds and kinds[name] != over:  # the same name for other parts (two sparsities)
                name, k = f"{base}{k}", k + 1
            names.append(name)
            kinds[name] = over
        if len(set(names)) > 1 or kinds[names[0]]:
            first, pattern = shortest_layout(names)
            cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(**GEMMA_NORMS):
            attention_tensors(t, lc, b, h)
            f = d_ff(lc)
            t.stacked(f"{b}.mlp.gate_up", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], False, (f, f))
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
            t.add(f"{b}.laurel.left", f"{h}.laurel.linear_left")
            t.add(f"{b}.laurel.right", f"{h}.laurel.linear_right")
            t.add(f"{b}.laurel.norm", f"{h}.laurel.post_laurel_norm")
            altup = {"router_norm": "router_norm", "router": "modality_router"}
            altup |= {"predict": "prediction_coefs", "correct": "correction_coefs"}
            for ours, theirs in altup.items():
                t.add(f"{b}.layer_stream.{ours}", f"{h}.altup.{theirs}")
            t.maps.append(TensorMap(f"{b}.layer_stream.output_scale", (f"{h}.altup.correct_output_scale",)))
            layer_input_tensors(t, b, h)
        per_layer_input_tensors(t)
        for k in range(cfg.stream.n - 1):
            t.add(f"stream.projections.{k}", f"model.altup_projections.{k}")
            t.add(f"stream.unembed.{k}", f"model.altup_unembed_projections.{k}")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Gemma3n(),)
