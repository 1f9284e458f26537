"""MiniMax-01 (``MiniMaxForCausalLM``, MiniMax-Text-01): Mixtral's attention and softmax top-k MoE, with
lightning-attention layers where ``layer_types`` says ``linear_attention`` (archlab's ``lightning``: its
``qkv_proj``, ``output_gate``, ``norm`` and ``out_proj`` as they are; the slope and decay buffers transformers
computes from the layer index are not held, archlab computes them, and checks a checkpoint's saved slopes), and
MiniMax's wiring (``normed_skip``: the skip after the norm, ``*_alpha_factor`` times it plus ``*_beta_factor``
times the sublayer's output).

In archlab the model's own attention is the full-attention layers'; each layer is of a kind, ``lightning`` (the
lightning attention with the model's heads) or ``attention`` (the model's own), the first layers in ``first``
and the rest in a cycled ``pattern``, the shortest pair that gives every layer its kind. One pair of attention
multipliers serves both layer types: a config whose full and linear layers' factors differ is refused naming
the linear layers' key."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from archlab.config import BlockConfig, ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import LAYERS, Family, Problem, Rule, bare, out_bias
from archlab.interop.families.softmax_moe import _Softmax, replaced
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, differences, kind_field, refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.lightning import LightningConfig, slopes
from archlab.nn.moe import expert_width

LINEAR, FULL = "linear_attention", "full_attention"  # transformers' layer_types
LIGHTNING, ATTENTION = "lightning", "attention"  # archlab's layer kinds (names)
NORM_EPS = LightningConfig.norm_eps  # MiniMaxRMSNorm's default, which its lightning layers' norm keeps


def is_lightning(lc: ModelConfig) -> bool:
    return lc.attention.kind == "lightning"


class MiniMaxText(_Softmax):
    """MiniMaxForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "minimax", "MiniMax", "MiniMaxForCausalLM", "MiniMaxConfig"
    parts = (
        "Mixtral's attention and lightning attention layers by layer_types, a softmax top-k MoE, the skip after "
        "the norm scaled (normed_skip)"
    )
    mixer_kinds = ("lightning",)
    features = _Softmax.features | LAYERS
    expert_matrices = ("w1", "w3", "w2")
    checkpoint_renames = {".block_sparse_moe.": ".mlp."}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return replaced(
            super().rules(cfg),
            ("model.block.kind", ("normed_skip",), " (its residual stream is carried after each norm)"),
            ("model.mlp.expert", ("swiglu",), " (hidden_act, silu, is also its lightning layers' q, k, v's)"),
        ) + [
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.mlp.routing.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The model's own parts (``Family``'s, then full rotary), then what its layer kinds set that MiniMax
        cannot hold (``layer_problems``); not ``_Sparse``'s dense first layers: MiniMax has none."""
        found = Family.part_problems(self, cfg) + [p for check in self.checks for p in check(cfg)]
        return found + self.layer_problems(cfg)

    def layer_problems(self, cfg: ModelConfig) -> list[Problem]:
        """Each a field as the layer's kind sets it: a lightning layer whose heads differ from the model's, whose
        norm eps is not MiniMax's 1e-6 or whose block size differs from the first lightning layer's; an
        attention layer whose attention or RoPE differs from the model's; a layer whose MLP differs."""
        lcs = layer_configs(cfg)
        first = next((lc.attention for lc in lcs if is_lightning(lc)), None)
        found: dict[str, Problem] = {}

        def add(kind: str, name: str, value: Any, wanted: Any, why: str) -> None:
            field = kind_field(cfg, kind, name)
            found.setdefault(field, Problem(field, value, bare(wanted), f" ({self.title} has {why})", (wanted,)))

        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            sections: list[tuple[str, Any, Any]] = [("mlp", lc.mlp, cfg.mlp)]
            if is_lightning(lc):
                a, block_size = lc.attention, getattr(first, "block_size", None)
                if a.n_head != cfg.attention.n_head:
                    add(kind, "model.attention.n_head", a.n_head, cfg.attention.n_head, "one n_head for both types")
                if head_dim(lc) != head_dim(cfg):
                    add(kind, "model.attention.head_dim", head_dim(lc), head_dim(cfg), "one head_dim for both types")
                if a.norm_eps != NORM_EPS:
                    add(kind, "model.attention.norm_eps", a.norm_eps, NORM_EPS, "MiniMaxRMSNorm's default eps there")
                if a.block_size != block_size:
                    add(kind, "model.attention.block_size", a.block_size, block_size, "one block_size")
            else:
                sections += [("attention", lc.attention, cfg.attention), ("position", lc.position, cfg.position)]
            for section, have, want in sections:
                for name, value, expected in differences(have, want):
                    add(kind, f"model.{section}.{name}", value, expected, f"one {section} for every layer of a type")
        return list(found.values())

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs, hd, b = layer_configs(cfg), head_dim(cfg), cfg.block
        linear = next((lc.attention for lc in lcs if is_lightning(lc)), None)
        return dict(
            super().to_hf(cfg),
            head_dim=None if hd == cfg.d_model // cfg.attention.n_head else hd,  # as published: null when implied
            num_local_experts=cfg.mlp.routing.n_experts,
            intermediate_size=expert_width(cfg),
            layer_types=[LINEAR if is_lightning(lc) else FULL for lc in lcs],
            block_size=LightningConfig.block_size if linear is None else linear.block_size,
            full_attn_alpha_factor=b.attn_alpha,
            full_attn_beta_factor=b.attn_beta,
            linear_attn_alpha_factor=b.attn_alpha,
            linear_attn_beta_factor=b.attn_beta,
            mlp_alpha_factor=b.mlp_alpha,
            mlp_beta_factor=b.mlp_beta,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.router_jitter_noise:
            refuse_hf(c, "router_jitter_noise", "0.0 (archlab's router has no input jitter)")
        types = list(c.layer_types)
        if len(types) != c.num_hidden_layers or set(types) - {LINEAR, FULL}:
            refuse_hf(c, "layer_types", f"num_hidden_layers entries, each '{LINEAR}' or '{FULL}'", types)
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU experts and lightning attention's q, k, v)")
        kind = "full" if FULL in types else "linear"
        alpha, beta = (float(getattr(c, f"{kind}_attn_{x}_factor")) for x in ("alpha", "beta"))
        for x, value in (("alpha", alpha), ("beta", beta)):
            if FULL in types and LINEAR in types and float(getattr(c, f"linear_attn_{x}_factor")) != value:
                why = f"{value!r}, full_attn_{x}_factor (archlab's block has one pair of attention multipliers)"
                refuse_hf(c, f"linear_attn_{x}_factor", why)
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        cfg = self.causal_from_hf(c, mlp)
        cfg.block = BlockConfig(
            kind="normed_skip",
            attn_alpha=alpha,
            attn_beta=beta,
            mlp_alpha=float(c.mlp_alpha_factor),
            mlp_beta=float(c.mlp_beta_factor),
        )
        names = [LIGHTNING if t == LINEAR else ATTENTION for t in types]
        if LIGHTNING in names:
            lightning = dict(kind="lightning", head_dim=config_head_dim(c), block_size=c.block_size)
            kinds: dict[str, dict[str, Any]] = {
                n: {"attention": dict(lightning)} if n == LIGHTNING else {} for n in names
            }
            first, pattern = shortest_layout(names)
            cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
            if is_lightning(lc):
                for name in ("qkv_proj", "output_gate"):
                    t.add(f"{b}.attn.{name}", f"{h}.self_attn.{name}")
                t.maps.append(TensorMap(f"{b}.attn.norm_weight", (f"{h}.self_attn.norm.weight",)))
                t.add(f"{b}.attn.proj", f"{h}.self_attn.out_proj")
            else:
                self.attention_tensors(t, f"{b}.attn", f"{h}.self_attn")
            self.mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The lightning layers' saved slopes (``self_attn.slope_rate``, which transformers loads and decays by)
        checked against those archlab computes from the layer index, a differing one refused naming it; then
        the experts stacked as Mixtral's."""
        for i, lc in enumerate(layer_configs(cfg)):
            name = f"model.layers.{i}.self_attn.slope_rate"
            if is_lightning(lc) and name in state:
                want = slopes(lc.attention.n_head, i, cfg.n_layer, torch.float64)
                have = state[name].double().flatten()
                if have.shape != want.shape or not torch.allclose(have, want, rtol=1e-5, atol=0.0):
                    raise ValueError(
                        f"{name} is {have.tolist()}, not the slopes archlab computes for layer {i} of "
                        f"{cfg.n_layer} ({want.tolist()}): archlab holds MiniMax's slopes only"
                    )
        return super().from_checkpoint(cfg, state)


RECORDS: tuple[Family, ...] = (MiniMaxText(),)
