"""The mixture-of-experts parts many records share: a MoE model's dense first layers (its layer kinds, what
a record cannot hold of them, the config keys DeepSeek-V3's names them by) and the expert tensors. Routed
experts are stacked in both libraries (transformers 5's ``gate_up_proj`` [E, 2f, d], gate rows first, and
``down_proj`` [E, d, f]), so they map tensor for tensor; checkpoints save each expert apart
(``stack_saved_experts`` stacks them on loading); shared experts are one gated MLP of n_shared·f."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from archlab.config import (
    ModelConfig,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig
from archlab.interop.families.base import Problem, bare, first_per_field
from archlab.interop.families.mlps import (
    dense_of,
)
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


def is_dense(lc: ModelConfig) -> bool:
    """Whether a layer (of config ``lc``, one of ``layer_configs``) holds a dense MLP: a layer kind of a
    MoE model that sets ``mlp.kind`` to a dense kind (DeepSeek's first layers)."""
    return lc.mlp.kind != "moe"


def dense_first(layers: list[ModelConfig]) -> int:
    """How many of the first layers hold a dense MLP (before the first MoE layer)."""
    return next((i for i, lc in enumerate(layers) if not is_dense(lc)), len(layers))


def with_dense_first(cfg: ModelConfig, n: int) -> ModelConfig:
    """``cfg`` (a MoE model) with its first ``n`` layers of kind ``dense``: one MLP of the experts' kind and
    the model's d_ff (transformers' ``first_k_dense_replace``, ``mlp_only_layers``, ``num_dense_layers``)."""
    if n:
        cfg.layers = LayersConfig(kinds={"dense": {"mlp": {"kind": cfg.mlp.expert}}}, first=["dense"] * n)
    return cfg


def grouped_moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The keys DeepSeek-V3's config names its MoE by, which dots.llm1 shares: the widths, the routed and shared
    experts, the dense first layers, the routing's scale, renormalisation and groups."""
    m = cfg.mlp
    return dict(
        intermediate_size=d_ff(cfg),
        moe_intermediate_size=expert_width(cfg),
        n_routed_experts=m.routing.n_experts,
        num_experts_per_tok=m.routing.top_k,
        n_shared_experts=m.n_shared_experts,
        first_k_dense_replace=dense_first(layer_configs(cfg)),
        routed_scaling_factor=m.routing.routed_scale,
        norm_topk_prob=m.routing.normalize_top_k,
        n_group=m.routing.n_groups,
        topk_group=m.routing.top_groups,
    )


def dense_first_problems(cfg: ModelConfig, title: str) -> list[Problem]:
    """What a family whose first layers may be dense (and the others the model's MoE) cannot hold of the
    layer kinds: a dense layer after a MoE one, a dense MLP of another kind than the experts', and any
    other field a layer's kind sets away from the model's (named as the kind's field)."""
    found: list[Problem] = []
    lcs = layer_configs(cfg)
    n_dense = dense_first(lcs)
    for i, lc in enumerate(lcs):
        kind = layer_kind(cfg, i)
        if kind is None:
            continue
        if is_dense(lc):
            mlp = dense_of(cfg.mlp)
            if i >= n_dense:
                why = f" ({title}'s dense layers are its first ones, before every MoE layer)"
                found.append(Problem(kind_field(cfg, kind, "model.mlp.kind"), lc.mlp.kind, "moe", why))
        else:
            mlp = cfg.mlp
        for section, want in (("attention", cfg.attention), ("position", cfg.position), ("mlp", mlp)):
            for name, value, wanted in differences(getattr(lc, section), want):
                why = (
                    f" ({title}'s dense layers are of its experts' kind)"
                    if name == "kind" and section == "mlp"
                    else f" ({title} holds one value for every layer but the dense layers' MLP kind)"
                )
                field = kind_field(cfg, kind, f"model.{section}.{name}")
                found.append(Problem(field, value, bare(wanted), why, (wanted,)))
    return first_per_field(found)


def dense_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A dense layer's gated MLP (of config ``lc``, width d_ff) in a MoE model: gate_proj, up_proj, down_proj."""
    f = d_ff(lc)
    t.stacked(f"{archlab}.gate_up", [f"{hf}.gate_proj", f"{hf}.up_proj"], False, (f, f))
    t.add(f"{archlab}.down", f"{hf}.down_proj")


def mlp_tensors(
    t: Tensors,
    lc: ModelConfig,
    archlab: str,
    hf: str,
    router: str = "gate",
    router_bias: str = "gate.e_score_correction_bias",
) -> None:
    """The MLP of one layer (of config ``lc``) of a MoE model, laid out alike in both libraries: a dense
    layer's gate_proj, up_proj, down_proj (width d_ff); else the router ``<hf>.<router>``, its correction
    bias ``<hf>.<router_bias>``, the stacked routed experts and the shared experts as one gated MLP."""
    if is_dense(lc):
        dense_tensors(t, lc, archlab, hf)
        return
    m = lc.mlp
    t.add(f"{archlab}.router", f"{hf}.{router}")
    if m.routing.correction_bias:
        t.maps.append(TensorMap(f"{archlab}.router_bias", (f"{hf}.{router_bias}",)))
    t.maps.append(TensorMap(f"{archlab}.experts.gate_up", (f"{hf}.experts.gate_up_proj",)))
    t.maps.append(TensorMap(f"{archlab}.experts.down", (f"{hf}.experts.down_proj",)))
    if m.n_shared_experts:
        f, shared = m.n_shared_experts * expert_width(lc), f"{hf}.shared_experts"
        t.stacked(f"{archlab}.shared.gate_up", [f"{shared}.gate_proj", f"{shared}.up_proj"], False, (f, f))
        t.add(f"{archlab}.shared.down", f"{shared}.down_proj")


LayerTensors = Callable[[Tensors, ModelConfig, str, str], None]  # (t, the layer's config, archlab, hf)


def pre_norm_tensors(
    cfg: ModelConfig, attention: LayerTensors, mlp: LayerTensors | None = None, mlp_name: str = "mlp"
) -> list[TensorMap]:
    """LLaMA's names of a pre-norm MoE model: the embedding; each layer's input and post-attention norms,
    its attention (``attention(t, lc, "blocks.i.attn", "model.layers.i.self_attn")``, ``lc`` the layer's
    config) and its MLP (``mlp``, by default ``mlp_tensors``, at ``model.layers.i.<mlp_name>``); the final
    norm and the head."""
    mlp = mlp_tensors if mlp is None else mlp
    t = Tensors(cfg)
    t.add("tok_emb", "model.embed_tokens")
    for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
        attention(t, lc, f"{b}.attn", f"{h}.self_attn")
        mlp(t, lc, f"{b}.mlp", f"{h}.{mlp_name}")
    t.add("final_norm", "model.norm")
    return t.head()


def unstack_experts(
    state: dict[str, Tensor], matrices: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
) -> dict[str, Tensor]:
    """``stack_saved_experts`` undone: each stacked ``<...>.experts.gate_up_proj`` [E, 2f, d] and
    ``down_proj`` [E, d, f] as the checkpoint's one tensor per expert and matrix (what ``save_pretrained``
    writes of the model's own layers), for tensors written beside it."""
    gate, up, down = matrices
    out = {}
    for name, t in state.items():
        if name.endswith(".experts.gate_up_proj"):
            h, f = name.removesuffix(".gate_up_proj"), t.shape[1] // 2
            out.update({f"{h}.{e}.{gate}.weight": t[e, :f] for e in range(t.shape[0])})
            out.update({f"{h}.{e}.{up}.weight": t[e, f:] for e in range(t.shape[0])})
        elif name.endswith(".experts.down_proj"):
            h = name.removesuffix(".down_proj")
            out.update({f"{h}.{e}.{down}.weight": t[e] for e in range(t.shape[0])})
        else:
            out[name] = t
    return out


def stack_saved_experts(
    cfg: ModelConfig,
    state: dict[str, Tensor],
    matrices: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    mlp: str = "mlp",
) -> dict[str, Tensor]:
    """A checkpoint's per-expert matrices ``model.layers.i.<mlp>.experts.e.<gate | up | down>.weight`` of
    each MoE layer (not a dense one) stacked as transformers 5 holds them in memory: ``gate_up_proj``
    [E, 2f, d] (the gate rows, then the up rows) and ``down_proj`` [E, d, f]; a layer missing any expert is
    left for the caller to name."""
    gate, up, down = matrices
    for i, lc in enumerate(layer_configs(cfg)):
        if is_dense(lc):
            continue
        h = f"model.layers.{i}.{mlp}.experts"
        names = [[f"{h}.{e}.{m}.weight" for e in range(lc.mlp.routing.n_experts)] for m in (gate, up, down)]
        if all(n in state for ns in names for n in ns):
            gates, ups, downs = ([state.pop(n) for n in ns] for ns in names)
            state[f"{h}.gate_up_proj"] = torch.cat((torch.stack(gates), torch.stack(ups)), dim=1)
            state[f"{h}.down_proj"] = torch.stack(downs)
    return state
