"""DBRX (``DbrxForCausalLM``): pre-norm LayerNorms without bias, a fused ``Wqkv`` clamped to ±``clip_qkv``
(before RoPE, as archlab clamps), GQA, and a softmax top-k MoE of SiLU-gated experts in every layer whose
experts are stored flat (``w1``, ``v1``, ``w2``: [E·f, d] each)."""

from __future__ import annotations

from typing import Any

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.interop.families.base import Family, Rule, out_bias
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.mpt import MPT_KEYS
from archlab.interop.families.phi3 import head_dim_rule
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.softmax_moe import _Softmax, replaced
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.moe import expert_width

EPS = 1e-5  # nn.LayerNorm's default, which DBRX's norms keep


class Dbrx(_Softmax):
    """DbrxForCausalLM: see the module docstring. ``moe_normalize_expert_weights`` divides the top-k
    weights by their p-norm: p = 1 is archlab's renormalisation, null none; other p are refused, as are
    router jitter (``moe_jitter_eps``), any activation but SiLU and a tied head (DBRX refuses one)."""

    model_type, title, model_class, config_class = "dbrx", "DBRX", "DbrxForCausalLM", "DbrxConfig"
    keys = MPT_KEYS  # DBRX refuses a tied head
    prefix = "transformer."
    features = frozenset({"model.position.scaling.kind", "model.attention.clip_qkv"})
    parts = "bias-free LayerNorms, fused Wqkv with clip_qkv, GQA, a softmax top-k MoE of SwiGLU experts"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return replaced(
            super().rules(cfg),
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (False,), " (its LayerNorms have no bias)"),
            ("model.norm.eps", (EPS,), " (its LayerNorm eps is fixed)"),
            ("model.mlp.expert", ("swiglu",), " (ffn_act_fn silu: SiLU-gated experts)"),
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.head.tied", (False,), " (DBRX refuses tie_word_embeddings)"),
            head_dim_rule(cfg, self.title),
        )

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a, m = cfg.attention, cfg.mlp
        return dict(
            self.keys_to_hf(cfg),
            resid_pdrop=0.0,
            emb_pdrop=0.0,
            tie_word_embeddings=False,
            rope_parameters=rope_to_hf(cfg),
            # its attention reads attn_config.rope_theta (unused: the rotary reads rope_parameters)
            attn_config=dict(
                attn_pdrop=a.dropout, clip_qkv=a.clip_qkv, kv_n_heads=n_kv_head(cfg), rope_theta=cfg.position.theta
            ),
            ffn_config=dict(
                ffn_act_fn={"name": "silu"},
                ffn_hidden_size=expert_width(cfg),
                moe_num_experts=m.routing.n_experts,
                moe_top_k=m.routing.top_k,
                moe_jitter_eps=None,
                moe_loss_weight=m.routing.aux_loss_weight,
                moe_normalize_expert_weights=1.0 if m.routing.normalize_top_k else None,
            ),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        attn, ffn = c.attn_config, c.ffn_config
        for name in ("resid_pdrop", "emb_pdrop"):
            if getattr(c, name):
                refuse_hf(c, name, "0.0 (archlab's DBRX record drops nothing)")
        if ffn.ffn_act_fn != {"name": "silu"}:
            refuse_hf(c, "ffn_config.ffn_act_fn", "{'name': 'silu'} (SiLU-gated experts)", ffn.ffn_act_fn)
        if ffn.moe_jitter_eps:
            refuse_hf(c, "ffn_config.moe_jitter_eps", "null (archlab's router has no input jitter)", ffn.moe_jitter_eps)
        p = ffn.moe_normalize_expert_weights
        if p not in (None, 1, 1.0):
            refuse_hf(
                c, "ffn_config.moe_normalize_expert_weights", "1.0 (archlab renormalises to sum 1) or null (none)", p
            )
        hd = c.d_model // c.n_heads
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="layernorm", eps=EPS, bias=False),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=False, scalings=self.rope_types()),
            attention=AttentionConfig(
                n_kv_head=attn.kv_n_heads,
                qkv_bias=False,
                out_bias=False,
                dropout=float(attn.attn_pdrop),
                clip_qkv=None if attn.clip_qkv is None else float(attn.clip_qkv),
            ),
            mlp=mlp_section(
                "moe",
                expert="swiglu",
                bias=False,
                expert_d_ff=ffn.ffn_hidden_size,
                routing=dict(
                    n_experts=ffn.moe_num_experts,
                    top_k=ffn.moe_top_k,
                    normalize_top_k=p is not None,
                    aux_loss_weight=float(ffn.moe_loss_weight),
                ),
            ),
            head=HeadConfig(tied=False, bias=False),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, E = Tensors(cfg), cfg.mlp.routing.n_experts
        t.add("tok_emb", "transformer.wte")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.blocks.{i}"
            t.add(f"{b}.attn_norm", f"{h}.norm_attn_norm.norm_1")
            t.add(f"{b}.attn.qkv", f"{h}.norm_attn_norm.attn.Wqkv")
            t.add(f"{b}.attn.proj", f"{h}.norm_attn_norm.attn.out_proj")
            t.add(f"{b}.mlp_norm", f"{h}.norm_attn_norm.norm_2")
            t.add(f"{b}.mlp.router", f"{h}.ffn.router.layer")
            experts = f"{h}.ffn.experts.mlp"
            t.maps.append(
                TensorMap(f"{b}.mlp.experts.gate_up", (f"{experts}.w1", f"{experts}.v1"), "experts_flat", (E,))
            )
            t.maps.append(TensorMap(f"{b}.mlp.experts.down", (f"{experts}.w2",), "experts_flat_transposed", (E,)))
        t.add("final_norm", "transformer.norm_f")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Any]) -> dict[str, Any]:
        """DBRX's checkpoints hold its tensors as the model does."""
        return state


RECORDS: tuple[Family, ...] = (Dbrx(),)
