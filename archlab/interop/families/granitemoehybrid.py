"""GraniteMoeHybrid (``GraniteMoeHybridForCausalLM``, IBM Granite 4.0's hybrids): Bamba's layer kinds, Mamba-2
(``mamba``) or GQA attention as ``layer_types`` says, under Granite's four multipliers (``granite``: embedding,
residual, the score scale ``attention_multiplier``, 1 / ``logits_scaling``), each layer's MLP a softmax
top-k MoE (``block_sparse_moe``) beside a shared SwiGLU MLP (``shared_mlp``, ``input_linear`` holding
[gate | up]), or with ``num_local_experts`` 0 that shared MLP alone. Attention is NoPE unless
``position_embedding_type`` is ``rope`` (full RoPE then).

In archlab the shared MLP is ``n_shared_experts`` experts of the routed width (``shared_intermediate_size``
a multiple of ``intermediate_size``), or, without experts, a dense ``swiglu`` of ``d_ff``
``shared_intermediate_size``. The Mamba-2 layers are Bamba's ``mamba2`` kind (``families.bamba``), which also
resets the score scale (mamba2 has no scores). Checkpoints store the experts as ``input_linear`` /
``output_linear`` and the router as ``router.layer``: renamed on loading, as transformers does."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    HeadConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs
from archlab.interop.families.bamba import (
    ATTENTION,
    MAMBA,
    hybrid_layers,
    hybrid_problems,
    hybrid_tensors,
    is_mamba,
    mamba_to_hf,
)
from archlab.interop.families.base import NO_HEAD_BIAS, ONE_BIAS_FLAG, Family, Problem, Rule, out_bias, ungrouped
from archlab.interop.families.granite import (
    check_multipliers,
    multiplier_problems,
    multipliers_from_hf,
    multipliers_to_hf,
)
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

LINEAR, FULL = "linear_attention", "full_attention"


class GraniteMoeHybrid(Family):
    """GraniteMoeHybridForCausalLM: see the module docstring."""

    mixer_kinds = ("mamba2",)

    model_type, title = "granitemoehybrid", "GraniteMoeHybrid"
    model_class, config_class = "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig"
    prefix = "model."
    position_kind = ("rope", "none")
    parts = "Mamba-2 and GQA layers (NoPE or RoPE), Granite's multipliers, a softmax MoE beside a shared MLP"
    features = frozenset(
        {
            "model.layers.first",
            "model.layers.pattern",
            "model.embedding_multiplier",
            "model.block.residual_multiplier",
            "model.attention.scale",
            "model.head.logit_scale",
        }
    )
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps", "attention_dropout": "attention.dropout"}
    checkpoint_renames = {
        ".block_sparse_moe.input_linear.weight": ".block_sparse_moe.experts.gate_up_proj",
        ".block_sparse_moe.output_linear.weight": ".block_sparse_moe.experts.down_proj",
        ".block_sparse_moe.router.layer.weight": ".block_sparse_moe.router.weight",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, m = cfg.attention, cfg.mlp
        rules: list[Rule] = [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.position.pairing", ("half",), ""),
            head_dim_rule(cfg, self.title),
            out_bias(a.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.kind", ("moe", "swiglu"), " (experts beside a shared SwiGLU, or that SwiGLU alone)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
        ]
        if m.kind == "moe":
            rules += [
                ("model.mlp.expert", ("swiglu",), " (hidden_act, silu, is also its Mamba-2 convolution's)"),
                ("model.mlp.routing.scoring", ("softmax",), ""),
                (
                    "model.mlp.routing.normalize_top_k",
                    (True,),
                    " (it softmaxes the top-k logits: the weights sum to 1)",
                ),
                ("model.mlp.routing.correction_bias", (False,), ""),
                ungrouped(),
                ("model.mlp.routing.routed_scale", (1.0,), ""),
            ]
        return rules

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (its attention layers'), full RoPE, Granite's logit
        scale, a shared expert beside the routed ones, then Bamba's checks of the layer kinds."""
        found = super().part_problems(cfg) + multiplier_problems(cfg)
        if cfg.position.kind == "rope":
            found += self.full_rotary(cfg)
        if cfg.mlp.kind == "moe" and cfg.mlp.n_shared_experts < 1:
            why = " (every layer has its shared_mlp beside the experts)"
            found.append(Problem("model.mlp.n_shared_experts", cfg.mlp.n_shared_experts, "at least 1", why))
        return found + hybrid_problems(cfg, self.title)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m, rope = cfg.mlp, cfg.position.kind == "rope"
        if m.kind == "moe":
            width = expert_width(cfg)
            mlp = dict(
                num_local_experts=m.routing.n_experts,
                num_experts_per_tok=m.routing.top_k,
                intermediate_size=width,
                shared_intermediate_size=m.n_shared_experts * width,
                router_aux_loss_coef=m.routing.aux_loss_weight,
            )
        else:
            mlp = dict(num_local_experts=0, intermediate_size=d_ff(cfg), shared_intermediate_size=d_ff(cfg))
        return dict(
            self.keys_to_hf(cfg),
            **mlp,
            num_key_value_heads=n_kv_head(cfg),
            hidden_act="silu",
            attention_bias=cfg.attention.qkv_bias,
            position_embedding_type="rope" if rope else None,
            **({"rope_parameters": rope_to_hf(cfg)} if rope else {}),
            layer_types=[LINEAR if is_mamba(lc) else FULL for lc in layer_configs(cfg)],
            **mamba_to_hf(cfg),
            **multipliers_to_hf(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        check_multipliers(c)
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU; its Mamba-2 convolution is SiLU'd too)")
        types = list(c.layer_types)
        if len(types) != c.num_hidden_layers or set(types) - {LINEAR, FULL}:
            refuse_hf(c, "layer_types", f"num_hidden_layers entries, each '{LINEAR}' or '{FULL}'", types)
        if c.position_embedding_type not in (None, "nope", "rope"):
            refuse_hf(c, "position_embedding_type", "'rope', or null or 'nope' (no position encoding)")
        hd, bias = fixed_head_dim(c), bool(c.attention_bias)
        rope = c.position_embedding_type == "rope"
        position = (
            rope_from_hf(c, hd, partial=False, scalings=("default",)) if rope else POSITION_OPTIONS.make(kind="none")
        )
        shared = c.shared_intermediate_size
        if c.num_local_experts:
            n, rest = divmod(shared, c.intermediate_size)
            if rest or n < 1:
                allowed = "a positive multiple of intermediate_size (archlab's shared experts)"
                refuse_hf(c, "shared_intermediate_size", allowed)
            mlp = mlp_section(
                "moe",
                expert="swiglu",
                approximate="none",
                bias=False,
                expert_d_ff=c.intermediate_size,
                n_shared_experts=n,
                routing=dict(
                    n_experts=c.num_local_experts,
                    top_k=c.num_experts_per_tok,
                    normalize_top_k=True,
                    aux_loss_weight=float(c.router_aux_loss_coef),
                ),
            )
        else:
            mlp = mlp_section("swiglu", approximate="none", bias=False, d_ff=shared)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=position,
            attention=AttentionConfig(n_kv_head=c.num_key_value_heads, qkv_bias=bias, out_bias=bias),
            mlp=mlp,
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.dropout = float(cfg.attention.dropout)
        cfg = multipliers_from_hf(c, cfg)
        cfg.layers = hybrid_layers(c, [MAMBA if t == LINEAR else ATTENTION for t in types])
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
            hybrid_tensors(t, lc, f"{b}.attn", h)
            if lc.mlp.kind == "moe":
                moe = f"{h}.block_sparse_moe"
                t.add(f"{b}.mlp.router", f"{moe}.router")
                t.maps.append(TensorMap(f"{b}.mlp.experts.gate_up", (f"{moe}.experts.gate_up_proj",)))
                t.maps.append(TensorMap(f"{b}.mlp.experts.down", (f"{moe}.experts.down_proj",)))
                t.add(f"{b}.mlp.shared.gate_up", f"{h}.shared_mlp.input_linear")
                t.add(f"{b}.mlp.shared.down", f"{h}.shared_mlp.output_linear")
            else:
                t.add(f"{b}.mlp.gate_up", f"{h}.shared_mlp.input_linear")
                t.add(f"{b}.mlp.down", f"{h}.shared_mlp.output_linear")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The experts and router under the names transformers gives them in memory."""
        for old, new in self.checkpoint_renames.items():
            state = {k.replace(old, new): v for k, v in state.items()}
        return state


RECORDS: tuple[Family, ...] = (GraniteMoeHybrid(),)
