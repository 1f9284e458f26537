"""What the Hugging Face mixture-of-experts families share (``_Sparse``, ``_CausalSparse``, dense first
layers, expert tensors), whose records are in ``mixtral``, ``qwen3_moe``, ``deepseek`` (DeepSeek-V2 and
DeepSeek-V3: multi-head latent attention and DeepSeekMoE) and further modules. ``sparse_family`` picks one
for a layout with a moe MLP or mla attention. Routed experts are stacked in both libraries (transformers 5's ``gate_up_proj``
[E, 2f, d], gate rows first, and ``down_proj`` [E, d, f]), so they map tensor for tensor; DeepSeek's
shared experts are one gated MLP of n_shared·f, and DeepSeek-V3's correction bias is a buffer in both.
The auxiliary-loss weights are training settings, not layout: ``aux_loss_weight`` travels as
``router_aux_loss_coef`` where the class has one (Mixtral, Qwen3-MoE); DeepSeek's classes have none,
and no class has a z-loss, so those are not written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from archlab.config import (
    BlockConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig
from archlab.errors import ConfigError
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, bare, ungrouped
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import (
    GATED_TO_HF,
    activation,
    dense_of,
    gated_activation,
    mlp_section,
    shared_experts,
)
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, differences, kind_field
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

# The latent norms of transformers' DeepSeek attention keep the RMSNorm default eps, whatever rms_norm_eps says.
DEEPSEEK_LATENT_EPS = 1e-6
LATENT_EPS = "model.attention.latent_norm_eps"


def latent_eps_rule(cfg: ModelConfig) -> Rule:
    """The rule of a family whose latent norms are at 1e-6 whatever its ``rms_norm_eps``: latent_norm_eps
    null beside model.norm.eps 1e-6, else 1e-6 (one spelling of each model, as ``latent_eps_from_hf`` reads)."""
    allowed = (None,) if cfg.norm.eps == DEEPSEEK_LATENT_EPS else (DEEPSEEK_LATENT_EPS,)
    return (LATENT_EPS, allowed, " (its latent norms always use 1e-6: null where model.norm.eps is 1e-6)")


def latent_eps_from_hf(c: Any) -> float | None:
    """model.attention.latent_norm_eps of such a family's config: null where rms_norm_eps is 1e-6 already."""
    return None if c.rms_norm_eps == DEEPSEEK_LATENT_EPS else DEEPSEEK_LATENT_EPS


LAYERS = frozenset({"model.layers.first", "model.layers.pattern"})


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
                found.append(Problem(field, value, bare(wanted), why))
    first: dict[str, Problem] = {}
    for p in found:
        first.setdefault(p.field, p)
    return list(first.values())


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
    for i, lc in enumerate(layer_configs(cfg)):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
        t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm")
        attention(t, lc, f"{b}.attn", f"{h}.self_attn")
        mlp(t, lc, f"{b}.mlp", f"{h}.{mlp_name}")
    t.add("final_norm", "model.norm")
    return t.head()


def stack_saved_experts(
    cfg: ModelConfig, state: dict[str, Tensor], matrices: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
) -> dict[str, Tensor]:
    """A checkpoint's per-expert matrices ``model.layers.i.mlp.experts.e.<gate | up | down>.weight`` of
    each MoE layer (not a dense one) stacked as transformers 5 holds them in memory: ``gate_up_proj``
    [E, 2f, d] (the gate rows, then the up rows) and ``down_proj`` [E, d, f]; a layer missing any expert is
    left for the caller to name."""
    gate, up, down = matrices
    for i, lc in enumerate(layer_configs(cfg)):
        if is_dense(lc):
            continue
        h = f"model.layers.{i}.mlp.experts"
        names = [[f"{h}.{e}.{m}.weight" for e in range(cfg.mlp.routing.n_experts)] for m in (gate, up, down)]
        if all(n in state for ns in names for n in ns):
            gates, ups, downs = ([state.pop(n) for n in ns] for ns in names)
            state[f"{h}.gate_up_proj"] = torch.cat((torch.stack(gates), torch.stack(ups)), dim=1)
            state[f"{h}.down_proj"] = torch.stack(downs)
    return state


# Multi-head latent attention's config keys, copied as they are (``Family.keys``).
MLA_KEYS = {
    "q_lora_rank": "attention.q_lora_rank",
    "kv_lora_rank": "attention.kv_lora_rank",
    "qk_nope_head_dim": "attention.qk_nope_head_dim",
    "qk_rope_head_dim": "attention.qk_rope_head_dim",
    "v_head_dim": "attention.v_head_dim",
}


class _Sparse(Family):
    """What the four share: LLaMA's names and pre-norm RMSNorm block, no head bias, untied or tied head,
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
        """The config keys all four name alike."""
        return dict(
            self.keys_to_hf(cfg),
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            attention_dropout=cfg.attention.dropout,
        )

    def base_from_hf(self, c: Any, position: PositionConfig, attention: MixerConfig, mlp: MLPConfig) -> ModelConfig:
        """archlab's config from the keys all four name alike and the family's parts."""
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


# ---- Mixtral and Qwen3-MoE: causal attention with separate q/k/v, softmax top-k routing


class _CausalSparse(_Sparse):
    """Mixtral and Qwen3-MoE: LLaMA's attention (GQA, any head_dim, a sliding window on every layer) over
    softmax top-k routing without shared experts or groups."""

    features = frozenset({"model.position.scaling.kind", "model.attention.window"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m = cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            sliding_window=cfg.attention.window,
            num_experts_per_tok=m.routing.top_k,
            router_aux_loss_coef=m.routing.aux_loss_weight,
        )

    def causal_from_hf(self, c: Any, mlp: MLPConfig) -> ModelConfig:
        """archlab's config of LLaMA-style attention over ``mlp``."""
        hd = config_head_dim(c)
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=hd,
            qkv_bias=False,
            out_bias=False,
            dropout=float(c.attention_dropout),
            window=c.sliding_window,
        )
        position = rope_from_hf(c, hd, partial=False, scalings=self.rope_types())
        return self.base_from_hf(c, position, attention, mlp)

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        if a.qk_norm == "head":
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)


# ---- DeepSeek-V2 and -V3: multi-head latent attention and DeepSeekMoE


# every model_type ``sparse_family`` answers: ``FAMILIES`` lists them after ``dense.ROUTES``, in this order
ROUTES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3")


def sparse_family(cfg: ModelConfig) -> Family:
    """The family of a layout with a moe MLP or mla attention (``hf.family_of`` asks):

    =============================================================  ============
    mla attention, moe MLP with sigmoid scores or a correction bias  DeepSeek-V3
    mla attention, moe MLP otherwise                                 DeepSeek-V2
    causal attention with a per-head QK-norm, moe MLP                Qwen3-MoE
    causal attention otherwise, moe MLP                              Mixtral
    =============================================================  ============
    """
    from archlab.interop.families import FAMILIES  # the package imports this module while it collects them

    m = cfg.mlp
    if cfg.attention.kind == "mla":
        if m.kind != "moe":
            raise ConfigError(
                "model.mlp.kind",
                m.kind,
                "moe to convert attention kind mla to Hugging Face DeepSeek-V2/V3 (their latent attention comes with "
                "DeepSeekMoE; its dense layers are layer kinds: model/layers=dense_first)",
            )
        return FAMILIES["deepseek_v3" if m.routing.scoring == "sigmoid" or m.routing.correction_bias else "deepseek_v2"]
    return FAMILIES["qwen3_moe" if cfg.attention.qk_norm == "head" else "mixtral"]
