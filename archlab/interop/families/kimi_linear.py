"""Kimi-Linear (``KimiLinearForCausalLM``): pre-norm RMSNorm layers, each mixing tokens by Kimi Delta
Attention or by DeepSeek's multi-head latent attention without positions as ``layer_types`` says, then
DeepSeek-V3's MoE (sigmoid scores, correction bias, groups, shared experts, routed scale) or a dense SwiGLU
as ``mlp_layer_types`` says.

Its latent attention (``full_attention``) is archlab's ``mla`` with ``model.position.kind=none``: no RoPE
anywhere, the ``qk_rope_head_dim`` key part all heads share left unrotated. Its KDA (``linear_attention``)
is archlab's ``kda``: q, k, v, ``f_a_proj``, ``g_a_proj`` and ``b_proj`` stacked as its in-projection, gate
rank = ``linear_head_dim``; SiLU (``hidden_act``) on the convolution as on the experts. In archlab the model's
own parts are the MLA layers'; each layer is of a kind, ``model.layers``: ``kda`` (the linear sizes),
``attention``, and ``_dense`` beside either for a dense layer, in the shortest ``first`` + ``pattern``. Its
``lm_head`` is never tied to the embeddings (the class ties nothing), whatever ``tie_word_embeddings`` says."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from archlab.config import ModelConfig, PositionConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import LAYERS, Family, Problem, Rule, bare, first_per_field, section_problems
from archlab.interop.families.deepseek import LATENT_EPS, MLA_KEYS, latent_eps_from_hf, latent_eps_rule, mla_tensors
from archlab.interop.families.experts import is_dense, pre_norm_tensors
from archlab.interop.families.mlps import dense_of
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import kind_field, refuse_hf
from archlab.nn.mixers.mla import MLAConfig
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width
from archlab.nn.positions import NoPositionConfig

LINEAR, FULL = "linear_attention", "full_attention"  # transformers' layer_types
KDA, ATTENTION, DENSE = "kda", "attention", "_dense"  # archlab's layer kinds (names)


# what its KDA layers fix: (field, the one value, why)
KDA_RULES = (
    ("gate_rank", None, " (its gate rank is linear_head_dim)"),
    ("decay", "softplus", " (its forget gate is −exp(A_log)·softplus)"),
)


def is_kda(lc: ModelConfig) -> bool:
    return lc.attention.kind == "kda"


def kda_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """q, k, v, f_a, g_a and b projections stacked as kda's in_proj; conv1d, the forget gate's f_b, A_log
    ([1, 1, H, 1] there) and dt_bias, g_b, the gated norm, o_proj."""
    a = lc.attention
    W = a.n_head * a.head_dim
    rows = ["q_proj", "k_proj", "v_proj", "forget_gate.f_a_proj", "g_a_proj", "b_proj"]
    t.stacked(f"{archlab}.in_proj", [f"{hf}.{r}" for r in rows], False, (W, W, W, a.head_dim, a.head_dim, a.n_head))
    t.maps.append(TensorMap(f"{archlab}.conv_weight", (f"{hf}.conv1d.weight",), "depthwise_conv"))
    t.add(f"{archlab}.f_b", f"{hf}.forget_gate.f_b_proj")
    t.maps.append(TensorMap(f"{archlab}.A_log", (f"{hf}.forget_gate.A_log",), "flat", (1, 1, a.n_head, 1)))
    t.maps.append(TensorMap(f"{archlab}.dt_bias", (f"{hf}.forget_gate.dt_bias",)))
    t.add(f"{archlab}.g_b", f"{hf}.g_b_proj")
    t.maps.append(TensorMap(f"{archlab}.norm_weight", (f"{hf}.o_norm.weight",)))
    t.add(f"{archlab}.proj", f"{hf}.o_proj")


class KimiLinear(_Sparse):
    """KimiLinearForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = (
        "kimi_linear",
        "Kimi-Linear",
        "KimiLinearForCausalLM",
        "KimiLinearConfig",
    )
    parts = "KDA and MLA (no positions) layers, DeepSeek-V3's MoE (sigmoid, correction bias, groups, shared experts), dense layers by a kind"
    attention_kind = "mla"
    mixer_kinds = ("kda",)
    position_kind = "none"
    position_why = " (no layer of it takes positions)"
    features = frozenset({LATENT_EPS}) | LAYERS
    shared_experts = True
    keys = {**{k: v for k, v in _Sparse.keys.items() if k != "tie_word_embeddings"}, **MLA_KEYS}
    kda_rules: tuple[tuple[str, Any, str], ...] = KDA_RULES  # what its KDA layers fix
    layer_positions = "no positions in any layer"  # why every layer's position section is the model's

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [latent_eps_rule(cfg)]

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.head.tied", (False,), " (its lm_head is never tied, whatever tie_word_embeddings says)"),
            ("model.mlp.expert", ("swiglu",), " (hidden_act, silu, is also its KDA convolution's)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``_Sparse``'s of the model's own parts (not its dense-first check: its dense layers go anywhere),
        then what its layer kinds set that Kimi-Linear cannot hold, each named as the kind sets it: a KDA
        layer off ``KDA_RULES`` or whose sizes differ from the first one's, an MLA layer whose
        attention differs from the model's, a dense layer other than the experts' kind of d_ff, a MoE layer
        whose MLP differs from the model's."""
        found = super(_Sparse, self).part_problems(cfg)
        if cfg.mlp.kind == "moe" and cfg.mlp.n_shared_experts < 1:
            why = " (its MoE layers always have shared experts)"
            found.append(Problem("model.mlp.n_shared_experts", cfg.mlp.n_shared_experts, "at least 1", why))
        lcs = layer_configs(cfg)
        linear = next((lc.attention for lc in lcs if is_kda(lc)), None)
        layered: list[Problem] = []
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            for name, allowed, why in self.kda_rules if is_kda(lc) else ():
                if getattr(lc.attention, name) != allowed:
                    field = kind_field(cfg, kind, f"model.attention.{name}")
                    layered.append(Problem(field, getattr(lc.attention, name), bare(allowed), why, (allowed,)))
            wanted: list[tuple[str, Any, Any, str]] = [
                ("position", lc.position, cfg.position, self.layer_positions),
                ("attention", lc.attention, linear, "one set of KDA sizes for every such layer")
                if is_kda(lc)
                else ("attention", lc.attention, cfg.attention, "one attention for every MLA layer"),
                ("mlp", lc.mlp, dense_of(cfg.mlp), "dense layers of its experts' kind and d_ff")
                if is_dense(lc)
                else ("mlp", lc.mlp, cfg.mlp, "one MoE for every MoE layer"),
            ]
            layered.extend(section_problems(cfg, kind, wanted, self.title))
        return found + first_per_field(layered)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs, m = layer_configs(cfg), cfg.mlp
        linear = next((lc.attention for lc in lcs if is_kda(lc)), None)
        out = dict(
            self.keys_to_hf(cfg),
            hidden_act="silu",
            tie_word_embeddings=False,
            num_key_value_heads=cfg.attention.n_head,
            attention_bias=False,
            attention_dropout=cfg.attention.dropout,
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            num_experts=m.routing.n_experts,
            num_experts_per_tok=m.routing.top_k,
            num_shared_experts=m.n_shared_experts,
            routed_scaling_factor=m.routing.routed_scale,
            norm_topk_prob=m.routing.normalize_top_k,
            n_group=m.routing.n_groups,
            topk_group=m.routing.top_groups,
            layer_types=[LINEAR if is_kda(lc) else FULL for lc in lcs],
            mlp_layer_types=["dense" if is_dense(lc) else "sparse" for lc in lcs],
        )
        if linear is not None:
            keys = ("linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim")
            out |= dict(zip(keys, (linear.n_head, linear.head_dim, linear.conv_kernel), strict=True))
        return out

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU experts; its KDA convolution is SiLU'd)")
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's mla projections have no biases)")
        if c.num_key_value_heads not in (None, c.num_attention_heads):
            refuse_hf(
                c, "num_key_value_heads", f"num_attention_heads={c.num_attention_heads} (every head reads the latent)"
            )
        if not c.num_shared_experts:
            refuse_hf(c, "n_shared_experts", "at least 1 (transformers builds its shared MLP whatever its width)")
        types, mlps = list(c.layer_types), list(c.mlp_layer_types)  # one per layer, as the config checks
        if set(types) - {LINEAR, FULL}:
            refuse_hf(c, "layer_types", f"'{LINEAR}' or '{FULL}' in each entry", types)
        mlp = self.moe_from_hf(
            c,
            c.num_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.num_shared_experts,
            routed_scale=float(c.routed_scaling_factor),
            **self.v3_routing(c),
        )
        cfg = self.base_from_hf(c, self.position_from_hf(c), self.mla_from_hf(c), mlp)
        cfg.head.tied = False
        names = [(KDA if t == LINEAR else ATTENTION) + (DENSE if d == "dense" else "") for t, d in zip(types, mlps)]
        if set(names) != {ATTENTION}:
            linear = self.kda_from_hf(c)
            kinds: dict[str, dict[str, Any]] = {}
            for name in dict.fromkeys(names):
                kinds[name] = {"attention": dict(linear)} if name.startswith(KDA) else {}
                if name.endswith(DENSE):
                    kinds[name]["mlp"] = {"kind": "swiglu"}
            first, pattern = shortest_layout(names)
            cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def position_from_hf(self, c: Any) -> PositionConfig:
        """``model.position``: none (its MLA layers take no positions)."""
        return NoPositionConfig()

    def mla_from_hf(self, c: Any) -> MLAConfig:
        """The MLA layers' attention, ``model.attention``."""
        return MLAConfig(dropout=float(c.attention_dropout), latent_norm_eps=latent_eps_from_hf(c))

    def kda_from_hf(self, c: Any) -> dict[str, Any]:
        """The KDA layers' ``attention`` section."""
        return dict(
            kind="kda", n_head=c.linear_num_heads, head_dim=c.linear_head_dim, conv_kernel=c.linear_conv_kernel_dim
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, layer_attention_tensors)

    # as saved (transformers' conversion mapping, the Hub's checkpoints): the MLPs under block_sparse_moe, each
    # expert's w1 (gate), w3 (up), w2 (down) apart, the forget gate's tensors on the attention itself
    expert_matrices = ("w1", "w3", "w2")
    checkpoint_renames = {
        ".block_sparse_moe.": ".mlp.",
        **{f"self_attn.{n}": f"self_attn.forget_gate.{n}" for n in ("f_a_proj.", "f_b_proj.", "dt_bias", "A_log")},
    }

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """``_Sparse``'s renames and stacked experts, and each KDA layer's q_conv1d, k_conv1d and v_conv1d
        (saved apart) joined as its conv1d."""
        state = super().from_checkpoint(cfg, state)
        for i in range(cfg.n_layer):
            h = f"model.layers.{i}.self_attn"
            parts = [f"{h}.{x}_conv1d.weight" for x in "qkv"]
            if all(p in state for p in parts):
                state[f"{h}.conv1d.weight"] = torch.cat([state.pop(p) for p in parts])
        return state


def layer_attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's mixer: KDA's (``kda_tensors``) or the latent attention's (``mla_tensors``)."""
    if is_kda(lc):
        kda_tensors(t, lc, archlab, hf)
    else:
        mla_tensors(t, archlab, hf)


RECORDS: tuple[Family, ...] = (KimiLinear(),)
