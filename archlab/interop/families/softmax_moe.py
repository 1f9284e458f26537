"""Softmax-routed mixtures of experts on LLaMA-style layers, each a record over Mixtral's (``moe._CausalSparse``):
OLMoE and FlexOlmo (OLMo 2's QK-norm over the projection; FlexOlmo's norms after each sublayer), GraniteMoE
and GraniteMoeShared (Granite's four multipliers; shared experts as one gated MLP), HunYuan-MoE (one shared
expert of the routed width, a per-head QK-norm after RoPE), ERNIE 4.5 MoE (interleaved RoPE, a
selection-only correction bias on the softmax scores, shared experts, dense first layers) and Aria's text
decoder (experts stored [E, in, out], shared experts), in ``SOFTMAX_MOE``."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import (
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    TensorMap,
    Tensors,
    config_head_dim,
    out_bias,
    refuse_hf,
)
from archlab.interop.families.granite import (
    check_multipliers,
    multiplier_problems,
    multipliers_from_hf,
    multipliers_to_hf,
)
from archlab.interop.families.granite_variants import GraniteSwa
from archlab.interop.families.hunyuan import HunYuanDense
from archlab.interop.families.layered import LAYERS as LAYERED
from archlab.interop.families.layered import LayeredFamily, view
from archlab.interop.families.moe import (
    LAYERS,
    _CausalSparse,
    _Sparse,
    dense_first,
    dense_tensors,
    is_dense,
    pre_norm_tensors,
    with_dense_first,
)
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


def replaced(rules: list[Rule], *new: Rule) -> list[Rule]:
    """``rules`` with each of ``new`` in place of the rule on its field (appended where none is)."""
    by_field = {r[0]: r for r in new}
    kept = [by_field.pop(r[0], r) for r in rules]
    return kept + list(by_field.values())


def uniform(c: Any, name: str) -> Any:
    """Config key ``name``: an int, or a per-layer list of one value (archlab's MoE layers are alike)."""
    value = getattr(c, name)
    if isinstance(value, list):
        if len(set(value)) != 1:
            refuse_hf(c, name, "one value for every layer (archlab's MoE layers are alike)")
        return value[0]
    return value


class _Softmax(_CausalSparse):
    """LLaMA-style attention over softmax top-k routing: what the records here share. The MoE block is
    ``model.layers.i.<moe>``, its router ``<moe>.<router>``; the shared experts ``model.layers.i.<shared>``
    (``shared_names``: its gate, up and down Linears, or ``fused``: one Linear of [gate | up], then down)."""

    moe, router, shared = "mlp", "gate", "mlp.shared_experts"
    shared_names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
    fused = False

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        if a.qk_norm != "none":
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)

    def mlp_tensors(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        """A dense layer's gated MLP; else the router, its correction bias, the stacked experts and the
        shared experts under this family's names."""
        if is_dense(lc):
            dense_tensors(t, lc, archlab, hf)
            return
        m = lc.mlp
        t.add(f"{archlab}.router", f"{hf}.{self.router}")
        if m.correction_bias:
            bias = f"{hf}.{self.router}.moe_statics.e_score_correction_bias"
            t.maps.append(TensorMap(f"{archlab}.router_bias", (bias,), "flat", (1, m.n_experts)))
        t.maps.append(TensorMap(f"{archlab}.experts.gate_up", (f"{hf}.experts.gate_up_proj",)))
        t.maps.append(TensorMap(f"{archlab}.experts.down", (f"{hf}.experts.down_proj",)))
        if m.n_shared_experts:
            f, s = m.n_shared_experts * expert_width(lc), f"{hf.removesuffix(self.moe)}{self.shared}"
            names = [f"{s}.{n}" for n in self.shared_names]
            if self.fused:
                t.add(f"{archlab}.shared.gate_up", names[0])
            else:
                t.stacked(f"{archlab}.shared.gate_up", names[:2], False, (f, f))
            t.add(f"{archlab}.shared.down", names[-1])

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(
            cfg, lambda t, lc, archlab, hf: self.attention_tensors(t, archlab, hf), self.mlp_tensors, self.moe
        )


class Olmoe(_Softmax):
    """OlmoeForCausalLM: LLaMA's layers with q and k RMSNormed over the whole projection before RoPE, a
    MoE in every layer renormalised as ``norm_topk_prob`` says, head_dim = hidden_size / heads. Its
    ``clip_qkv`` clamps q, k and v after the QK-norm; archlab clamps the projection before it, so a
    clip_qkv is refused."""

    model_type, title, model_class, config_class = "olmoe", "OLMoE", "OlmoeForCausalLM", "OlmoeConfig"
    features = frozenset({"model.position.scaling", "model.attention.qk_norm"})
    parts = "LLaMA's layers with a QK RMSNorm over the projection, a softmax top-k MoE"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.attention.qk_norm", ("full",), " (q_norm and k_norm span the projection)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            head_dim_rule(cfg, self.title),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"]  # its attention has none
        return dict(
            kwargs,
            attention_bias=cfg.attention.qkv_bias,
            num_experts=cfg.mlp.n_experts,
            intermediate_size=expert_width(cfg),
            norm_topk_prob=cfg.mlp.normalize_top_k,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "clip_qkv", None) is not None:
            refuse_hf(c, "clip_qkv", "null (it clamps after the QK-norm; archlab's clip_qkv clamps before it)")
        fixed_head_dim(c)
        mlp = self.moe_from_hf(
            c,
            c.num_experts,
            c.intermediate_size,
            normalize_top_k=bool(c.norm_topk_prob),
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        cfg = self.causal_from_hf(view(c, sliding_window=None, head_dim=None), mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.qk_norm = bias, bias, "full"
        cfg.attention.head_dim = None
        return cfg


class FlexOlmo(Olmoe):
    """FlexOlmoForCausalLM: OLMoE's attention (no clip_qkv) and MoE in OLMo 2's block: each sublayer's
    output RMSNormed before the residual add, no norm before a sublayer."""

    model_type, title, model_class, config_class = "flex_olmo", "FlexOlmo", "FlexOlmoForCausalLM", "FlexOlmoConfig"
    parts = "OLMo 2's post_sublayer block and QK RMSNorm over the projection, a softmax top-k MoE"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return replaced(super().rules(cfg), ("model.block.kind", ("post_sublayer",), ""))

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.block.kind = "post_sublayer"
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        """``_Softmax.tensors`` with OLMo 2's norms: after attention and after the MoE, none before."""
        ours = {".attn_norm.": ".attn_out_norm.", ".mlp_norm.": ".mlp_out_norm."}
        theirs = {".attn_norm.": ".post_attention_layernorm.", ".mlp_norm.": ".post_feedforward_layernorm."}
        maps = []
        for m in super().tensors(cfg):
            old = next((k for k in ours if k in m.archlab), None)
            if old is not None:
                layer = m.hf[0].rsplit(".", 2)[0]  # model.layers.i
                m = TensorMap(m.archlab.replace(old, ours[old]), (f"{layer}{theirs[old]}weight",))
            maps.append(m)
        return maps


class GraniteMoe(_Softmax):
    """GraniteMoeForCausalLM: Granite's layers and multipliers (``granite.Granite``: embeddings,
    residual branches, the score scale ``attention_multiplier`` and 1 / ``logits_scaling``) over a MoE in
    every layer at ``block_sparse_moe``: the top-k router logits softmaxed, which is softmax over every
    expert renormalised over the top k. Its checkpoints hold the experts stacked, as ``input_linear`` and
    ``output_linear``, and the router as ``router.layer``."""

    model_type, title = "granitemoe", "GraniteMoE"
    model_class, config_class = "GraniteMoeForCausalLM", "GraniteMoeConfig"
    features = frozenset(
        {
            "model.position.scaling",
            "model.embedding_multiplier",
            "model.block.residual_multiplier",
            "model.attention.scale",
            "model.head.logit_scale",
        }
    )
    parts = "Granite's layers and multipliers with a softmax top-k MoE"
    moe, router = "block_sparse_moe", "router"
    checkpoint_renames = {
        ".block_sparse_moe.input_linear.weight": ".block_sparse_moe.experts.gate_up_proj",
        ".block_sparse_moe.output_linear.weight": ".block_sparse_moe.experts.down_proj",
        ".block_sparse_moe.router.layer.weight": ".block_sparse_moe.router.weight",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.normalize_top_k", (True,), " (it softmaxes the top-k logits: the weights sum to 1)"),
            head_dim_rule(cfg, self.title),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + multiplier_problems(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"]  # its attention has none
        return dict(
            kwargs,
            attention_bias=cfg.attention.qkv_bias,
            num_local_experts=cfg.mlp.n_experts,
            intermediate_size=expert_width(cfg),
            **multipliers_to_hf(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        check_multipliers(c)
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
            **self.shared_from_hf(c),
        )
        cfg = self.causal_from_hf(view(c, sliding_window=None, head_dim=None), mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.head_dim = bias, bias, None
        return multipliers_from_hf(c, cfg)

    def shared_from_hf(self, c: Any) -> dict[str, Any]:
        """The MLPConfig fields of the shared experts (none here)."""
        return {}


class GraniteMoeShared(GraniteMoe):
    """GraniteMoeSharedForCausalLM: GraniteMoE beside a shared gated MLP of ``shared_intermediate_size``
    (``shared_mlp.input_linear`` holds [gate | up]), which archlab holds as n_shared_experts experts of
    the routed width: a multiple of ``intermediate_size``, or none."""

    model_type, title = "granitemoeshared", "GraniteMoeShared"
    model_class, config_class = "GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig"
    parts = "GraniteMoE's parts with shared experts"
    shared, shared_names, fused = "shared_mlp", ("input_linear", "output_linear"), True

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [r for r in super().rules(cfg) if r[0] != "model.mlp.n_shared_experts"]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), shared_intermediate_size=cfg.mlp.n_shared_experts * expert_width(cfg))

    def shared_from_hf(self, c: Any) -> dict[str, Any]:
        n, rest = divmod(c.shared_intermediate_size, c.intermediate_size)
        if rest:
            refuse_hf(c, "shared_intermediate_size", "a multiple of intermediate_size (archlab's shared experts)")
        return {"n_shared_experts": n}


class HunYuanMoe(_Softmax):
    """HunYuanMoEV1ForCausalLM: HunYuan dense's attention (q/k/v and output biases together, a per-head
    RMSNorm of the rotated q and k as ``query_layernorm`` and ``key_layernorm``, the fixed-alpha NTK base
    read as ``HunYuanDense`` does) over a MoE in every layer: ``num_experts`` experts of
    ``intermediate_size`` (``mlp.gate.wg`` routes, softmax, top-k renormalised) beside one shared expert
    of the same width (``mlp.shared_mlp``)."""

    model_type, title = "hunyuan_v1_moe", "HunYuan-MoE"
    model_class, config_class = "HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config"
    features = frozenset({"model.position.scaling", "model.attention.qk_norm", "model.attention.qk_norm_after_rope"})
    parts = "HunYuan dense's layers (per-head QK-norm after RoPE) with a softmax top-k MoE and one shared expert"
    router, shared = "gate.wg", "mlp.shared_mlp"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return replaced(
            super().rules(cfg),
            ("model.mlp.n_shared_experts", (1,), " (its MoE layers have one shared expert of the routed width)"),
            ("model.mlp.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
            ("model.attention.qk_norm", ("head",), " (query_layernorm and key_layernorm span one head)"),
            ("model.attention.qk_norm_after_rope", (True,), " (HunYuan norms the rotated q and k)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        )

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"]  # its attention has none
        return dict(
            kwargs,
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            num_experts=cfg.mlp.n_experts,
            moe_topk=cfg.mlp.top_k,
            intermediate_size=expert_width(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        rope = HunYuanDense._fixed_rope(c, hd)
        c = view(c, rope_parameters=rope, sliding_window=None, num_experts_per_tok=uniform(c, "moe_topk"))
        mlp = self.moe_from_hf(c, uniform(c, "num_experts"), c.intermediate_size, n_shared_experts=1)
        cfg = self.causal_from_hf(c, mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias = bias, bias
        cfg.attention.qk_norm, cfg.attention.qk_norm_after_rope = "head", True
        return cfg

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        t.add(f"{archlab}.q_norm", f"{hf}.query_layernorm")
        t.add(f"{archlab}.k_norm", f"{hf}.key_layernorm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)


class Ernie45Moe(_Softmax):
    """Ernie4_5_MoeForCausalLM: ERNIE 4.5's layers (interleaved RoPE, no attention dropout, no biases)
    over softmax routing whose top k are chosen by the scores plus a selection-only correction bias
    (``mlp.gate.moe_statics.e_score_correction_bias``, [1, E]), renormalised, beside
    ``moe_num_shared_experts`` shared experts; the layers before ``moe_layer_start_index`` dense (width
    ``intermediate_size``). ``use_bias`` biases the attention, the shared experts and the dense MLPs but
    not the routed experts, which archlab's one ``model.mlp.bias`` cannot hold: it is refused."""

    model_type, title = "ernie4_5_moe", "ERNIE 4.5 MoE"
    model_class, config_class = "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig"
    features = frozenset({"model.position.scaling"}) | LAYERS
    checkpoint_renames = {".mlp.moe_statics.": ".mlp.gate.moe_statics."}  # as saved, the bias beside the router
    parts = "ERNIE 4.5's layers with a softmax top-k MoE, correction bias, shared experts, dense first layers"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            r
            for r in replaced(
                super().rules(cfg),
                ("model.position.pairing", ("interleaved",), " (ERNIE 4.5 rotates adjacent dims together)"),
                ("model.mlp.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
                ("model.mlp.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
                ("model.attention.qkv_bias", (False,), " (use_bias would bias its shared experts too)"),
                out_bias(False),
                ("model.attention.dropout", (0.0,), " (ERNIE 4.5's attention has no dropout)"),
            )
            if r[0] != "model.mlp.n_shared_experts"
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        for key in ("sliding_window", "attention_dropout", "num_experts_per_tok"):
            del kwargs[key]  # Ernie4_5_MoeConfig has no window or attention dropout; moe_k is the top k
        n_dense = dense_first(layer_configs(cfg))
        return dict(
            kwargs,
            head_dim=head_dim(cfg),
            use_bias=False,
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            moe_k=cfg.mlp.top_k,
            moe_num_experts=cfg.mlp.n_experts,
            moe_num_shared_experts=cfg.mlp.n_shared_experts,
            moe_layer_start_index=n_dense,
            moe_layer_end_index=cfg.n_layer - 1,
            moe_layer_interval=1,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.use_bias:
            refuse_hf(c, "use_bias", "false (it biases the shared experts but not the routed ones)")
        if c.moe_layer_interval != 1:
            refuse_hf(c, "moe_layer_interval", "1 (archlab's MoE layers are every layer after the dense ones)")
        end = c.moe_layer_end_index
        if end != -1 and end < c.num_hidden_layers - 1:
            refuse_hf(
                c, "moe_layer_end_index", f"-1 or at least {c.num_hidden_layers - 1} (MoE through the last layer)"
            )
        c = view(c, sliding_window=None, attention_dropout=0.0, num_experts_per_tok=c.moe_k)
        mlp = self.moe_from_hf(
            c,
            c.moe_num_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.moe_num_shared_experts or 0,
            correction_bias=True,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef or 0.0),
        )
        cfg = self.causal_from_hf(c, mlp)
        cfg.position.pairing = "interleaved"
        return with_dense_first(cfg, min(max(c.moe_layer_start_index, 0), c.num_hidden_layers))


class AriaText(_Softmax):
    """AriaTextForCausalLM (Aria's text decoder): LLaMA's attention over a MoE in every layer whose router
    (``mlp.router``) softmaxes the top-k logits, which is softmax over every expert renormalised, beside
    ``moe_num_shared_experts`` shared experts of the routed width. Its experts are stored [E, in, out]
    (``gate_up_proj`` [E, d, 2f], gate columns first; ``down_proj`` [E, f, d]) and always SiLU-gated;
    its checkpoints name them ``experts.fc1`` and ``experts.fc2``."""

    defers = True  # to GraniteMoeShared, which holds its layouts with unit multipliers

    model_type, title, model_class, config_class = "aria_text", "Aria (text)", "AriaTextForCausalLM", "AriaTextConfig"
    parts = "LLaMA's layers with a softmax top-k MoE of SwiGLU experts ([E, in, out]) and shared experts"
    router = "router"
    checkpoint_renames = {
        ".mlp.experts.fc1.weight": ".mlp.experts.gate_up_proj",
        ".mlp.experts.fc2.weight": ".mlp.experts.down_proj",
    }

    shared_experts = True  # at least one: it builds the shared experts whatever their width

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [r for r in super().rules(cfg) if r[0] != "model.mlp.n_shared_experts"]
        return replaced(
            rules,
            ("model.mlp.expert", ("swiglu",), " (its experts are always SiLU-gated)"),
            ("model.mlp.normalize_top_k", (True,), " (it softmaxes the top-k logits: the weights sum to 1)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        )

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"], kwargs["num_experts_per_tok"]  # no window; moe_topk is the top k
        return dict(
            kwargs,
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            mlp_bias=False,
            intermediate_size=expert_width(cfg),
            moe_num_experts=cfg.mlp.n_experts,
            moe_topk=cfg.mlp.top_k,
            moe_num_shared_experts=cfg.mlp.n_shared_experts,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (its routed experts are SiLU-gated whatever it says)")
        if c.mlp_bias:
            refuse_hf(c, "mlp_bias", "false (it biases the shared experts but not the routed ones)")
        if c.moe_num_shared_experts < 1:
            refuse_hf(c, "moe_num_shared_experts", "at least 1 (it builds the shared experts whatever their width)")
        c = view(c, sliding_window=None, num_experts_per_tok=c.moe_topk)
        mlp = self.moe_from_hf(
            c, c.moe_num_experts, c.intermediate_size, n_shared_experts=c.moe_num_shared_experts, normalize_top_k=True
        )
        cfg = self.causal_from_hf(c, mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias = bias, bias
        return cfg

    def mlp_tensors(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        super().mlp_tensors(t, lc, archlab, hf)
        experts = (f"{archlab}.experts.gate_up", f"{archlab}.experts.down")
        t.maps = [m._replace(layout="experts_transposed") if m.archlab in experts else m for m in t.maps]


class GraniteMoeSwa(LayeredFamily, GraniteMoeShared):
    """GraniteMoeSWAForCausalLM: GraniteMoeShared's layers with Granite SWA's attention
    (``granite_variants.GraniteSwa``): a sink logit per head, a ``sliding_window`` on the layers
    ``layer_types`` marks sliding, and per layer the RoPE base of ``layer_rope_theta`` (0: no position
    encoding; one non-zero base, as archlab's layers share one RoPE)."""

    model_type, title = "granitemoe_swa", "GraniteMoE SWA"
    model_class, config_class = "GraniteMoeSWAForCausalLM", "GraniteMoeSWAConfig"
    features = GraniteMoeShared.features | LAYERED | {"model.attention.window", "model.attention.sinks"}
    parts = "GraniteMoeShared's parts with sinks, `window` on any layers and NoPE layers (`model.layers`)"
    nope = True
    hf_layers = GraniteSwa.hf_layers
    layers_to_hf = GraniteSwa.layers_to_hf

    # _Sparse's keys, which _CausalSparse.to_hf reads; LayeredFamily's method of this name goes unused (to_hf below)
    def base_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        return _Sparse.base_to_hf(self, cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        rep = next((lc for lc in lcs if lc.position.kind == "rope"), lcs[0])
        return {**GraniteMoeShared.to_hf(self, rep), **self.layers_to_hf(cfg, lcs)}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), ("model.attention.sinks", (True,), " (every head has a sink logit)")]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = GraniteMoeShared.from_hf(self, c)
        cfg.attention.sinks = True
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        sinks = [
            TensorMap(f"blocks.{i}.attn.sinks", (f"model.layers.{i}.self_attn.sinks",)) for i in range(cfg.n_layer)
        ]
        return super().tensors(cfg) + sinks


RECORDS: tuple[Family, ...] = (
    Olmoe(),
    FlexOlmo(),
    GraniteMoe(),
    GraniteMoeShared(),
    HunYuanMoe(),
    Ernie45Moe(),
    AriaText(),
    GraniteMoeSwa(),
)
