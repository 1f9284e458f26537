"""Kolibri-1 (``Kolibri1ForCausalLM``): EXAONE 4's attention (per-head QK-norm, local RoPE / global NoPE layers)
in GLM-4's sandwich blocks, a sigmoid MoE on every layer whose correction bias is added to the router's
logits before the sigmoid (``model.mlp.routing.correction_on: logits``), beside one shared expert."""

from __future__ import annotations

from typing import Any

from archlab.config import BlockConfig, ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import is_dense, mlp_tensors
from archlab.interop.families.global_nope_moe import _GlobalNope
from archlab.interop.families.layered import view
from archlab.interop.families.layered_moe import _unique
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import kind_field, refuse_hf
from archlab.nn.moe import expert_width

SANDWICH = (  # archlab's sandwich norms, GLM-4's names
    ("attn_norm", "input_layernorm"),
    ("attn_out_norm", "post_self_attn_layernorm"),
    ("mlp_norm", "post_attention_layernorm"),
    ("mlp_out_norm", "post_mlp_layernorm"),
)


class Kolibri1(_GlobalNope):
    """Kolibri1ForCausalLM: a norm before and after each sublayer (archlab's sandwich block), q/k/v and o
    without biases, q and k RMSNormed per head before RoPE, sliding-window attention with RoPE on the
    ``sliding_attention`` layers (``layer_types``) and full attention without positions on the others; a
    MoE on every layer: the top-k of the float32 router logits plus ``e_score_correction_bias``
    (``correction_on: logits``), weighted by the chosen logits' sigmoids (over their sum with
    ``norm_topk_prob``), beside a shared SwiGLU of ``shared_expert_intermediate_size`` (archlab's
    shared experts: that width over ``moe_intermediate_size``)."""

    parts = "sandwich block, EXAONE 4's attention, local RoPE / global NoPE layers, sigmoid MoE corrected on its logits"

    model_type, title, model_class, config_class = "kolibri1", "Kolibri-1", "Kolibri1ForCausalLM", "Kolibri1Config"
    block_kind = "sandwich"
    features = _GlobalNope.features | {"model.mlp.routing.correction_on"}
    checkpoint_renames = (  # its checkpoints' names, as transformers' conversion mapping renames them on loading
        (r"\.moe\.router\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
        (r"\.post_attn_norm\.", ".post_self_attn_layernorm."),
        (r"\.post_ffn_norm\.", ".post_mlp_layernorm."),
    )

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [("model.attention.qkv_bias", (False,), " (Kolibri-1 has no attention biases)")]

    def routing_rules(self, cfg: ModelConfig) -> list[Rule]:
        always = " (its router always adds e_score_correction_bias to the logits)"
        return [
            ("model.mlp.routing.correction_bias", (True,), always),
            ("model.mlp.routing.correction_on", ("logits",), always),
            ("model.mlp.routing.routed_scale", (1.0,), " (Kolibri-1 does not scale the routed experts)"),
            ungrouped(" (it routes without groups)"),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """EXAONE 4's rule of windows and RoPE (``_GlobalNope``), and a MoE on every layer."""
        found = super().layout_problems(cfg, layers)
        for i, lc in enumerate(layers):
            if is_dense(lc):
                field = kind_field(cfg, layer_kind(cfg, i), "model.mlp.kind")
                found.append(Problem(field, lc.mlp.kind, "moe", " (every Kolibri-1 layer is a MoE)"))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = self.layers_to_hf(cfg)
        for key in ("attention_bias", "router_aux_loss_coef", "intermediate_size"):  # Kolibri1Config has none
            del kwargs[key]
        moe = next(lc for lc in layer_configs(cfg) if not is_dense(lc))
        return dict(kwargs, shared_expert_intermediate_size=cfg.mlp.n_shared_experts * expert_width(moe))

    def from_hf(self, c: Any) -> ModelConfig:
        if c.sliding_window is None:
            refuse_hf(c, "sliding_window", "a window (with it the full layers have no RoPE, as archlab holds them)")
        f, shared = c.moe_intermediate_size, c.shared_expert_intermediate_size
        if not shared or shared % f:
            refuse_hf(
                c, "shared_expert_intermediate_size", f"a multiple of moe_intermediate_size={f} (n shared experts)"
            )
        c = view(c, attention_bias=False, intermediate_size=f)
        mlp = self.moe_from_hf(c, n_shared_experts=shared // f, correction_bias=True, correction_on="logits")
        cfg = self.laid_out(c, mlp, [False] * c.num_hidden_layers)
        cfg.block = BlockConfig(kind="sandwich")
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(**dict(SANDWICH)):
            self.attention(t, lc, f"{b}.attn", f"{h}.self_attn")
            mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Kolibri1(),)
