"""Llama 4's text decoder (``Llama4ForCausalLM``): chunked and NoPE layers, dense and MoE layers interleaved (helpers in ``layered_moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import dense_tensors, is_dense, pre_norm_tensors
from archlab.interop.families.layered_moe import (
    _WIDTHS,
    _LayeredSparse,
    apply_layout,
)
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.interop.families.windows import checked_types
from archlab.nn.mixers.base import chunk_of
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class Llama4(_LayeredSparse):
    """Llama4ForCausalLM (Llama4TextConfig): no biases but ``attention_bias``, RoPE on interleaved pairs
    (its complex rotation) on the layers ``no_rope_layers`` marks 1 and none on the others, chunked
    attention on the ``chunked_attention`` layers of ``layer_types``, the weightless L2 QK-norm (eps
    ``rms_norm_eps``, after RoPE) on the RoPE layers when ``use_qk_norm``, the queries of the NoPE layers
    times 1 + ``attn_scale``·log(1 + ⌊(p + 1) / ``floor_scale``⌋) when ``attn_temperature_tuning``; MoE
    on the ``moe_layers`` (top-k of the sigmoid of the logits, the score on the expert's input, one shared
    expert of the routed width ``intermediate_size``), a dense MLP of ``intermediate_size_mlp`` on the
    others. A layer's kind is named by its parts: ``rope`` (chunked where RoPE layers are), ``nope``,
    with ``_full`` (a RoPE layer not chunked), ``_chunked`` (a NoPE layer chunked), ``_dense``."""

    parts = "chunked RoPE layers and global NoPE layers (iRoPE), L2 QK-norm, query scaling, MoE"

    model_type, title, model_class, config_class = "llama4_text", "Llama 4", "Llama4ForCausalLM", "Llama4TextConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.attention.chunk",
            "model.attention.qk_norm",
            "model.attention.query_scale_beta",
            "model.mlp.routing.weight_input",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    position_why = " (or none on a layer, as no_rope_layers says)"
    pairing = "interleaved"
    varies = _WIDTHS | {
        "model.position.kind",
        "model.attention.chunk",
        "model.attention.qk_norm",
        "model.attention.query_scale_beta",
        "model.attention.query_scale_length",
        "model.attention.query_scale_offset",
        "model.mlp.kind",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [r for r in super().rules(cfg) if r[0] != "model.position.pairing" or cfg.position.kind == "rope"]
        return [
            *rules,
            ("model.attention.qk_norm", ("none", "l2"), " (its QK-norm is the weightless L2 one)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        # the base rule on model.position.kind wants rope: a NoPE layer (none) is held too
        return [p for p in super().part_problems(cfg) if not (p.field.endswith("position.kind") and p.value == "none")]

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        if cfg.mlp.kind != "moe":  # a dense layer: the experts' kind, no biases
            return [("model.mlp.bias", (False,), "")]  # its experts' kind: _LayeredSparse.part_problems
        return [
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.normalize_top_k", (False,), " (its weights are the sigmoid scores)"),
            ("model.mlp.routing.weight_input", (True,), " (the score multiplies the expert's input)"),
            ("model.mlp.n_shared_experts", (1,), " (every MoE layer has one shared expert)"),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ("model.mlp.routing.router_bias", (False,), ""),
            ungrouped(""),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        found: list[Problem] = []

        def one(field: str, values: dict[int, Any], wants: str) -> None:
            distinct = sorted({repr(v) for v in values.values()})
            if len(distinct) > 1:
                i = next(i for i, v in values.items() if repr(v) != repr(values[min(values)]))
                found.append(Problem(kind_field(cfg, layer_kind(cfg, i), field), values[i], wants))

        rope = {i: lc for i, lc in enumerate(layers) if lc.position.kind == "rope"}
        nope = {i: lc for i, lc in enumerate(layers) if lc.position.kind != "rope"}
        one(
            "model.attention.chunk", {i: chunk_of(lc, i) for i, lc in enumerate(layers) if chunk_of(lc, i)}, "one chunk"
        )
        one(
            "model.attention.qk_norm",
            {i: lc.attention.qk_norm for i, lc in rope.items()},
            "one QK-norm on every RoPE layer",
        )
        for i, lc in nope.items():
            if lc.attention.qk_norm != "none":
                why = " (Llama 4 norms q and k on its RoPE layers only)"
                found.append(
                    Problem(
                        kind_field(cfg, layer_kind(cfg, i), "model.attention.qk_norm"),
                        lc.attention.qk_norm,
                        "none",
                        why,
                    )
                )
        for i, lc in rope.items():
            if lc.attention.query_scale_beta is not None:
                why = " (Llama 4 scales the queries of its NoPE layers only)"
                found.append(
                    Problem(
                        kind_field(cfg, layer_kind(cfg, i), "model.attention.query_scale_beta"),
                        lc.attention.query_scale_beta,
                        "null",
                        why,
                    )
                )
        scaled = {i: lc.attention for i, lc in nope.items()}
        one(
            "model.attention.query_scale_beta",
            {i: a.query_scale_beta for i, a in scaled.items()},
            "one attn_scale on every NoPE layer",
        )
        for i, a in scaled.items():
            if a.query_scale_beta is not None:
                one(
                    "model.attention.query_scale_length",
                    {i: a.query_scale_length for i, a in scaled.items()},
                    "one floor_scale",
                )
                if a.query_scale_offset != 1:
                    why = " (Llama 4 counts positions from 1)"
                    found.append(
                        Problem(
                            kind_field(cfg, layer_kind(cfg, i), "model.attention.query_scale_offset"),
                            a.query_scale_offset,
                            "1",
                            why,
                        )
                    )
        dense = {i: lc for i, lc in enumerate(layers) if is_dense(lc) and lc.mlp.kind != "none"}  # none: its kind
        moe = {i: lc for i, lc in enumerate(layers) if not is_dense(lc)}
        if not moe:
            found.append(Problem("model.mlp.kind", cfg.mlp.kind, "moe on some layer", " (Llama 4 has MoE layers)"))
        one("model.mlp.d_ff", {i: d_ff(lc) for i, lc in dense.items()}, "one width of every dense layer")
        one("model.mlp.expert_d_ff", {i: expert_width(lc) for i, lc in moe.items()}, "one expert width")
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        rope = [lc.position.kind == "rope" for lc in layers]
        chunks = [chunk_of(lc, i) for i, lc in enumerate(layers)]
        dense = [i for i, lc in enumerate(layers) if is_dense(lc)]
        moe = [i for i in range(cfg.n_layer) if i not in dense]
        nope = [lc.attention for lc, r in zip(layers, rope) if not r]
        scaled = next((a for a in nope if a.query_scale_beta is not None), None)
        rope_cfg = layers[rope.index(True)] if any(rope) else None
        m = layers[moe[0]] if moe else cfg
        return dict(
            self.base_to_hf(m),
            hidden_act=GATED_TO_HF[activation(m.mlp)],
            intermediate_size=expert_width(m),
            intermediate_size_mlp=d_ff(layers[dense[0]]) if dense else d_ff(m),
            moe_layers=moe,
            interleave_moe_layer_step=1,
            no_rope_layers=[int(r) for r in rope],
            use_qk_norm=rope_cfg is not None and rope_cfg.attention.qk_norm == "l2",
            rope_parameters=rope_to_hf(rope_cfg)
            if rope_cfg is not None
            else {"rope_type": "default", "rope_theta": cfg.position.theta},
            attention_chunk_size=next((c for c in chunks if c is not None), None),
            layer_types=["full_attention" if c is None else "chunked_attention" for c in chunks],
            attn_temperature_tuning=scaled is not None,
            attn_scale=scaled.query_scale_beta if scaled is not None else 0.1,
            floor_scale=scaled.query_scale_length if scaled is not None else 8192,
            router_jitter_noise=0.0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.router_jitter_noise:
            refuse_hf(c, "router_jitter_noise", "0.0 (archlab's router has no input jitter)")
        expert, approximate = gated_activation(c)
        n = c.num_hidden_layers
        hd = config_head_dim(c)
        use_rope = [bool(r) for r in list(c.no_rope_layers)[:n]]
        types = checked_types(c, "chunked_attention")
        moe_layers = set(c.moe_layers)
        if not moe_layers & set(range(n)):
            refuse_hf(c, "moe_layers", "at least one layer (archlab's dense layers are kinds of a MoE model)")
        position = rope_from_hf(c, hd, partial=False)
        position.pairing = "interleaved"
        mlp = mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size_mlp,
            expert_d_ff=c.intermediate_size,
            n_shared_experts=1,
            routing=dict(
                n_experts=c.num_local_experts,
                top_k=c.num_experts_per_tok,
                scoring="sigmoid",
                normalize_top_k=False,
                weight_input=True,
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )
        cfg = self.base_from_hf(c, position, mlp)
        names, overrides = [], {}
        for i in range(n):
            chunked = types[i] == "chunked_attention"
            attention: dict[str, Any] = {"chunk": c.attention_chunk_size} if chunked else {}
            over: dict[str, dict[str, Any]] = {}
            if use_rope[i]:
                name = "rope" if chunked else "rope_full"
                if c.use_qk_norm:
                    attention["qk_norm"] = "l2"
            else:
                name = "nope_chunked" if chunked else "nope"
                over["position"] = {"kind": "none"}
                if c.attn_temperature_tuning:
                    attention.update(
                        query_scale_beta=float(c.attn_scale),
                        query_scale_length=int(c.floor_scale),
                        query_scale_offset=1,
                    )
            if attention:
                over["attention"] = attention
            if i not in moe_layers:
                name += "_dense"
                over["mlp"] = {"kind": expert}
            names.append(name)
            overrides[name] = over
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def attention(t: Tensors, lc: ModelConfig, x: str, a: str) -> None:
            t.qkv(f"{x}.qkv", a, cfg.attention.qkv_bias)
            t.add(f"{x}.proj", f"{a}.o_proj", cfg.attention.out_bias)

        def mlp(t: Tensors, lc: ModelConfig, x: str, ff: str) -> None:
            """A dense layer; else the router, the routed experts ([E, in, out]) and the shared expert."""
            if is_dense(lc):
                dense_tensors(t, lc, x, ff)
                return
            f, s = expert_width(lc), f"{ff}.shared_expert"
            t.add(f"{x}.router", f"{ff}.router")
            t.maps += [
                TensorMap(f"{x}.experts.gate_up", (f"{ff}.experts.gate_up_proj",), "experts_transposed"),
                TensorMap(f"{x}.experts.down", (f"{ff}.experts.down_proj",), "experts_transposed"),
            ]
            t.stacked(f"{x}.shared.gate_up", [f"{s}.gate_proj", f"{s}.up_proj"], False, (f, f))
            t.add(f"{x}.shared.down", f"{s}.down_proj")

        return pre_norm_tensors(cfg, attention, mlp, "feed_forward")


RECORDS: tuple[Family, ...] = (Llama4(),)
