"""Qwen3.5's text decoders (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM``): Qwen3-Next's layers (gated
attention with (1 + w) per-head QK-norm and half-paired partial RoPE, Gated DeltaNet, (1 + w) RMSNorms, pre-norm)
with a dense SwiGLU in every layer (Qwen3.5) or Qwen3-Next's MoE in every layer, its top-k weights always
renormalised (Qwen3.5-MoE). Their Gated DeltaNet projects q, k, v (``in_proj_qkv``: every query head, then
every key head, then every value head), z, b and a apart, which archlab's one ``in_proj`` holds stacked in
that order. Their RoPE is multimodal (``mrope_section``): text positions are the same in its three sections,
so it is plain RoPE and the sections are left unread. A layout Qwen3.5-MoE holds Qwen3-Next holds too, and
exports there (the same model; Qwen3-Next comes first in ``FAMILIES``). The published checkpoints are saved
from the vision-language model: ``model.language_model.*`` is read as ``model.*`` and the vision tower
(``model.visual.*``) left out, as transformers does; the multi-token-prediction layer (``mtp.*``) is read and
written as Qwen3-Next's (``families/mtp.py``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.deltanet import cfg_types, deltanet_layers, deltanet_tensors_apart
from archlab.interop.families.mlps import mlp_section, shared_experts
from archlab.interop.families.qwen3_next import Qwen3Next
from archlab.interop.families.values import refuse_hf
from archlab.nn.mlp import d_ff

MROPE = frozenset({"mrope_section", "mrope_interleaved"})  # the sections of text positions are equal: plain RoPE


class Qwen3_5(Qwen3Next):
    """Qwen3_5ForCausalLM (``qwen3_5_text``): Qwen3-Next's mixers with a dense SwiGLU in every layer."""

    defers = True  # to Qwen3-Next, whose layouts Qwen3.5's MoE holds too

    model_type, title, model_class, config_class = (
        "qwen3_5_text",
        "Qwen3.5",
        "Qwen3_5ForCausalLM",
        "Qwen3_5TextConfig",
    )
    parts = (
        "gated attention (partial RoPE, (1 + w) QK-norm) and Gated DeltaNet layers (q, k, v, z, b, a projected "
        "apart), (1 + w) RMSNorms, SwiGLU"
    )
    features = Qwen3Next.features - {"model.mlp.shared_expert_gate"}
    deltanet_tensors = staticmethod(deltanet_tensors_apart)
    renames = {"model.language_model.": "model."}  # the published checkpoints, saved from the vision-language model

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The vision tower (``model.visual.*``) left out, as transformers leaves it; then Qwen3-Next's."""
        return super().from_checkpoint(cfg, {k: v for k, v in state.items() if not k.startswith("model.visual.")})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        """Qwen3-Next's but its MoE's: a bias-free SwiGLU instead."""
        kept = [r for r in super().rules(cfg) if not r[0].startswith("model.mlp.")]
        return [
            *kept,
            ("model.mlp.kind", ("swiglu",), " (hidden_act, silu, is also its linear layers' convolution's)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts, then its layer kinds' (one MLP for every layer)."""
        return Family.part_problems(self, cfg) + self.layer_problems(cfg, cfg.mlp, "one MLP for every layer")

    def from_hf(self, c: Any) -> ModelConfig:
        self.check_hf(c)
        mlp = mlp_section("swiglu", approximate="none", bias=False, d_ff=c.intermediate_size)
        cfg = self.common_from_hf(c, mlp, MROPE)
        deltanet_layers(c, cfg, [False] * len(cfg_types(c)))
        return cfg


class Qwen3_5Moe(Qwen3_5):
    """Qwen3_5MoeForCausalLM (``qwen3_5_moe_text``): Qwen3-Next's MoE in every layer, top-k renormalised."""

    model_type, title, model_class, config_class = (
        "qwen3_5_moe_text",
        "Qwen3.5-MoE",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeTextConfig",
    )
    parts = (
        "gated attention (partial RoPE, (1 + w) QK-norm) and Gated DeltaNet layers (q, k, v, z, b, a projected "
        "apart), (1 + w) RMSNorms, softmax MoE with a sigmoid-gated shared expert"
    )
    features = Qwen3Next.features

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        why = " (its router always renormalises the top-k weights)"
        return [*Qwen3Next.rules(self, cfg), ("model.mlp.routing.normalize_top_k", (True,), why)]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """Qwen3-Next's, but every layer MoE: a dense layer kind is named by its MLP's kind."""
        found = Family.part_problems(self, cfg)
        if shared_experts(cfg.mlp) < 1:
            why = " (its MoE layers always have a shared expert)"
            found.append(Problem("model.mlp.n_shared_experts", shared_experts(cfg.mlp), "at least 1", why))
        return found + self.layer_problems(cfg, cfg.mlp, "a MoE in every layer")

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        out = Qwen3Next.to_hf(self, cfg)
        for key in ("intermediate_size", "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob"):
            del out[key]
        return out

    def from_hf(self, c: Any) -> ModelConfig:
        self.check_hf(c)
        if c.num_experts < 1:
            refuse_hf(c, "num_experts", "at least 1 (every Qwen3.5-MoE layer is a MoE)")
        cfg = self.common_from_hf(c, self.moe_from_hf(c, True, None), MROPE)
        cfg.mlp.d_ff = d_ff(cfg)  # no layer reads it: the rule's width, as Qwen3-Next's intermediate_size reads back
        deltanet_layers(c, cfg, [False] * len(cfg_types(c)))
        return cfg


RECORDS: tuple[Family, ...] = (Qwen3_5(), Qwen3_5Moe())
