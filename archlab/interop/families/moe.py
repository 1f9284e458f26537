"""The Hugging Face mixture-of-experts families' record base (``_Sparse``: LLaMA's names and pre-norm
RMSNorm block over routed experts of a gated kind) and the table that routes a layout with a moe MLP or mla
attention to one of them (``sparse_family``). The records: Mixtral, Qwen3-MoE, DBRX and the other
softmax-routed ones on ``softmax_moe._Softmax``; DeepSeek-V2 and -V3 (multi-head latent attention and
DeepSeekMoE) in ``deepseek``; the sigmoid-routed ones in ``dots``, ``glm4_moe``, ``sigmoid_moe``. The
auxiliary-loss weights are training settings, not layout: ``aux_loss_weight`` travels as
``router_aux_loss_coef`` where the class has one (Mixtral, Qwen3-MoE); DeepSeek's classes have none, and no
class has a z-loss, so those are not written."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import (
    BlockConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)
from archlab.errors import ConfigError
from archlab.interop.families.base import LAYERS, NO_HEAD_BIAS, Family, Problem, Rule
from archlab.interop.families.experts import dense_first_problems, pre_norm_tensors, stack_saved_experts
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import (
    GATED_TO_HF,
    activation,
    gated_activation,
    mlp_section,
    shared_experts,
)
from archlab.interop.families.rope import rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors


class _Sparse(Family):
    """What the MoE records share: LLaMA's names and pre-norm RMSNorm block, no head bias, untied or tied head,
    routed experts of a gated kind without biases, a router Linear without bias (``mlp.gate``)."""

    prefix = "model."
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}
    shared_experts = False  # DeepSeek: n_shared_experts >= 1 (transformers builds the shared MLP whatever its width)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.mlp.kind", ("moe",), ""),
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            *self.family_rules(cfg),
        ]

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        """What the family alone requires (its router's scores, groups and renormalisation, its RoPE pairs)."""
        return []

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts, then where the family's first layers may be dense
        (``LAYERS`` among its features) what it cannot hold of the layer kinds (``dense_first_problems``)."""
        found = super().part_problems(cfg)
        if LAYERS <= self.features:
            found += dense_first_problems(cfg, self.title)
        if self.shared_experts and shared_experts(cfg.mlp) < 1:
            why = " (its MoE layers always have shared experts)"
            found.append(Problem("model.mlp.n_shared_experts", shared_experts(cfg.mlp), "at least 1", why))
        return found

    def rope_types(self) -> tuple[str, ...]:
        """The rope_parameters rope_types of this family's ``scalings``."""
        return tuple("default" if s == "none" else s for s in self.scalings)

    def base_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The config keys the MoE records name alike."""
        return dict(
            self.keys_to_hf(cfg),
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            attention_dropout=cfg.attention.dropout,
        )

    def base_from_hf(self, c: Any, position: PositionConfig, attention: MixerConfig, mlp: MLPConfig) -> ModelConfig:
        """archlab's config from the keys the MoE records name alike and the family's parts."""
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=position,
            attention=attention,
            mlp=mlp,
        )
        return self.keys_from_hf(c, cfg)

    @staticmethod
    def moe_from_hf(c: Any, n_experts: int, expert_d_ff: int, **fields: Any) -> Any:
        """archlab's MoE of the config: bias-free experts of the kind its hidden_act names, ``n_experts``
        of width ``expert_d_ff``, ``num_experts_per_tok`` of them per token; ``fields`` the family's own."""
        expert, approximate = gated_activation(c)
        return mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            expert_d_ff=expert_d_ff,
            **fields,
            routing=dict(n_experts=n_experts, top_k=c.num_experts_per_tok),
        )

    @staticmethod
    def v3_routing(c: Any) -> dict[str, Any]:
        """DeepSeek-V3's router as its configs spell it (and the families that copy it: dots.llm1, Kimi-Linear):
        sigmoid scores, a selection-only correction bias, the top-k renormalised as ``norm_topk_prob`` says,
        ``n_group`` groups of which ``topk_group`` are kept (null: one)."""
        return dict(
            scoring="sigmoid",
            correction_bias=True,
            normalize_top_k=bool(c.norm_topk_prob),
            n_groups=c.n_group or 1,
            top_groups=c.topk_group or 1,
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, lambda t, lc, archlab, hf: self.attention_tensors(t, archlab, hf))

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        raise NotImplementedError

    # A checkpoint's per-expert matrices (gate, up, down) and its names for the MoE block, as saved.
    expert_matrices = ("gate_proj", "up_proj", "down_proj")
    checkpoint_renames: dict[str, str] = {}

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers 5 stacks the experts in memory but saves (as the Hub's checkpoints hold them) one
        tensor per expert and matrix, ``mlp.experts.e.gate_proj.weight`` ...: stacked here, the gate rows
        before the up rows, where every expert of a layer is present (else left for the caller to name)."""
        for old, new in self.checkpoint_renames.items():
            state = {k.replace(old, new): v for k, v in state.items()}
        return stack_saved_experts(cfg, state, self.expert_matrices)


# every model_type ``sparse_family`` answers: ``FAMILIES`` lists them after ``dense.ROUTES``, in this order
ROUTES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "deepseek_v32")


def sparse_family(cfg: ModelConfig) -> Family:
    """The family of a layout with a moe MLP, mla or dsa attention (``hf.family_of`` asks):

    =============================================================  ============
    dsa attention, moe MLP                                           DeepSeek-V3.2
    mla attention, moe MLP with sigmoid scores or a correction bias  DeepSeek-V3
    mla attention, moe MLP otherwise                                 DeepSeek-V2
    causal attention with a per-head QK-norm, moe MLP                Qwen3-MoE
    causal attention otherwise, moe MLP                              Mixtral
    =============================================================  ============
    """
    from archlab.interop.families import FAMILIES  # the package imports this module while it collects them

    m = cfg.mlp
    if cfg.attention.kind in ("mla", "dsa"):
        if m.kind != "moe":
            raise ConfigError(
                "model.mlp.kind",
                m.kind,
                f"moe to convert attention kind {cfg.attention.kind} to Hugging Face DeepSeek-V2/V3/V3.2 (their latent "
                "attention comes with DeepSeekMoE; its dense layers are layer kinds: model/layers=dense_first)",
            )
        if cfg.attention.kind == "dsa":
            return FAMILIES["deepseek_v32"]
        return FAMILIES["deepseek_v3" if m.routing.scoring == "sigmoid" or m.routing.correction_bias else "deepseek_v2"]
    return FAMILIES["qwen3_moe" if cfg.attention.qk_norm == "head" else "mixtral"]
