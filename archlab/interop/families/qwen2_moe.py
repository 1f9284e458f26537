"""Qwen2-MoE (``Qwen2MoeForCausalLM``; Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q, k and v biases,
none on o_proj, no QK-norm) over softmax-routed SwiGLU experts beside one shared SwiGLU expert times
``sigmoid(shared_expert_gate(x))`` (archlab's ``model.mlp.shared_expert_gate``); ``mlp_only_layers``
0 .. N-1 are archlab's first N layers of a dense kind."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import LAYERS, Family, Rule, out_bias
from archlab.interop.families.experts import dense_first, is_dense, with_dense_first
from archlab.interop.families.qwen3_next import Qwen3Next
from archlab.interop.families.softmax_moe import _Softmax
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class Qwen2Moe(_Softmax):
    """Qwen2MoeForCausalLM: see the module docstring. Its heads are d_model / n_head wide (no head_dim key);
    its sliding windows (``use_sliding_window``) are refused."""

    model_type, title, model_class, config_class = "qwen2_moe", "Qwen2-MoE", "Qwen2MoeForCausalLM", "Qwen2MoeConfig"
    parts = "Qwen2's layers with a softmax top-k MoE beside a sigmoid-gated shared expert, dense layers by a kind"
    features = (_Softmax.features - {"model.attention.window"}) | {"model.mlp.shared_expert_gate"} | LAYERS
    shared = "mlp.shared_expert"
    shared_experts = True  # transformers builds the shared expert whatever its width

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [r for r in super().rules(cfg) if r[0] != "model.mlp.n_shared_experts"]
        return rules + [
            ("model.mlp.expert", ("swiglu",), " (hidden_act, silu, is its experts' and its shared expert's)"),
            out_bias(False, " (o_proj has no bias)"),
            ("model.attention.head_dim", (cfg.d_model // cfg.attention.n_head,), " (it has no head_dim key)"),
            ("model.mlp.shared_expert_gate", (True,), " (its shared expert is always gated)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m, width = cfg.mlp, expert_width(cfg)
        out = super().to_hf(cfg)
        del out["sliding_window"]
        return dict(
            out,
            qkv_bias=cfg.attention.qkv_bias,
            use_sliding_window=False,
            num_experts=m.routing.n_experts,
            moe_intermediate_size=width,
            shared_expert_intermediate_size=m.n_shared_experts * width,
            intermediate_size=d_ff(cfg),
            norm_topk_prob=m.routing.normalize_top_k,
            decoder_sparse_step=1,
            mlp_only_layers=list(range(dense_first(layer_configs(cfg)))),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.use_sliding_window:
            refuse_hf(c, "use_sliding_window", "false (its windows on the layers below max_window_layers)")
        if c.decoder_sparse_step != 1:
            refuse_hf(c, "decoder_sparse_step", "1 (archlab's MoE layers are every layer after the dense ones)")
        dense = list(c.mlp_only_layers)
        if dense != list(range(len(dense))):
            refuse_hf(c, "mlp_only_layers", "the first N layers, [0, 1, ..., N-1] (archlab's dense layer kinds)")
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "silu (its experts are SwiGLU)")
        mlp = Qwen3Next.moe_from_hf(c, bool(c.norm_topk_prob), c.intermediate_size)  # the same MoE block
        cfg = with_dense_first(self.causal_from_hf(c, mlp), min(len(dense), c.num_hidden_layers))
        cfg.attention.window = None  # its config holds 0 where use_sliding_window is false
        cfg.attention.qkv_bias = bool(c.qkv_bias)
        return cfg

    def mlp_tensors(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        """_Softmax's, and the shared expert's gate (``shared_expert_gate``)."""
        super().mlp_tensors(t, lc, archlab, hf)
        if not is_dense(lc):
            t.add(f"{archlab}.shared_gate", f"{hf}.shared_expert_gate")


RECORDS: tuple[Family, ...] = (Qwen2Moe(),)
