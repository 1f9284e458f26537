"""JetMoE (``JetMoeForCausalLM``): pre-norm RMSNorm blocks whose attention is a mixture of attention heads
(``model.attention.kind=moa``: routed query/output projections over shared keys and values, ``JetMoeMoA``) and
whose MLP is a softmax top-k MoE of gated experts with one output bias (``model.mlp.out_bias``); one
``num_local_experts``, ``num_experts_per_tok`` and ``aux_loss_coef`` serve both routers."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.moa import MoAConfig
from archlab.nn.moe import expert_width

LAYER_NORM_EPS = 1e-6  # its layers' RMSNorms are built at the default eps, whatever rms_norm_eps says
SHARED = " (one num_local_experts, num_experts_per_tok and aux_loss_coef serve attention and MLP)"


class JetMoe(_Sparse):
    """JetMoeForCausalLM: each layer's ``self_attention`` holds the shared ``kv_proj`` (keys, then values, of
    ``num_key_value_heads`` heads of ``kv_channels``) and its ``experts`` (``router.layer``, the stacked
    ``input_linear`` queries and ``output_linear`` outputs, the ``bias``); its ``mlp`` the router, the stacked
    ``input_linear`` [gate | up] and ``output_linear`` down, and the ``bias``. Both routers softmax their
    top-k logits; full half-paired RoPE, unscaled."""

    model_type, title, model_class, config_class = "jetmoe", "JetMoE", "JetMoeForCausalLM", "JetMoeConfig"
    parts = "`moa` attention (routed query/output projections over shared keys/values), a softmax top-k MoE with an output bias"
    attention_kind = "moa"
    features = frozenset({"model.mlp.out_bias"})
    scalings = ("none",)
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "max_position_embeddings": "context_length",
        "initializer_range": "init_std",
        "tie_word_embeddings": "head.tied",
        "rms_norm_eps": "norm.eps",
        "num_key_value_heads": "attention.n_head",
        "kv_channels": "attention.head_dim",
        "num_local_experts": "attention.n_experts",
        "num_experts_per_tok": "attention.top_k",
        "aux_loss_coef": "attention.aux_loss_weight",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, r = cfg.attention, cfg.mlp.routing if cfg.mlp.kind == "moe" else None
        shared: list[Rule] = []
        if r is not None:
            shared = [
                ("model.mlp.routing.n_experts", (a.n_experts,), SHARED),
                ("model.mlp.routing.top_k", (a.top_k,), SHARED),
                ("model.mlp.routing.aux_loss_weight", (a.aux_loss_weight,), SHARED),
            ]
        return super().rules(cfg) + [
            ("model.position.pairing", ("half",), ""),
            ("model.norm.eps", (LAYER_NORM_EPS,), " (its layers' RMSNorms are fixed at 1e-06)"),
            ("model.attention.out_bias", (True,), " (its attention experts' sum has a bias)"),
            ("model.mlp.out_bias", (True,), " (its MoE's output has a bias)"),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.normalize_top_k", (True,), " (it softmaxes the top-k logits: the weights sum to 1)"),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
            *shared,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + Family.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            kv_channels=head_dim(cfg),
            intermediate_size=expert_width(cfg),
            activation_function=GATED_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            attention_dropout=0.0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.rms_norm_eps != LAYER_NORM_EPS:
            refuse_hf(c, "rms_norm_eps", "1e-06 (its layers' RMSNorms are fixed at 1e-06; archlab has one eps)")
        if c.attention_dropout:
            refuse_hf(c, "attention_dropout", "0.0 (archlab's moa has no attention dropout)")
        expert, approximate = gated_activation(c, "activation_function")
        routing = dict(n_experts=c.num_local_experts, top_k=c.num_experts_per_tok)
        mlp = mlp_section(
            "moe",
            approximate=approximate,
            expert=expert,
            bias=False,
            expert_d_ff=c.intermediate_size,
            out_bias=True,
            routing=dict(routing, normalize_top_k=True, aux_loss_weight=float(c.aux_loss_coef)),
        )
        attention = MoAConfig(out_bias=True)
        position = rope_from_hf(c, c.kv_channels, partial=False, scalings=self.rope_types())
        cfg = self.base_from_hf(c, position, attention, mlp)
        cfg.attention.aux_loss_weight = float(cfg.attention.aux_loss_weight)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for _, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
            a, moa, mlp = f"{h}.self_attention", f"{h}.self_attention.experts", f"{h}.mlp"
            t.add(f"{b}.attn.router", f"{moa}.router.layer")
            t.add(f"{b}.attn.kv", f"{a}.kv_proj")
            t.maps.append(TensorMap(f"{b}.attn.q_experts", (f"{moa}.input_linear.weight",)))
            t.maps.append(TensorMap(f"{b}.attn.o_experts", (f"{moa}.output_linear.weight",)))
            t.maps.append(TensorMap(f"{b}.attn.bias", (f"{moa}.bias",)))
            t.add(f"{b}.mlp.router", f"{mlp}.router.layer")
            t.maps.append(TensorMap(f"{b}.mlp.experts.gate_up", (f"{mlp}.input_linear.weight",)))
            t.maps.append(TensorMap(f"{b}.mlp.experts.down", (f"{mlp}.output_linear.weight",)))
            t.maps.append(TensorMap(f"{b}.mlp.out_bias", (f"{mlp}.bias",)))
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Its checkpoints hold the experts stacked, as the model does: as they are."""
        return state


RECORDS: tuple[Family, ...] = (JetMoe(),)
