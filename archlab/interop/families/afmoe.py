"""AFMoE (``AfmoeForCausalLM``): sliding and full layers, gated attention, dense first layers and sigmoid-routed experts (helpers in ``layered_moe``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import (
    BlockConfig,
    ModelConfig,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import dense_first, is_dense, mlp_tensors, stack_saved_experts
from archlab.interop.families.layered_moe import (
    _LayeredSparse,
    _unique,
    apply_layout,
    one_window,
)
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section, shared_experts
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, sliding_to_hf
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

POSITION_WHY = " (or none on its full layers)"  # why a layer's position kind is refused
VARIES = frozenset({"model.attention.window", "model.position.kind", "model.mlp.kind"})  # what may differ by layer


def shared_rules(cfg: ModelConfig) -> list[Rule]:
    """The shared experts its MoE layers always have."""
    if shared_experts(cfg.mlp) < 1:
        return [("model.mlp.n_shared_experts", ("at least 1",), " (its MoE layers always have shared experts)")]
    return []


def global_nope_problems(family: _LayeredSparse, found: list[Problem], cfg: ModelConfig) -> list[Problem]:
    """``found`` (``_LayeredSparse.part_problems``) of a family whose full layers have no positions: the base
    rule on model.position.kind wants rope, so a full layer's none is held too, and ``layout_problems``
    (again: the base rule's problem of a kind hid its own) says which layer needs which."""
    kept = [p for p in found if not (p.value == "none" and p.why == family.position_why)]
    return _unique(kept + family.layout_problems(cfg, layer_configs(cfg)))


def global_nope_layout(cfg: ModelConfig, types: list[str], dense: list[bool], window: int | None) -> ModelConfig:
    """``cfg`` with a layer kind per layer: ``sliding`` (``window``, RoPE) or ``full`` (no positions) as
    ``types`` says, each ``_dense`` where ``dense`` says (a gated MLP of the experts' kind)."""
    names = [("sliding" if t == SLIDING else "full") + "_dense" * d for t, d in zip(types, dense)]
    overrides: dict[str, dict[str, dict[str, Any]]] = {
        "sliding": {"attention": {"window": window}},
        "full": {"position": {"kind": "none"}},
    }
    for name in list(overrides):
        overrides[f"{name}_dense"] = {**overrides[name], "mlp": {"kind": cfg.mlp.expert}}
    return apply_layout(cfg, names, overrides)


class Afmoe(_LayeredSparse):
    """AfmoeForCausalLM: a norm before and after each sublayer (``input_layernorm``,
    ``post_attention_layernorm``, ``pre_mlp_layernorm``, ``post_mlp_layernorm``: archlab's sandwich block),
    q/k/v and o without biases, a per-head RMSNorm on q and k (before RoPE), an output gate
    σ(``gate_proj``·x) per value dim on the heads before ``o_proj`` (archlab's ``gate: elementwise``,
    without a bias), sliding-window attention with RoPE on the ``sliding_attention`` layers and full
    attention without positions on the others; the embeddings times √``hidden_size`` when
    ``mup_enabled``. The first ``num_dense_layers`` layers hold a dense gated MLP of
    ``intermediate_size`` (kinds ``*_dense``, setting ``mlp.kind`` to the experts'), the others a MoE: sigmoid scores, the top-k of the scores plus ``expert_bias``
    (selection only: archlab's ``correction_bias``), the chosen scores over their sum + 1e-20, times
    ``route_scale``, beside ``num_shared_experts`` shared experts as one MLP of n·``moe_intermediate_size``.
    Kinds: ``sliding`` (window, RoPE), ``full`` (no positions), each with ``_dense`` on the dense layers."""

    parts = "sandwich block, gated attention, local/global layers, sigmoid MoE, dense first layers"

    model_type, title, model_class, config_class = "afmoe", "AFMoE", "AfmoeForCausalLM", "AfmoeConfig"
    features = frozenset(
        {
            "model.scale_embedding",
            "model.position.scaling.kind",
            "model.attention.qk_norm",
            "model.attention.window",
            "model.attention.gate",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    position_why = POSITION_WHY
    block_kind = "sandwich"
    varies = VARIES

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return global_nope_problems(self, super().part_problems(cfg), cfg)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        no_gate_bias = " (its gate_proj has no bias, and archlab's gate takes one with qkv_bias)"
        attention: list[Rule] = [
            ("model.attention.qk_norm", ("head",), " (it norms each head of q and k)"),
            ("model.attention.gate", ("elementwise",), " (its gate_proj gates every value dim)"),
            ("model.attention.qkv_bias", (False,), no_gate_bias),
        ]
        if is_dense(cfg):  # a dense layer: the experts' kind, no biases
            return attention  # its experts' kind: _LayeredSparse.part_problems, which has the model's
        return [
            *attention,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its MoE layers always have expert_bias)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (it always divides the chosen scores by their sum)"),
            ungrouped(" (it routes without groups)"),
            *shared_rules(cfg),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        found = one_window(layers)
        n_dense = dense_first(layers)
        for i, lc in enumerate(layers):
            if i >= n_dense and is_dense(lc):
                why = " (AFMoE's dense layers are its first ones: num_dense_layers)"
                found.append(Problem(kind_field(cfg, layer_kind(cfg, i), "model.mlp.kind"), lc.mlp.kind, "moe", why))
            sliding, kind = lc.attention.window is not None, lc.position.kind
            if kind in ("rope", "none") and (kind == "rope") != sliding:
                field = kind_field(cfg, layer_kind(cfg, i), "model.position.kind")
                wants, why = (
                    ("rope", "its sliding layers") if sliding else ("none", "its full layers have no positions")
                )
                found.append(Problem(field, kind, wants, f" (AFMoE rotates exactly {why})" if sliding else f" ({why})"))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        rope_cfg = next((lc for lc in layers if lc.position.kind == "rope"), cfg)
        base = self.base_to_hf(cfg)
        for key in ("num_local_experts", "router_aux_loss_coef"):  # AFMoE names the count num_experts, has no aux
            del base[key]
        return dict(
            base,
            hidden_act=GATED_TO_HF[activation(m)],
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            num_dense_layers=dense_first(layers),
            num_experts=m.routing.n_experts,
            num_shared_experts=m.n_shared_experts,
            route_scale=m.routing.routed_scale,
            mup_enabled=cfg.scale_embedding,
            rope_parameters=rope_to_hf(rope_cfg),
            **sliding_to_hf(cfg, layers),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.attention_bias:
            refuse_hf(
                c, "attention_bias", "false (archlab's output gate takes a bias with q/k/v; AFMoE's gate_proj has none)"
            )
        expert, approximate = gated_activation(c)
        if not c.num_shared_experts:
            refuse_hf(
                c, "num_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        n = c.num_hidden_layers
        types = checked_types(c)
        hd = config_head_dim(c)
        mlp = mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=c.moe_intermediate_size,
            n_shared_experts=c.num_shared_experts,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                scoring="sigmoid",
                normalize_top_k=True,
                correction_bias=True,
                routed_scale=float(c.route_scale),
            ),
        )
        cfg = self.base_from_hf(c, rope_from_hf(c, hd, partial=False), mlp)
        cfg.block = BlockConfig(kind="sandwich")
        cfg.scale_embedding = bool(c.mup_enabled)
        cfg.attention.qk_norm, cfg.attention.gate = "head", "elementwise"
        n_dense = min(c.num_dense_layers or 0, n)
        return global_nope_layout(cfg, types, [i < n_dense for i in range(n)], c.sliding_window)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            for archlab, hf in (
                ("attn_norm", "input_layernorm"),
                ("attn_out_norm", "post_attention_layernorm"),
                ("mlp_norm", "pre_mlp_layernorm"),
                ("mlp_out_norm", "post_mlp_layernorm"),
            ):
                t.add(f"{b}.{archlab}", f"{h}.{hf}")
            a = f"{h}.self_attn"
            t.qkv(f"{b}.attn.qkv", a, False)
            t.add(f"{b}.attn.proj", f"{a}.o_proj")
            t.add(f"{b}.attn.gate", f"{a}.gate_proj")
            t.add(f"{b}.attn.q_norm", f"{a}.q_norm")
            t.add(f"{b}.attn.k_norm", f"{a}.k_norm")
            mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp", "router.gate", "expert_bias")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers saves each routed expert apart (its qwen2_moe conversion): stacked as it loads them."""
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (Afmoe(),)
