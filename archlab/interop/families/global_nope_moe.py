"""What two Hugging Face MoE families share (``_GlobalNope``): EXAONE MoE (``exaone_moe``) and Flint
(``flint``), whose sliding layers rotate and whose full layers have no positions, in pre-norm blocks with a
per-head QK-norm before RoPE, sigmoid routing, shared experts and dense layers where a per-layer list puts
them. Both are AFMoE's layout (``afmoe``) less its sandwich block, output gate and μP embedding scale: the
same layer kinds (``sliding``, ``full`` and each ``_dense``), the same rule that exactly the sliding layers
rotate, but dense layers anywhere (transformers' ``mlp_layer_types`` and ``mlp_only_layers`` name any layer,
and archlab's layer kinds hold any order). Their checkpoints save each expert apart (stacked on loading) and
keep names that transformers renames as it loads (``checkpoint_renames``)."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.afmoe import (
    POSITION_WHY,
    VARIES,
    Afmoe,
    global_nope_layout,
    global_nope_problems,
    shared_rules,
)
from archlab.interop.families.base import Problem, Rule
from archlab.interop.families.experts import (
    is_dense,
    mlp_tensors,
    pre_norm_tensors,
    stack_saved_experts,
)
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.interop.families.windows import checked_types, layer_types, sliding_window
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class _GlobalNope(_LayeredSparse):
    """What EXAONE MoE and Flint share: AFMoE's layer kinds (sliding layers with RoPE, full ones without
    positions, each ``_dense`` where the layer holds a gated MLP of ``intermediate_size``) in pre-norm
    blocks (``input_layernorm``, ``post_attention_layernorm``), q and k RMSNormed per head before RoPE, no
    output gate, unscaled embeddings, and sigmoid top-k routing beside shared experts on the MoE layers."""

    block_kind = "pre"
    features = Afmoe.features - {"model.scale_embedding", "model.attention.gate"}
    position_why, varies = POSITION_WHY, VARIES

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return global_nope_problems(self, super().part_problems(cfg), cfg)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        attention: list[Rule] = [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head, before RoPE)"),
            *self.attention_rules(cfg),
        ]
        if is_dense(cfg):  # a dense layer: the experts' kind, no biases
            return attention  # its experts' kind: _LayeredSparse.part_problems, which has the model's
        return [
            *attention,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            *self.routing_rules(cfg),
            *shared_rules(cfg),
        ]

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return []

    def routing_rules(self, cfg: ModelConfig) -> list[Rule]:
        return []

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window for the sliding layers; RoPE on exactly those, no positions on the full ones."""
        found = one_window(layers)
        for i, lc in enumerate(layers):
            sliding, kind = lc.attention.window is not None, lc.position.kind
            if kind in ("rope", "none") and (kind == "rope") != sliding:
                field = kind_field(cfg, layer_kind(cfg, i), "model.position.kind")
                why = f" ({self.title} rotates exactly its sliding layers; its full layers have no positions)"
                found.append(Problem(field, kind, "rope" if sliding else "none", why))
        return _unique(found)

    def layers_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keys both configs name alike: the layers' kinds (every key a strict int: the context where
        no layer slides), RoPE of a rotating layer, the MLP widths and expert counts."""
        layers, m = layer_configs(cfg), cfg.mlp
        rope_cfg = next((lc for lc in layers if lc.position.kind == "rope"), cfg)
        moe = next((lc for lc in layers if not is_dense(lc)), cfg)
        kwargs = self.base_to_hf(cfg)
        del kwargs["num_local_experts"]  # both name the count num_experts
        return dict(
            kwargs,
            hidden_act=GATED_TO_HF[activation(m)],
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(moe),
            num_experts=m.routing.n_experts,
            norm_topk_prob=m.routing.normalize_top_k,
            rope_parameters=rope_to_hf(rope_cfg),
            sliding_window=sliding_window(cfg, layers),
            layer_types=layer_types(layers),
        )

    def laid_out(self, c: Any, mlp: Any, dense: list[bool]) -> ModelConfig:
        """archlab's config of the HF config ``c`` (its ``attention_bias`` read, or a ``view`` giving it),
        the MoE ``mlp`` on every layer but those ``dense`` marks: each layer's kind by its type and MLP."""
        hd = config_head_dim(c)
        cfg = self.base_from_hf(c, rope_from_hf(c, hd, partial=False), mlp)
        cfg.attention.qk_norm = "head"
        return global_nope_layout(cfg, checked_types(c), dense, c.sliding_window)

    @staticmethod
    def moe_from_hf(c: Any, **fields: Any) -> Any:
        """The MoE both read alike: gated experts of ``hidden_act`` without biases, sigmoid scores, the
        top-k renormalised as ``norm_topk_prob`` says; ``fields`` the family's own."""
        expert, approximate = gated_activation(c)
        if not c.num_experts:
            refuse_hf(c, "num_experts", "at least 1 (archlab's dense layers are kinds of a MoE model)")
        return mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=c.moe_intermediate_size,
            **fields,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                scoring="sigmoid",
                normalize_top_k=bool(c.norm_topk_prob),
            ),
        )

    def attention(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        bias = t.cfg.attention.qkv_bias
        t.qkv(f"{archlab}.qkv", hf, bias)
        t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
        t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", bias)

    def mlp(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        mlp_tensors(t, lc, archlab, hf)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, self.attention, self.mlp)

    checkpoint_renames: tuple[tuple[str, str], ...] = ()  # (pattern, replacement): its checkpoints' names

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's names as transformers renames them on loading, each expert stacked."""
        for old, new in self.checkpoint_renames:
            state = {re.sub(old, new, k): v for k, v in state.items()}
        return stack_saved_experts(cfg, state)
