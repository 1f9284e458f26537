"""DeepSeek-V4 (``DeepseekV4ForCausalLM``): DeepSeek-V4's attention (``dsv4``: shared-KV MQA with sinks, the
grouped output projection, a sliding window in every layer and, per layer, HCA's or CSA's pooled blocks,
``layer_types`` and ``compress_rates``), RoPE of its own on the compressing layers (``rope_parameters``'
``compress``: ``compress_rope_theta``, YaRN), mHC's residual streams (``hc_mult``), and a MoE of clamped SwiGLU
experts (``swiglu_limit``) beside one shared expert, routed by ``scoring_func`` with a correction bias, or
through a fixed table of the token ids (``mlp_layer_types`` ``hash_moe``). Layer kinds: ``sliding``, ``hca`` or
``csa``, each with ``_hash``. A checkpoint's multi-token prediction layers (``mtp.*``), which transformers does
not build, are left out."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, ModelConfig, NormConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.errors import ConfigError
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import stack_saved_experts
from archlab.interop.families.layered import view
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, apply_layout, one_window
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import kind_field, leaf_fields, refuse_hf
from archlab.nn.mixers.dsv4 import DSV4Config
from archlab.nn.moe import expert_width
from archlab.nn.rope import RoPEConfig
from archlab.nn.streams.mhc import MHCConfig

# layer_types <-> model.attention.compress
LAYER_TYPES = {
    "sliding_attention": "none",
    "heavily_compressed_attention": "hca",
    "compressed_sparse_attention": "csa",
}
TYPE_OF = {v: k for k, v in LAYER_TYPES.items()}
KIND_NAMES = {"none": "sliding", "hca": "hca", "csa": "csa"}
# the attention's config keys, copied as they are
V4_KEYS = {
    "head_dim": "attention.head_dim",
    "q_lora_rank": "attention.q_lora_rank",
    "o_groups": "attention.o_groups",
    "o_lora_rank": "attention.o_lora_rank",
    "index_n_heads": "attention.index_n_heads",
    "index_head_dim": "attention.index_head_dim",
    "index_topk": "attention.index_topk",
}


# a checkpoint's names (DeepSeek's, as transformers saves them) -> transformers' in memory, in this order
CHECKPOINT_NAMES = [
    (r"^head\.weight$", "lm_head.weight"),
    (r"^(model\.)?embed\.weight$", r"\1embed_tokens.weight"),
    (r"^(model\.)?hc_head_(fn|base|scale)$", r"\1hc_head.hc_\2"),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_(fn|base|scale)$", r".attn_hc.\1"),
    (r"\.hc_ffn_(fn|base|scale)$", r".ffn_hc.\1"),
    (r"\.attn\.", ".self_attn."),
    (r"\.ffn\.", ".mlp."),
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."),
    (r"\.attn_sink$", ".sinks"),
    (r"\.ape$", ".position_bias"),
    (r"\.(self_attn(?:\.compressor)?(?:\.indexer)?)\.norm\.", r".\1.kv_norm."),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
]


def _fraction(head_dim: int, rotated: int) -> float:
    """partial_rotary_factor giving ``rotated`` dims of ``head_dim`` (transformers rotates int(hd · factor))."""
    fraction = rotated / head_dim
    while int(head_dim * fraction) < rotated:
        fraction = math.nextafter(fraction, 1.0)
    return fraction


def _compress_rope(c: Any, params: Any, hd: int) -> RoPEConfig:
    """The compressing layers' RoPE: default or YaRN, interleaved pairs, its attention factor as given
    (transformers' DeepSeek-V4 sets 1.0: cos and sin unscaled)."""
    given = dict(params or {})
    factor = given.pop("attention_factor", None)
    given.pop("partial_rotary_factor", None)  # the attention's qk_rope_head_dim
    try:
        rope = rope_from_hf(
            view(c, rope_parameters=given), hd, partial=True, scalings=("default", "yarn"), yarn_softmax=False
        )
    except ConfigError as err:
        raise ConfigError(
            err.field.replace(".rope_parameters", ".rope_parameters.compress", 1), err.value, err.allowed
        ) from None
    rope.pairing = "interleaved"
    if factor is not None and rope.scaling.kind == "yarn":
        rope.scaling.attention_factor = float(factor)
    return rope


class DeepseekV4(_LayeredSparse):
    """DeepseekV4ForCausalLM: pre-norm RMSNorm blocks inside mHC's streams, dsv4 attention in every layer
    (its window ``sliding_window``; HCA or CSA blocks by ``layer_types``, of ``compress_rates``), the sliding
    layers' RoPE ``main`` and the compressing layers' ``compress``, each over the trailing
    ``partial_rotary_factor`` of a head in interleaved pairs; MoE layers of SwiGLU experts clamped at
    ``swiglu_limit`` with one shared expert, scored by ``scoring_func`` and renormalised, times
    ``routed_scaling_factor``, chosen with ``e_score_correction_bias`` or (``hash_moe``) by ``tid2eid``."""

    model_type, title = "deepseek_v4", "DeepSeek-V4"
    model_class, config_class = "DeepseekV4ForCausalLM", "DeepseekV4Config"
    parts = "dsv4 attention (sinks, grouped output, HCA/CSA blocks per layer), mHC streams, hash and top-k MoE"
    attention_kind = "dsv4"
    pairing = "interleaved"
    scalings = ("none", "yarn")
    keys = {**_LayeredSparse.keys, **V4_KEYS}
    features = frozenset(
        {
            "model.stream.kind",
            "model.layers.first",
            "model.layers.pattern",
            "model.attention.window",
            "model.position.scaling.kind",
            "model.position.scaling.attention_factor",
            "model.mlp.swiglu_limit",
            "model.mlp.routing.selection",
        }
    )
    varies = frozenset(
        {
            "model.attention.compress",
            "model.attention.compress_rate",
            "model.mlp.routing.selection",
            "model.mlp.routing.correction_bias",
            *leaf_fields(RoPEConfig(), "model.position"),
        }
    )

    @staticmethod
    def full_rotary(cfg: ModelConfig) -> list[Problem]:
        return []  # it rotates the trailing qk_rope_head_dim of a head

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        hashed = cfg.mlp.kind == "moe" and cfg.mlp.routing.selection == "hash"
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.position.pairing", ("interleaved",), " (it rotates interleaved pairs)"),
            ("model.stream.kind", ("mhc",), " (its residual is mHC's streams)"),
            ("model.mlp.kind", ("moe",), " (every layer a mixture of experts)"),
            ("model.mlp.expert", ("swiglu",), " (its experts are SwiGLU)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            ("model.mlp.n_shared_experts", (1,), " (one shared expert, of moe_intermediate_size)"),
            ("model.mlp.routing.scoring", ("sqrtsoftplus", "sigmoid"), " (scoring_func)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (its routers always renormalise)"),
            ("model.mlp.routing.z_loss_weight", (0.0,), " (no router z-loss)"),
            ungrouped(),
            (
                "model.mlp.routing.correction_bias",
                (not hashed,),
                " (its top-k routers have e_score_correction_bias, its hash routers none)",
            ),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """A window on every layer, one for all; a clamp on the experts; one RoPE for the sliding layers,
        unscaled, and one for the compressing layers; one block size per compressor."""
        found = one_window(layers)
        for i, lc in enumerate(layers):
            kind = layer_kind(cfg, i)
            if lc.attention.window is None:
                why = f" ({self.title} slides a window in every layer: sliding_window)"
                found.append(Problem(kind_field(cfg, kind, "model.attention.window"), None, "a positive integer", why))
            if lc.mlp.kind == "moe" and lc.mlp.swiglu_limit is None:
                why = f" ({self.title} clamps its experts: swiglu_limit)"
                found.append(Problem(kind_field(cfg, kind, "model.mlp.swiglu_limit"), None, "a positive number", why))
            if lc.attention.compress == "none" and lc.position.scaling.kind != "none":
                why = f" ({self.title}'s sliding layers' RoPE is unscaled)"
                found.append(
                    Problem(kind_field(cfg, kind, "model.position.scaling.kind"), lc.position.scaling.kind, "none", why)
                )
        for group in (("none",), ("hca", "csa")):
            at = [i for i, lc in enumerate(layers) if lc.attention.compress in group]
            for i in at:
                if layers[i].position != layers[at[0]].position:
                    why = f" ({self.title} holds one RoPE for its {'sliding' if group == ('none',) else 'compressing'} layers)"
                    field = kind_field(cfg, layer_kind(cfg, i), "model.position.theta")
                    found.append(Problem(field, layers[i].position.theta, repr(layers[at[0]].position.theta), why))
        for compress in ("hca", "csa"):
            rates = [
                (i, lc.attention.compress_rate) for i, lc in enumerate(layers) if lc.attention.compress == compress
            ]
            for i, rate in rates:
                if rate != rates[0][1]:
                    why = f" ({self.title} holds one block size for its {compress} layers)"
                    field = kind_field(cfg, layer_kind(cfg, i), "model.attention.compress_rate")
                    found.append(Problem(field, rate, str(rates[0][1]), why))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        a, m = cfg.attention, cfg.mlp
        fraction = _fraction(a.head_dim, a.qk_rope_head_dim)
        sliding = next((lc for lc in layers if lc.attention.compress == "none"), cfg)
        compressing = next((lc for lc in layers if lc.attention.compress != "none"), cfg)
        # each compressor's block size: its layers', else (none of them) the model's for csa, V4's 128 for hca
        rates = {"csa": a.compress_rate, "hca": 128}
        rates |= {lc.attention.compress: lc.attention.compress_rate for lc in layers if lc.attention.compress != "none"}
        compress = rope_to_hf(compressing, fraction)
        if compressing.position.scaling.attention_factor is not None:
            compress["attention_factor"] = compressing.position.scaling.attention_factor
        main = {"rope_type": "default", "rope_theta": sliding.position.theta, "partial_rotary_factor": fraction}
        topk = next((lc for lc in layers if lc.mlp.routing.selection == "scores"), cfg).mlp.routing
        return dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=1,
            partial_rotary_factor=fraction,
            sliding_window=a.window,
            attention_dropout=a.dropout,
            attention_bias=False,
            layer_types=[TYPE_OF[lc.attention.compress] for lc in layers],
            compress_rates={TYPE_OF[t]: r for t, r in rates.items()},
            rope_theta=main["rope_theta"],
            compress_rope_theta=compress["rope_theta"],
            rope_parameters={"main": main, "compress": compress},
            hidden_act="silu",
            mlp_bias=False,
            moe_intermediate_size=expert_width(cfg),
            n_routed_experts=topk.n_experts,
            num_experts_per_tok=topk.top_k,
            n_shared_experts=1,
            scoring_func=topk.scoring,
            norm_topk_prob=True,
            routed_scaling_factor=topk.routed_scale,
            router_aux_loss_coef=topk.aux_loss_weight,
            swiglu_limit=m.swiglu_limit,
            mlp_layer_types=["hash_moe" if lc.mlp.routing.selection == "hash" else "moe" for lc in layers],
            hc_mult=cfg.stream.n,
            hc_sinkhorn_iters=cfg.stream.sinkhorn_iters,
            hc_eps=cfg.stream.eps,
            num_nextn_predict_layers=0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        for key, wanted in (("num_key_value_heads", 1), ("attention_bias", False), ("mlp_bias", False)):
            if getattr(c, key) != wanted:
                refuse_hf(c, key, f"{wanted} (archlab's dsv4 and experts)", getattr(c, key))
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's clamped SwiGLU experts)", c.hidden_act)
        if c.scoring_func not in ("sqrtsoftplus", "sigmoid"):
            refuse_hf(c, "scoring_func", "'sqrtsoftplus' or 'sigmoid'", c.scoring_func)
        hd = c.head_dim
        params = c.rope_parameters or {}
        main = params.get("main") or {}
        if main.get("rope_type", "default") != "default":
            refuse_hf(c, "rope_parameters.main.rope_type", "'default' (its sliding layers' RoPE is unscaled)", main)
        rotated = int(hd * c.partial_rotary_factor)
        attention = DSV4Config(
            qk_rope_head_dim=rotated,
            window=c.sliding_window,
            dropout=float(c.attention_dropout),
            compress_rate=c.compress_rates["compressed_sparse_attention"],
        )
        mlp = mlp_section(
            "moe",
            expert="swiglu",
            bias=False,
            expert_d_ff=c.moe_intermediate_size,
            n_shared_experts=1,
            swiglu_limit=float(c.swiglu_limit),
            routing=dict(
                n_experts=c.n_routed_experts,
                top_k=c.num_experts_per_tok,
                scoring=c.scoring_func,
                normalize_top_k=True,
                correction_bias=True,
                routed_scale=float(c.routed_scaling_factor),
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=RoPEConfig(theta=float(main.get("rope_theta", c.rope_theta)), pairing="interleaved"),
            attention=attention,
            mlp=mlp,
            stream=MHCConfig(n=c.hc_mult, sinkhorn_iters=c.hc_sinkhorn_iters, eps=float(c.hc_eps)),
        )
        cfg = self.keys_from_hf(c, cfg)
        compress_rope = dataclasses.asdict(_compress_rope(c, params.get("compress"), hd))
        hashed = dict(dataclasses.asdict(cfg.mlp.routing), selection="hash", correction_bias=False)
        names, overrides = [], {}
        for layer_type, mlp_type in zip(c.layer_types, c.mlp_layer_types):
            compress = LAYER_TYPES[layer_type]
            name = KIND_NAMES[compress] + "_hash" * (mlp_type == "hash_moe")
            over: dict[str, Any] = {}
            if compress != "none":
                rate = c.compress_rates[layer_type]
                over |= {"attention": {"compress": compress, "compress_rate": rate}}
                over["position"] = copy.deepcopy(compress_rope)  # each kind its own
            if mlp_type == "hash_moe":
                over["mlp"] = {"routing": dict(hashed)}
            names.append(name)
            overrides[name] = over
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
            a, ha = f"{b}.attn", f"{h}.self_attn"
            for ours, theirs in (("q_down", "q_a_proj"), ("q_norm", "q_a_norm"), ("q_up", "q_b_proj")):
                t.add(f"{a}.{ours}", f"{ha}.{theirs}")
            for ours, theirs in (
                ("kv_proj", "kv_proj"),
                ("kv_norm", "kv_norm"),
                ("o_a", "o_a_proj"),
                ("o_b", "o_b_proj"),
            ):
                t.add(f"{a}.{ours}", f"{ha}.{theirs}")
            t.maps.append(TensorMap(f"{a}.sinks", (f"{ha}.sinks",)))
            parts = [("compressor", "compressor")] * (lc.attention.compress != "none")
            parts += [("indexer", "compressor.indexer")] * (lc.attention.compress == "csa")
            for ours, theirs in parts:
                for name in ("kv_proj", "gate_proj", "kv_norm"):
                    t.add(f"{a}.{ours}.{name}", f"{ha}.{theirs}.{name}")
                t.maps.append(TensorMap(f"{a}.{ours}.position_bias", (f"{ha}.{theirs}.position_bias",)))
            if lc.attention.compress == "csa":
                t.add(f"{a}.indexer.q_up", f"{ha}.compressor.indexer.q_b_proj")
                t.add(f"{a}.indexer.head_weights", f"{ha}.compressor.indexer.scorer.weights_proj")
            mb, mh = f"{b}.mlp", f"{h}.mlp"
            t.add(f"{mb}.router", f"{mh}.gate")
            if lc.mlp.routing.selection == "hash":
                t.maps.append(TensorMap(f"{mb}.token_experts", (f"{mh}.gate.tid2eid",)))
            else:
                t.maps.append(TensorMap(f"{mb}.router_bias", (f"{mh}.gate.e_score_correction_bias",)))
            t.maps.append(TensorMap(f"{mb}.experts.gate_up", (f"{mh}.experts.gate_up_proj",)))
            t.maps.append(TensorMap(f"{mb}.experts.down", (f"{mh}.experts.down_proj",)))
            f, shared = expert_width(lc), f"{mh}.shared_experts"
            t.stacked(f"{mb}.shared.gate_up", [f"{shared}.gate_proj", f"{shared}.up_proj"], False, (f, f))
            t.add(f"{mb}.shared.down", f"{shared}.down_proj")
            for ours, theirs in (("attn_stream", "attn_hc"), ("mlp_stream", "ffn_hc")):
                for name in ("fn", "base", "scale"):
                    t.maps.append(TensorMap(f"{b}.{ours}.{name}", (f"{h}.{theirs}.{name}",)))
        t.add("final_norm", "model.norm")
        for name in ("hc_fn", "hc_base", "hc_scale"):
            t.maps.append(TensorMap(f"stream.{name}", (f"model.hc_head.{name}",)))
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A checkpoint (DeepSeek's names, which transformers saves under) as transformers holds it: each name
        renamed (``CHECKPOINT_NAMES``), each expert stacked; without the multi-token prediction layers
        (``mtp.*``, which transformers does not build)."""
        renamed = {}
        for name, tensor in state.items():
            if name.startswith(("mtp.", "model.mtp.")):
                continue
            for pattern, replacement in CHECKPOINT_NAMES:
                name = re.sub(pattern, replacement, name)
            renamed[name] = tensor
        return stack_saved_experts(cfg, renamed, ("w1", "w3", "w2"))


RECORDS: tuple[Family, ...] = (DeepseekV4(),)
