"""Jamba (``JambaForCausalLM``, AI21's Mamba-1 hybrid): pre-norm layers of two RMSNorms, each mixing tokens by
Mamba-1 (``JambaMambaMixer``: archlab's ``mamba`` with Δ, B and C RMS-normed at ``rms_norm_eps``, each norm with
a learned scale) or, where ``i % attn_layer_period == attn_layer_offset``, GQA attention without positions;
then a SwiGLU MLP or, where ``i % expert_layer_period == expert_layer_offset`` and ``num_experts`` > 1, a MoE
of SwiGLU experts of the same width (softmax over every expert, the top-k weights not renormalised).

In archlab the model's own parts are an attention layer's with the dense MLP; the kinds ``mamba`` (Mamba-1
whole), ``moe`` (the MoE whole, its experts of the model's d_ff), ``mamba_moe`` (both) and ``attention``
(overriding nothing), in the shortest ``first`` and ``pattern``. Written back, the attention and the MoE
layers are each the period and offset of JambaConfig's defaults where those give them, else the shortest
that does; a layout that no period and offset give is refused, naming ``model.layers.pattern``. Checkpoints
save each expert apart: stacked on loading, as transformers does."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from archlab.config import MLP_OPTIONS, POSITION_OPTIONS, BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import (
    NO_HEAD_BIAS,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
)
from archlab.interop.families.experts import stack_saved_experts
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mamba1 import mixer_tensors
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.mamba import MambaConfig, dt_rank, inner
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

MAMBA, MOE, MAMBA_MOE, ATTENTION = "mamba", "moe", "mamba_moe", "attention"
ATTN_DEFAULT, EXPERT_DEFAULT = (8, 4), (2, 1)  # JambaConfig's (period, offset) of each


def is_mamba(lc: ModelConfig) -> bool:
    return lc.attention.kind == "mamba"


def is_moe(lc: ModelConfig) -> bool:
    return lc.mlp.kind == "moe"


def periodic(indices: list[int], n: int, default: tuple[int, int]) -> tuple[int, int] | None:
    """The (period, offset) whose layers ``i % period == offset`` of ``n`` are ``indices``: ``default`` where
    it gives them, else the shortest period (none: a period past the last layer); None if none does."""
    wanted = set(indices)
    for period, offset in [default, *((p, o) for p in range(1, n + 2) for o in range(p))]:
        if {i for i in range(n) if i % period == offset} == wanted:
            return period, offset
    return None


def mamba_kind(c: Any) -> dict[str, Any]:
    """The ``mamba`` kind's mixer of a JambaConfig: Mamba-1 with Jamba's scaled norms at ``rms_norm_eps``;
    ``inner`` and ``dt_rank`` only where they are not MambaConfig's defaults (expand 2, ceil(d/16))."""
    out: dict[str, Any] = dict(
        kind="mamba",
        state_size=c.mamba_d_state,
        conv_kernel=c.mamba_d_conv,
        conv_bias=bool(c.mamba_conv_bias),
        bias=bool(c.mamba_proj_bias),
        bc_dt_norm=True,
        bc_dt_norm_scale=True,
        bc_dt_norm_eps=float(c.rms_norm_eps),
    )
    if c.mamba_expand != 2:
        out["inner"] = c.mamba_expand * c.hidden_size
    if int(c.mamba_dt_rank) != math.ceil(c.hidden_size / 16):
        out["dt_rank"] = int(c.mamba_dt_rank)
    return out


def moe_kind(c: Any) -> dict[str, Any]:
    """The ``moe`` kind's MLP of a JambaConfig: SwiGLU experts of the model's d_ff, Jamba's router."""
    routing = dict(n_experts=c.num_experts, top_k=c.num_experts_per_tok, normalize_top_k=False)
    return dict(kind="moe", routing=dict(routing, aux_loss_weight=float(c.router_aux_loss_coef)))


class Jamba(Family):
    """JambaForCausalLM: see the module docstring."""

    mixer_kinds = ("mamba",)

    model_type, title, model_class, config_class = "jamba", "Jamba", "JambaForCausalLM", "JambaConfig"
    prefix = "model."
    position_kind = "none"
    position_why = " (its attention layers have no position encoding)"
    parts = "Mamba-1 layers (Δ, B, C normed with scales) and NoPE GQA layers, SwiGLU or softmax-MoE MLPs"
    features = frozenset({"model.layers.first", "model.layers.pattern"})
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps", "attention_dropout": "attention.dropout"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        d, H = cfg.d_model, cfg.attention.n_head
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.attention.head_dim", (None, d // H), f" ({self.title}'s attention uses d_model / n_head)"),
            ("model.attention.qkv_bias", (False,), " (its attention has no biases)"),
            out_bias(False, " (its attention has no biases)"),
            ("model.mlp.kind", ("swiglu",), " (the model's own MLP is a dense layer's; MoE layers are a kind)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (an attention layer's, the dense MLP), then what the
        layer kinds set that Jamba cannot hold: no Mamba-1 layer, Mamba-1 layers that differ from the first
        one's or from Jamba's mixer, MoE layers that differ from the first one's or from Jamba's MoE, any
        other part that differs from the model's, and layers that no period and offset place."""
        found = super().part_problems(cfg)
        lcs = layer_configs(cfg)
        mamba = next((lc for lc in lcs if is_mamba(lc)), None)
        if mamba is None:
            why = f" ({self.title} is a Mamba-1 hybrid: a layout without Mamba-1 layers is an attention family's)"
            return found + [Problem("model.layers.pattern", list(cfg.layers.pattern), "a kind of mamba", why)]
        a = mamba.attention
        held = ("n_head", "inner", "state_size", "conv_kernel", "conv_bias", "bias", "dt_rank")  # its config's keys
        want_mamba = MambaConfig(**{k: getattr(a, k) for k in held})
        want_mamba.bc_dt_norm, want_mamba.bc_dt_norm_scale, want_mamba.bc_dt_norm_eps = True, True, cfg.norm.eps
        if inner(mamba) % cfg.d_model:
            why = f" (mamba_expand·hidden_size: a multiple of d_model={cfg.d_model})"
            field = kind_field(cfg, layer_kind(cfg, lcs.index(mamba)), "model.attention.inner")
            found.append(Problem(field, a.inner, f"a multiple of {cfg.d_model}", why))
        moe = next((lc for lc in lcs if is_moe(lc)), None)
        want_moe = None
        if moe is not None:
            r = moe.mlp.routing
            fields = dict(kind="moe", expert_d_ff=moe.mlp.expert_d_ff if expert_width(moe) == d_ff(cfg) else None)
            routing = dict(n_experts=r.n_experts, top_k=r.top_k, normalize_top_k=False)
            fields |= dict(routing=dict(routing, aux_loss_weight=r.aux_loss_weight, z_loss_weight=r.z_loss_weight))
            want_moe = MLP_OPTIONS.build(fields, "model.mlp", base=cfg.mlp)
            if r.n_experts < 2:
                field = kind_field(cfg, layer_kind(cfg, lcs.index(moe)), "model.mlp.routing.n_experts")
                why = " (num_experts 1 makes every layer dense)"
                found.append(Problem(field, r.n_experts, "at least 2", why))
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            wanted = [
                ("attention", lc.attention, want_mamba if is_mamba(lc) else cfg.attention, "one mixer of each kind"),
                ("position", lc.position, cfg.position, "no positions"),
                ("mlp", lc.mlp, want_moe if is_moe(lc) else cfg.mlp, "one dense MLP and one MoE"),
            ]
            found.extend(section_problems(cfg, kind, wanted, self.title))
        n = cfg.n_layer
        for what, chosen, default in (
            ("attention", [i for i, lc in enumerate(lcs) if not is_mamba(lc)], ATTN_DEFAULT),
            ("MoE", [i for i, lc in enumerate(lcs) if is_moe(lc)], EXPERT_DEFAULT),
        ):
            if periodic(chosen, n, default) is None:
                why = f" ({self.title} places its {what} layers at i % period == offset)"
                found.append(Problem("model.layers.pattern", list(cfg.layers.pattern), f"{what} layers {chosen}", why))
        return first_per_field(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs, n = layer_configs(cfg), cfg.n_layer
        attention = [i for i, lc in enumerate(lcs) if not is_mamba(lc)]
        experts = [i for i, lc in enumerate(lcs) if is_moe(lc)]
        attn_period, attn_offset = periodic(attention, n, ATTN_DEFAULT) or ATTN_DEFAULT  # checked: never None
        expert_period, expert_offset = periodic(experts, n, EXPERT_DEFAULT) or EXPERT_DEFAULT
        moe = next((lc for lc in lcs if is_moe(lc)), None)
        mamba = next(lc for lc in lcs if is_mamba(lc))
        m = mamba.attention
        routing = (
            dict(
                num_experts=moe.mlp.routing.n_experts,
                num_experts_per_tok=moe.mlp.routing.top_k,
                router_aux_loss_coef=moe.mlp.routing.aux_loss_weight,
            )
            if moe is not None
            else dict(num_experts=1)
        )
        return dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            intermediate_size=d_ff(cfg),
            hidden_act="silu",
            attn_layer_period=attn_period,
            attn_layer_offset=attn_offset,
            expert_layer_period=expert_period,
            expert_layer_offset=expert_offset,
            **routing,
            mamba_d_state=m.state_size,
            mamba_d_conv=m.conv_kernel,
            mamba_expand=inner(mamba) // cfg.d_model,
            mamba_dt_rank=dt_rank(mamba),
            mamba_conv_bias=m.conv_bias,
            mamba_proj_bias=m.bias,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU; its Mamba-1 convolution is SiLU'd too)")
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=AttentionConfig(n_kv_head=c.num_key_value_heads, qkv_bias=False, out_bias=False),
            mlp=mlp_section("swiglu", bias=False, d_ff=c.intermediate_size),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.dropout = float(cfg.attention.dropout)
        names = [
            {(False, False): MAMBA, (False, True): MAMBA_MOE, (True, False): ATTENTION, (True, True): MOE}[
                (t == "attention", e > 1)
            ]
            for t, e in zip(c.layers_block_type, c.layers_num_experts)
        ]
        parts = {MAMBA: {"attention": mamba_kind(c)}, MOE: {"mlp": moe_kind(c)}, ATTENTION: {}}
        parts[MAMBA_MOE] = {**parts[MAMBA], **parts[MOE]}
        first, pattern = shortest_layout(names)
        cfg.layers = LayersConfig(kinds={k: parts[k] for k in dict.fromkeys(names)}, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="pre_ff_layernorm"):
            if is_mamba(lc):
                ours, theirs = f"{b}.attn", f"{h}.mamba"
                t.maps.append(TensorMap(f"{ours}.conv_weight", (f"{theirs}.conv1d.weight",)))
                if lc.attention.conv_bias:
                    t.maps.append(TensorMap(f"{ours}.conv_bias", (f"{theirs}.conv1d.bias",)))
                mixer_tensors(t, lc.attention.bias, ours, theirs)
                for name in ("dt", "b", "c"):
                    t.maps.append(TensorMap(f"{ours}.{name}_norm_weight", (f"{theirs}.{name}_layernorm.weight",)))
            else:
                t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", False)
                t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj")
            ff = f"{h}.feed_forward"
            if is_moe(lc):
                t.add(f"{b}.mlp.router", f"{ff}.router")
                t.maps.append(TensorMap(f"{b}.mlp.experts.gate_up", (f"{ff}.experts.gate_up_proj",)))
                t.maps.append(TensorMap(f"{b}.mlp.experts.down", (f"{ff}.experts.down_proj",)))
            else:
                t.gate_up(f"{b}.mlp.gate_up", ff, False)
                t.add(f"{b}.mlp.down", f"{ff}.down_proj")
        t.add("final_norm", "model.final_layernorm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return stack_saved_experts(cfg, state, mlp="feed_forward")


RECORDS: tuple[Family, ...] = (Jamba(),)
