"""The Hugging Face mixture-of-experts families, one record each: Mixtral, Qwen3-MoE, DeepSeek-V2 and
DeepSeek-V3 (multi-head latent attention and DeepSeekMoE).

They are ``base.Family`` records like the dense ones (``SPARSE``; ``families.FAMILIES`` joins the
two tables). ``sparse_family`` picks one for a layout with a moe MLP or mla attention. Routed experts are stacked in both libraries (transformers 5's ``gate_up_proj``
[E, 2f, d], gate rows first, and ``down_proj`` [E, d, f]), so they map tensor for tensor; DeepSeek's
shared experts are one gated MLP of n_shared·f, and DeepSeek-V3's correction bias is a buffer in both.
The auxiliary-loss weights are training settings, not layout: ``aux_loss_weight`` travels as
``router_aux_loss_coef`` where the class has one (Mixtral, Qwen3-MoE); DeepSeek's classes have none,
and no class has a z-loss, so those are not written.
"""

from __future__ import annotations

import dataclasses
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
from archlab.interop.families.base import (
    GATED_TO_HF,
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    TensorMap,
    Tensors,
    bare,
    config_head_dim,
    differences,
    gated_activation,
    kind_field,
    out_bias,
    refuse_hf,
    ungrouped,
)
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.mla import MLAConfig
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
            mlp = dataclasses.replace(cfg.mlp, kind=cfg.mlp.expert)
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
    if m.correction_bias:
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
        names = [[f"{h}.{e}.{m}.weight" for e in range(cfg.mlp.n_experts)] for m in (gate, up, down)]
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
        if self.shared_experts and cfg.mlp.n_shared_experts < 1:
            why = " (its MoE layers always have shared experts)"
            found.append(Problem("model.mlp.n_shared_experts", cfg.mlp.n_shared_experts, "at least 1", why))
        return found

    def rope_types(self) -> tuple[str, ...]:
        """The rope_parameters rope_types of this family's ``scalings``."""
        return tuple("default" if s == "none" else s for s in self.scalings)

    def base_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The config keys all four name alike."""
        return dict(
            self.keys_to_hf(cfg),
            hidden_act=GATED_TO_HF[(cfg.mlp.expert, cfg.mlp.approximate)],
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
    def moe_from_hf(c: Any, n_experts: int, expert_d_ff: int, **fields: Any) -> MLPConfig:
        """archlab's MoE of the config: bias-free experts of the kind its hidden_act names, ``n_experts``
        of width ``expert_d_ff``, ``num_experts_per_tok`` of them per token; ``fields`` the family's own."""
        expert, approximate = gated_activation(c)
        return MLPConfig(
            kind="moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            n_experts=n_experts,
            top_k=c.num_experts_per_tok,
            expert_d_ff=expert_d_ff,
            **fields,
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

    features = frozenset({"model.position.scaling", "model.attention.window"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.scoring", ("softmax",), ""),
            ("model.mlp.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routed_scale", (1.0,), ""),
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
            num_experts_per_tok=m.top_k,
            router_aux_loss_coef=m.aux_loss_weight,
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


class Mixtral(_CausalSparse):
    """MixtralForCausalLM: Mistral's attention (no biases) and a MoE in every layer, softmax over the
    experts, the top-k weights renormalised; ``intermediate_size`` is an expert's width."""

    parts = "Mistral's layers with a softmax top-k MoE of SwiGLU experts"

    model_type, title, model_class, config_class = "mixtral", "Mixtral", "MixtralForCausalLM", "MixtralConfig"
    expert_matrices = ("w1", "w3", "w2")
    checkpoint_renames = {".block_sparse_moe.": ".mlp."}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.mlp.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        hd = head_dim(cfg)
        return dict(
            super().to_hf(cfg),
            head_dim=None if hd == cfg.d_model // cfg.attention.n_head else hd,  # as published: null when implied
            num_local_experts=cfg.mlp.n_experts,
            intermediate_size=expert_width(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.router_jitter_noise:
            refuse_hf(c, "router_jitter_noise", "0.0 (archlab's router has no input jitter)")
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        return self.causal_from_hf(c, mlp)


class Qwen3Moe(_CausalSparse):
    """Qwen3MoeForCausalLM: Qwen3's attention (per-head QK-norm, explicit head_dim, one attention_bias
    flag) and MoE layers of ``moe_intermediate_size`` experts, the top-k weights renormalised as
    ``norm_topk_prob`` says; ``mlp_only_layers`` 0 .. N-1 are archlab's first N layers of a dense kind
    (width ``intermediate_size``, ``with_dense_first``)."""

    parts = "Qwen3's layers with a softmax top-k MoE, dense layers by a kind"

    model_type, title, model_class, config_class = "qwen3_moe", "Qwen3-MoE", "Qwen3MoeForCausalLM", "Qwen3MoeConfig"
    features = _CausalSparse.features | {"model.attention.qk_norm"} | LAYERS

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m, window = cfg.mlp, cfg.attention.window
        return dict(
            super().to_hf(cfg),
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            use_sliding_window=window is not None,
            num_experts=m.n_experts,
            moe_intermediate_size=expert_width(cfg),
            intermediate_size=d_ff(cfg),
            norm_topk_prob=m.normalize_top_k,
            decoder_sparse_step=1,
            mlp_only_layers=list(range(dense_first(layer_configs(cfg)))),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.decoder_sparse_step != 1:
            refuse_hf(c, "decoder_sparse_step", "1 (archlab's MoE layers are every layer after the dense ones)")
        if c.num_experts < 1:
            refuse_hf(c, "num_experts", "at least 1 (archlab's MoE layers have routed experts)")
        dense = list(c.mlp_only_layers)
        if dense != list(range(len(dense))):
            refuse_hf(c, "mlp_only_layers", "the first N layers, [0, 1, ..., N-1] (archlab's dense layer kinds)")
        mlp = self.moe_from_hf(
            c,
            c.num_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            normalize_top_k=bool(c.norm_topk_prob),
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        cfg = with_dense_first(self.causal_from_hf(c, mlp), min(len(dense), c.num_hidden_layers))
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.qk_norm = bias, bias, "head"
        return cfg  # Qwen3MoeConfig has already set sliding_window to None unless use_sliding_window


# ---- DeepSeek-V2 and -V3: multi-head latent attention and DeepSeekMoE


class _DeepSeek(_Sparse):
    """DeepSeek-V2 and -V3: multi-head latent attention (queries direct or through ``q_lora_rank``, keys
    and values from a ``kv_lora_rank`` latent, one rotated key all heads share), YaRN RoPE, the first
    ``first_k_dense_replace`` layers dense (width ``intermediate_size``), then routed experts of
    ``moe_intermediate_size`` beside ``n_shared_experts`` shared ones, weights times ``routed_scaling_factor``."""

    attention_kind = "mla"
    position_why = " (it always rotates qk_rope_head_dim dims)"
    features = frozenset({"model.position.scaling", "model.position.truncate", LATENT_EPS}) | LAYERS
    scalings = ("none", "yarn")
    shared_experts = True
    keys = {**_Sparse.keys, **MLA_KEYS}
    topk_method: str  # the value of DeepSeek's own config key topk_method this version computes (set per subclass)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [latent_eps_rule(cfg)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a, m = cfg.attention, cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=a.n_head,
            attention_bias=False,
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            n_routed_experts=m.n_experts,
            num_experts_per_tok=m.top_k,
            n_shared_experts=m.n_shared_experts,
            first_k_dense_replace=dense_first(layer_configs(cfg)),
            routed_scaling_factor=m.routed_scale,
            norm_topk_prob=m.normalize_top_k,
            n_group=m.n_groups,
            topk_group=m.top_groups,
            # read by DeepSeek's own modeling code (trust_remote_code) and by from_hf; transformers fixes them
            scoring_func=m.scoring,
            topk_method=self.topk_method,
        )

    def deepseek_from_hf(self, c: Any, pairing: str, **routing: Any) -> ModelConfig:
        """archlab's config, ``routing`` the family's MLPConfig fields (scoring, groups, renormalisation)."""
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's mla projections have no biases)")
        if c.num_key_value_heads not in (None, c.num_attention_heads):
            refuse_hf(
                c, "num_key_value_heads", f"num_attention_heads={c.num_attention_heads} (every head reads the latent)"
            )
        if not c.n_shared_experts:
            refuse_hf(
                c, "n_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        for key, computed in (("topk_method", self.topk_method), ("scoring_func", routing["scoring"])):
            if getattr(c, key, None) not in (None, computed):  # DeepSeek's own keys: transformers fixes both
                refuse_hf(c, key, f"'{computed}' (what transformers' {self.model_class} computes)")
        position = rope_from_hf(c, c.qk_rope_head_dim, partial=False, scalings=self.rope_types())
        position.pairing = pairing
        attention = MLAConfig(
            dropout=float(c.attention_dropout),
            latent_norm_eps=latent_eps_from_hf(c),
        )
        mlp = self.moe_from_hf(
            c,
            c.n_routed_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.n_shared_experts,
            routed_scale=float(c.routed_scaling_factor),
            **routing,
        )
        cfg = self.base_from_hf(c, position, attention, mlp)
        return with_dense_first(cfg, min(c.first_k_dense_replace or 0, c.num_hidden_layers))

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        if t.cfg.attention.q_lora_rank is None:
            t.add(f"{archlab}.q_proj", f"{hf}.q_proj")
        else:
            t.add(f"{archlab}.q_down", f"{hf}.q_a_proj")
            t.add(f"{archlab}.q_norm", f"{hf}.q_a_layernorm")
            t.add(f"{archlab}.q_up", f"{hf}.q_b_proj")
        t.add(f"{archlab}.kv_down", f"{hf}.kv_a_proj_with_mqa")
        t.add(f"{archlab}.kv_norm", f"{hf}.kv_a_layernorm")
        t.add(f"{archlab}.kv_up", f"{hf}.kv_b_proj")
        t.add(f"{archlab}.proj", f"{hf}.o_proj")


class DeepseekV2(_DeepSeek):
    """DeepseekV2ForCausalLM: softmax scores, greedy top-k (transformers never renormalises the top-k
    weights here, whatever norm_topk_prob says), rotated pairs interleaved."""

    parts = "MLA, DeepSeekMoE (shared experts, groups), dense first layers, YaRN (DeepSeek's reading)"

    model_type, title, model_class, config_class = (
        "deepseek_v2",
        "DeepSeek-V2",
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
    )
    topk_method = "greedy"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.position.pairing", ("interleaved",), " (it rotates interleaved pairs)"),
            ("model.mlp.scoring", ("softmax",), ""),
            ("model.mlp.correction_bias", (False,), ""),
            ungrouped(" (its group_limited_greedy ranks groups by their best score alone)"),
            ("model.mlp.normalize_top_k", (False,), " (it never renormalises the top-k weights)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), mlp_bias=False)

    def from_hf(self, c: Any) -> ModelConfig:
        if c.mlp_bias:
            refuse_hf(c, "mlp_bias", "false (archlab's experts have no biases)")
        if c.norm_topk_prob:
            refuse_hf(c, "norm_topk_prob", "false (transformers' DeepseekV2 never renormalises the top-k weights)")
        if c.topk_method != "greedy":
            refuse_hf(
                c,
                "topk_method",
                "'greedy' (group_limited_greedy ranks groups by their best score; archlab by their two best, as V3)",
            )
        return self.deepseek_from_hf(c, "interleaved", scoring="softmax", normalize_top_k=False)


class DeepseekV3(_DeepSeek):
    """DeepseekV3ForCausalLM: sigmoid scores plus the selection-only ``e_score_correction_bias`` (a
    buffer), group-limited top-k (``n_group``, ``topk_group``: groups ranked by their two best scores),
    renormalised as ``norm_topk_prob`` says; rotated pairs interleaved or halves (``rope_interleave``).
    archlab has no multi-token-prediction module (neither has DeepseekV3ForCausalLM): num_mtp_layers 0."""

    parts = "DeepSeek-V2's parts with sigmoid routing and a correction bias"

    model_type, title, model_class, config_class = (
        "deepseek_v3",
        "DeepSeek-V3",
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
    )
    topk_method = "noaux_tc"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.mlp.scoring", ("sigmoid",), ""),
            ("model.mlp.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), rope_interleave=cfg.position.pairing == "interleaved", num_mtp_layers=0)

    def from_hf(self, c: Any) -> ModelConfig:
        return self.deepseek_from_hf(
            c,
            "interleaved" if c.rope_interleave else "half",
            scoring="sigmoid",
            correction_bias=True,
            normalize_top_k=bool(c.norm_topk_prob),
            n_groups=c.n_group or 1,
            top_groups=c.topk_group or 1,
        )


RECORDS: tuple[Family, ...] = (Mixtral(), Qwen3Moe(), DeepseekV2(), DeepseekV3())


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
        return FAMILIES["deepseek_v3" if m.scoring == "sigmoid" or m.correction_bias else "deepseek_v2"]
    return FAMILIES["qwen3_moe" if cfg.attention.qk_norm == "head" else "mixtral"]
