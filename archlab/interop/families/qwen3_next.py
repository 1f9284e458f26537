"""Qwen3-Next (``Qwen3NextForCausalLM``): pre-norm layers of (1 + w) RMSNorms, each mixing tokens by gated
attention or by Gated DeltaNet as ``layer_types`` says, then a softmax top-k MoE beside a shared expert times
``sigmoid(shared_expert_gate(x))`` (or a dense SwiGLU on ``mlp_only_layers`` and off ``decoder_sparse_step``).

Its attention (``full_attention``) is Qwen3's (GQA, per-head QK-norm, here (1 + w) as every norm) with
half-paired partial RoPE and an elementwise output gate: ``q_proj`` holds per head its query rows, then its
gate's, which archlab holds in ``attn.gate`` (the ``gated_queries`` layouts). Its Gated DeltaNet
(``linear_attention``) is archlab's ``gated_deltanet``; ``in_proj_qkvz`` and ``in_proj_ba`` hold per key
head its q, k and the v, z, b, a rows of the value heads it serves, which archlab's one ``in_proj`` holds kind
by kind (the ``deltanet_grouped`` layout); its gated norm is a plain w. In archlab the model's own parts are
the attention layers' and each layer is of a kind, ``model.layers``: ``deltanet`` (the causal fields
gated_deltanet refuses reset, as ``model/layers=deltanet_3_1``, and the linear sizes), ``attention``, and
``_dense`` beside either for a dense layer; the first layers in ``first`` and the rest in a cycled
``pattern``, the shortest pair that gives every layer its kind (the layer parts Qwen3.5 and Lara-Mini share
in ``deltanet``). A checkpoint's multi-token-prediction layer (``mtp.*``) is no part of the causal LM: read and
written beside it (``families/mtp.py``) where the files hold it, else left out on loading, as transformers
leaves it."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, HeadConfig, MLPConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import (
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
    ungrouped,
)
from archlab.interop.families.deltanet import (
    FULL,
    LINEAR,
    cfg_types,
    deltanet_layers,
    deltanet_tensors_grouped,
    gated_attention_tensors,
    is_deltanet,
    linear_keys,
    linear_layer_problems,
)
from archlab.interop.families.experts import dense_tensors, stack_saved_experts
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import dense_of, mlp_section, shared_experts
from archlab.interop.families.mtp import MTP_FEATURES, MTP_RULE
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


def moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The MoE's keys (Qwen3.5's dense text decoders have none)."""
    m, width = cfg.mlp, expert_width(cfg)
    return dict(
        decoder_sparse_step=1,
        mlp_only_layers=[i for i, lc in enumerate(layer_configs(cfg)) if lc.mlp.kind != "moe"],
        num_experts=m.routing.n_experts,
        num_experts_per_tok=m.routing.top_k,
        moe_intermediate_size=width,
        shared_expert_intermediate_size=m.n_shared_experts * width,
        norm_topk_prob=m.routing.normalize_top_k,
        router_aux_loss_coef=m.routing.aux_loss_weight,
    )


class Qwen3Next(Family):
    """Qwen3NextForCausalLM: see the module docstring."""

    mixer_kinds = ("gated_deltanet",)
    deltanet_tensors = staticmethod(deltanet_tensors_grouped)  # its Gated DeltaNet's projections (``deltanet``)
    output_gates: tuple[str, ...] = ("silu",)  # its linear layers' output gates (deltanet.linear_layer_problems)

    model_type, title, model_class, config_class = "qwen3_next", "Qwen3-Next", "Qwen3NextForCausalLM", "Qwen3NextConfig"
    prefix = "model."
    parts = (
        "gated attention (partial RoPE, (1 + w) QK-norm) and Gated DeltaNet layers, (1 + w) RMSNorms, softmax MoE "
        "with a sigmoid-gated shared expert, dense layers by a kind"
    )
    features = (
        frozenset(
            {
                "model.norm.unit_offset",
                "model.attention.qk_norm",
                "model.attention.gate",
                "model.mlp.shared_expert_gate",
                "model.layers.first",
                "model.layers.pattern",
            }
        )
        | MTP_FEATURES
    )
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}
    # its checkpoints' multi-token prediction layer, mtp.* (a full-attention MoE layer), read and written
    mtp_keys, mtp_scheme = ("mtp_num_hidden_layers", "num_nextn_predict_layers"), "mtp"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.norm.unit_offset", (True,), " (Qwen3NextRMSNorm scales by 1 + w)"),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            ("model.attention.gate", ("elementwise",), " (q_proj holds each head's query and its output gate)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.kind", ("moe",), ""),
            ("model.mlp.expert", ("swiglu",), " (hidden_act, silu, is also its linear layers' convolution's)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.shared_expert_gate", (True,), " (its shared expert is always gated)"),
            MTP_RULE,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (its attention layers'), then what its layer kinds
        set that Qwen3-Next cannot hold: a linear layer whose sizes differ from the first one's, an attention
        layer whose attention or RoPE differs from the model's, a MoE layer whose MLP differs from the model's,
        a dense layer of another kind than the experts' (each named as the layer's kind sets it)."""
        found = super().part_problems(cfg)
        if shared_experts(cfg.mlp) < 1:
            why = " (its MoE layers always have a shared expert)"
            found.append(Problem("model.mlp.n_shared_experts", shared_experts(cfg.mlp), "at least 1", why))
        dense_mlp = dense_of(cfg.mlp)
        return found + self.layer_problems(cfg, dense_mlp, "dense layers of its experts' kind and d_ff")

    def layer_problems(self, cfg: ModelConfig, dense_mlp: MLPConfig, dense_why: str) -> list[Problem]:
        """What its layer kinds set that the family cannot hold, each named as the layer's kind sets it: a
        linear layer whose sizes differ from the first one's, an attention layer whose attention or RoPE
        differs from the model's, a MoE layer whose MLP differs from the model's, a dense layer whose MLP
        differs from ``dense_mlp`` (``dense_why``: why, in the refusal)."""
        lcs = layer_configs(cfg)
        linear = next((lc.attention for lc in lcs if is_deltanet(lc)), None)
        layered: list[Problem] = []
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            wanted: list[tuple[str, Any, Any, str]]
            if is_deltanet(lc):
                wanted = [("attention", lc.attention, linear, "one set of linear-attention sizes for every such layer")]
            else:
                why = "one attention and RoPE for every attention layer"
                wanted = [("attention", lc.attention, cfg.attention, why), ("position", lc.position, cfg.position, why)]
            dense = lc.mlp.kind != "moe"
            why = dense_why if dense else "one MoE for every MoE layer"
            wanted.append(("mlp", lc.mlp, dense_mlp if dense else cfg.mlp, why))
            layered.extend(section_problems(cfg, kind, wanted, self.title))
            if is_deltanet(lc):
                layered.extend(linear_layer_problems(cfg, kind, lc, self.output_gates))
        return first_per_field(layered)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        out = dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            hidden_act="silu",
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            attention_bias=cfg.attention.qkv_bias,
            attention_dropout=cfg.attention.dropout,
            layer_types=[LINEAR if is_deltanet(lc) else FULL for lc in lcs],
            mtp_num_hidden_layers=cfg.head.mtp.depth,
        )
        return out | (moe_to_hf(cfg) if cfg.mlp.kind == "moe" else {}) | linear_keys(lcs)

    def from_hf(self, c: Any) -> ModelConfig:
        self.check_hf(c)
        if c.num_experts < 1:
            refuse_hf(c, "num_experts", "at least 1 (archlab's Qwen3-Next layers are MoE but for dense kinds)")
        if not isinstance(c.decoder_sparse_step, int) or c.decoder_sparse_step < 1:
            refuse_hf(c, "decoder_sparse_step", "a positive integer (layer i is MoE where (i + 1) % step == 0)")
        mlp = self.moe_from_hf(c, bool(c.norm_topk_prob), c.intermediate_size)
        cfg = self.common_from_hf(c, mlp)
        only = set(c.mlp_only_layers)
        deltanet_layers(c, cfg, [i in only or bool((i + 1) % c.decoder_sparse_step) for i in range(len(cfg_types(c)))])
        return cfg

    def check_hf(self, c: Any) -> None:
        """Refuse an activation other than SiLU, a layer type other than its two, and key heads that do
        not divide the value heads."""
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU experts; its linear layers' convolution is SiLU'd)")
        types = cfg_types(c)
        if len(types) != c.num_hidden_layers or set(types) - {LINEAR, FULL}:
            refuse_hf(c, "layer_types", f"num_hidden_layers entries, each '{LINEAR}' or '{FULL}'", types)
        if LINEAR in types and c.linear_num_value_heads % c.linear_num_key_heads:
            refuse_hf(c, "linear_num_key_heads", "a divisor of linear_num_value_heads (each serves a group of them)")

    @staticmethod
    def moe_from_hf(c: Any, normalize: bool, width: int | None) -> Any:
        """Its softmax top-k MoE of SwiGLU experts beside a sigmoid-gated shared expert (``width``: the dense
        layers' d_ff, None where it has none)."""
        f, shared = c.moe_intermediate_size, c.shared_expert_intermediate_size
        if shared < f or shared % f:
            refuse_hf(
                c,
                "shared_expert_intermediate_size",
                f"a positive multiple of moe_intermediate_size={f} (archlab's shared experts: n·expert_d_ff)",
            )
        return mlp_section(
            "moe",
            expert="swiglu",
            approximate="none",
            bias=False,
            d_ff=width,
            expert_d_ff=f,
            n_shared_experts=shared // f,
            shared_expert_gate=True,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                normalize_top_k=normalize,
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )

    def common_from_hf(self, c: Any, mlp: MLPConfig, rope_ignored: frozenset[str] = frozenset()) -> ModelConfig:
        """The model's own parts (its gated attention, RoPE, (1 + w) norms) beside ``mlp``, and ``keys``
        (``rope_ignored``: rope_parameters keys that change nothing archlab holds)."""
        hd, bias = config_head_dim(c), bool(c.attention_bias)
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads,
            head_dim=hd,
            qkv_bias=bias,
            out_bias=bias,
            dropout=float(c.attention_dropout),
            qk_norm="head",
            gate="elementwise",
        )
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm", unit_offset=True),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=True, scalings=("default",), ignored=rope_ignored),
            attention=attention,
            mlp=mlp,
            head=HeadConfig(bias=False),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm"):
            if is_deltanet(lc):
                self.deltanet_tensors(t, lc, f"{b}.attn", f"{h}.linear_attn")
            else:
                gated_attention_tensors(t, lc, f"{b}.attn", f"{h}.self_attn")
            if lc.mlp.kind == "moe":
                self.moe_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
            else:
                dense_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()

    @staticmethod
    def moe_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        """The router (``gate``), the stacked experts, the shared expert and its gate."""
        width = lc.mlp.n_shared_experts * expert_width(lc)
        t.add(f"{archlab}.router", f"{hf}.gate")
        t.maps.append(TensorMap(f"{archlab}.experts.gate_up", (f"{hf}.experts.gate_up_proj",)))
        t.maps.append(TensorMap(f"{archlab}.experts.down", (f"{hf}.experts.down_proj",)))
        shared = f"{hf}.shared_expert"
        t.stacked(f"{archlab}.shared.gate_up", [f"{shared}.gate_proj", f"{shared}.up_proj"], False, (width, width))
        t.add(f"{archlab}.shared.down", f"{shared}.down_proj")
        t.add(f"{archlab}.shared_gate", f"{hf}.shared_expert_gate")

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The multi-token-prediction layer (``mtp.*``) left out; each MoE layer's saved experts stacked."""
        return stack_saved_experts(cfg, {k: v for k, v in state.items() if not k.startswith("mtp.")})


RECORDS: tuple[Family, ...] = (Qwen3Next(),)
