"""Lara-Mini (``LaraMiniForCausalLM``): pre-norm layers of plain RMSNorms, each mixing tokens as ``layer_types``
says, by Qwen3.5's Gated DeltaNet (``linear_attention``), by Qwen3's attention (GQA, per-head QK-norm) over a
sliding window with RoPE (``sliding_attention``) or by the same attention over the whole past without
positions (``full_attention``), then a softmax top-k MoE of SwiGLU experts beside a shared expert added
ungated, in every layer.

In archlab the model's own attention is the full layers' without the window, its position RoPE; each layer is
of a kind: ``deltanet`` (Qwen3-Next's reset kind with the linear sizes), ``sliding`` (the window) or ``nope``
(``position.kind: none``), in the shortest ``first`` and ``pattern``. The published checkpoints fuse the
Gated DeltaNet's projections into one ``in_proj`` (rows q | k | v | z | b | a, archlab's own order) and name
its gated norm ``out_norm``: split and renamed on loading, as transformers does."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import (
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    bare,
    first_per_field,
    out_bias,
    ungrouped,
)
from archlab.interop.families.deltanet import deltanet_tensors_apart, is_deltanet, linear_keys, linear_layer_problems
from archlab.interop.families.experts import stack_saved_experts
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section, shared_experts
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, differences, kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.gated_deltanet import conv_channels
from archlab.nn.moe import expert_width

LINEAR, SLIDING, FULL = "linear_attention", "sliding_attention", "full_attention"
KINDS = {LINEAR: "deltanet", SLIDING: "sliding", FULL: "nope"}


class LaraMini(Family):
    """LaraMiniForCausalLM: see the module docstring."""

    mixer_kinds = ("gated_deltanet",)

    model_type, title, model_class, config_class = "lara_mini", "Lara-Mini", "LaraMiniForCausalLM", "LaraMiniConfig"
    prefix = "model."
    position_kind = ("rope", "none")
    parts = (
        "Gated DeltaNet (q, k, v, z, b, a projected apart), sliding-window RoPE and NoPE full GQA layers with "
        "per-head QK-norm, softmax MoE with an ungated shared expert"
    )
    features = frozenset(
        {"model.attention.qk_norm", "model.attention.window", "model.layers.first", "model.layers.pattern"}
    )
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.kind", ("moe",), " (every layer is a MoE)"),
            ("model.mlp.expert", ("swiglu",), " (hidden_act, silu, is also its linear layers' convolution's)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts, then each layer's, named as its kind sets them: one
        set of linear sizes; one attention but for the window, a window on the RoPE layers alone (one size),
        none on the NoPE ones; one RoPE; the model's MoE in every layer."""
        found = super().part_problems(cfg)
        if shared_experts(cfg.mlp) < 1:
            why = " (its MoE layers always have a shared expert)"
            found.append(Problem("model.mlp.n_shared_experts", shared_experts(cfg.mlp), "at least 1", why))
        if cfg.position.kind == "rope" and cfg.position.pairing != "half":
            found.append(Problem("model.position.pairing", cfg.position.pairing, "half"))
        lcs = layer_configs(cfg)
        linear = next((lc.attention for lc in lcs if is_deltanet(lc)), None)
        softmax = [lc for lc in lcs if not is_deltanet(lc)]
        attention = dataclasses.replace(softmax[0].attention, window=None) if softmax else cfg.attention
        rope = next((lc.position for lc in softmax if lc.position.kind == "rope"), cfg.position)
        window = next((lc.attention.window for lc in softmax if lc.attention.window is not None), None)
        layered: list[Problem] = []

        def differ(kind: str | None, section: str, have: Any, want: Any, why: str) -> None:
            for name, value, expected in differences(have, want):
                field = kind_field(cfg, kind, f"model.{section}.{name}")
                layered.append(Problem(field, value, bare(expected), f" ({self.title} has {why})", (expected,)))

        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if is_deltanet(lc):
                differ(
                    kind, "attention", lc.attention, linear, "one set of linear-attention sizes for every such layer"
                )
                layered.extend(linear_layer_problems(cfg, kind, lc))
            else:
                a = lc.attention
                same = dataclasses.replace(attention, window=window)
                differ(kind, "attention", dataclasses.replace(a, window=window), same, "one attention for every layer")
                if a.window is not None and a.window != window:
                    differ(
                        kind, "attention", a, dataclasses.replace(a, window=window), "one window for its sliding layers"
                    )
                wanted = "rope" if a.window is not None else "none"
                if lc.position.kind != wanted:
                    field = kind_field(cfg, kind, "model.position.kind")
                    why = f" ({self.title}'s sliding layers have RoPE, its full layers no positions)"
                    layered.append(Problem(field, lc.position.kind, wanted, why))
                elif wanted == "rope":
                    differ(kind, "position", lc.position, rope, "one RoPE for every sliding layer")
            differ(kind, "mlp", lc.mlp, cfg.mlp, "one MoE for every layer")
        return found + first_per_field(layered)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        m = cfg.mlp
        softmax = [lc for lc in lcs if not is_deltanet(lc)]
        rope = next((lc for lc in softmax if lc.position.kind == "rope"), cfg)
        window = next((lc.attention.window for lc in softmax if lc.attention.window is not None), None)
        out = dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            hidden_act="silu",
            rope_parameters=rope_to_hf(rope),
            attention_bias=cfg.attention.qkv_bias,
            attention_dropout=cfg.attention.dropout,
            sliding_window=window if window is not None else cfg.context_length,
            layer_types=[LINEAR if is_deltanet(lc) else FULL if lc.attention.window is None else SLIDING for lc in lcs],
            num_experts=m.routing.n_experts,
            num_experts_per_tok=m.routing.top_k,
            moe_intermediate_size=expert_width(cfg),
            shared_expert_intermediate_size=m.n_shared_experts * expert_width(cfg),
            norm_topk_prob=m.routing.normalize_top_k,
            router_aux_loss_coef=m.routing.aux_loss_weight,
        )
        return out | linear_keys(lcs)

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU experts; its linear layers' convolution is SiLU'd)")
        types = list(c.layer_types)
        if len(types) != c.num_hidden_layers or set(types) - set(KINDS):
            refuse_hf(c, "layer_types", f"num_hidden_layers entries, each one of {sorted(KINDS)}", types)
        if c.num_experts < 1:
            refuse_hf(c, "num_experts", "at least 1 (every Lara-Mini layer is a MoE)")
        f, shared = c.moe_intermediate_size, c.shared_expert_intermediate_size
        if shared < f or shared % f:
            refuse_hf(
                c,
                "shared_expert_intermediate_size",
                f"a positive multiple of moe_intermediate_size={f} (archlab's shared experts: n·expert_d_ff)",
            )
        hd, bias = config_head_dim(c), bool(c.attention_bias)
        mlp = mlp_section(
            "moe",
            expert="swiglu",
            approximate="none",
            bias=False,
            expert_d_ff=f,
            n_shared_experts=shared // f,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                normalize_top_k=bool(c.norm_topk_prob),
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads,
            head_dim=hd,
            qkv_bias=bias,
            out_bias=bias,
            dropout=float(c.attention_dropout),
            qk_norm="head",
        )
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=False, scalings=("default",)),
            attention=attention,
            mlp=mlp,
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        names = [KINDS[t] for t in types]
        kinds: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(names):
            if name == "deltanet":
                if c.linear_num_value_heads % c.linear_num_key_heads:
                    refuse_hf(c, "linear_num_key_heads", "a divisor of linear_num_value_heads (each serves a group)")
                kinds[name] = {
                    "attention": dict(
                        kind="gated_deltanet",
                        n_head=c.linear_num_value_heads,
                        key_heads=c.linear_num_key_heads,
                        key_head_dim=c.linear_key_head_dim,
                        v_head_dim=c.linear_value_head_dim,
                        conv_kernel=c.linear_conv_kernel_dim,
                    )
                }
            elif name == "sliding":
                kinds[name] = {"attention": {"window": c.sliding_window}}
            else:
                kinds[name] = {"position": {"kind": "none"}}
        first, pattern = shortest_layout(names)
        cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        width = cfg.mlp.n_shared_experts * expert_width(cfg)
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
            if is_deltanet(lc):
                deltanet_tensors_apart(t, lc, f"{b}.attn", f"{h}.linear_attn")
            else:
                t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", lc.attention.qkv_bias)
                t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_norm")
                t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_norm")
                t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", lc.attention.out_bias)
            mlp, hf = f"{b}.mlp", f"{h}.mlp"
            t.add(f"{mlp}.router", f"{hf}.gate")
            t.maps.append(TensorMap(f"{mlp}.experts.gate_up", (f"{hf}.experts.gate_up_proj",)))
            t.maps.append(TensorMap(f"{mlp}.experts.down", (f"{hf}.experts.down_proj",)))
            shared = f"{hf}.shared_expert"
            t.stacked(f"{mlp}.shared.gate_up", [f"{shared}.gate_proj", f"{shared}.up_proj"], False, (width, width))
            t.add(f"{mlp}.shared.down", f"{shared}.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A checkpoint's fused ``linear_attn.in_proj`` split into in_proj_qkv, _z, _b, _a and its
        ``out_norm`` read as ``norm``, as transformers loads them; saved experts stacked."""
        for i, lc in enumerate(layer_configs(cfg)):
            h = f"model.layers.{i}.linear_attn"
            if not is_deltanet(lc) or f"{h}.in_proj.weight" not in state:
                continue
            a = lc.attention
            sizes = [conv_channels(lc), a.n_head * a.v_head_dim, a.n_head, a.n_head]
            parts = torch.split(state.pop(f"{h}.in_proj.weight"), sizes)
            state.update({f"{h}.in_proj_{x}.weight": p for x, p in zip(("qkv", "z", "b", "a"), parts)})
            if f"{h}.out_norm.weight" in state:
                state[f"{h}.norm.weight"] = state.pop(f"{h}.out_norm.weight")
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (LaraMini(),)
