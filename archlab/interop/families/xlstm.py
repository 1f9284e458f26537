"""xLSTM (xLSTMForCausalLM, NX-AI/xLSTM-7b): every block an RMSNorm and the mLSTM (``attention.kind: mlstm``),
then an RMSNorm and a SwiGLU feedforward; a final RMSNorm; logits soft-capped; no positions."""

from __future__ import annotations

from typing import Any

from archlab.config import POSITION_OPTIONS, BlockConfig, HeadConfig, ModelConfig, NormConfig
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mlstm import MLSTMConfig, dims
from archlab.nn.mlp import d_ff

MULTIPLES = (64, 1)  # ffn_round_up_to_multiple_of written back: xLSTM's 64 where it gives d_ff, else 1


def round_up(x: float, multiple: int) -> int:
    """transformers' ``round_up_to_next_multiple_of``, as it computes it (in floats)."""
    return int(((x + multiple - 1) // multiple) * multiple)


def factor(width: int, d: int) -> float:
    """The factor of ``d`` a width is written as (qk_dim_factor, v_dim_factor, ffn_proj_factor)."""
    return width / d


class XLSTM(Family):
    """xLSTMForCausalLM with transformers' own (native torch) kernels: pre-norm blocks of an RMSNorm and
    ``xLSTMLayer`` (q, k, v and ogate_preact the mixer's in-projection rows, igate_preact and fgate_preact its
    gates, the multi-head norm, out_proj), an RMSNorm and ``xLSTMFeedForward`` (proj_up_gate, proj_up: the
    SwiGLU's gate and up rows; proj_down); a final RMSNorm (``out_norm``, applied whatever ``add_out_norm``
    says); the head its own (transformers ties no weights of it, whatever ``tie_word_embeddings``), soft-capped by ``output_logit_soft_cap``. transformers ignores the
    attention mask: a padded position enters its state, not archlab's."""

    parts = "pre-norm RMSNorm, mLSTM (matrix memory, exponential gates), SwiGLU, logit soft-cap, no positions"

    model_type, title, model_class, config_class = "xlstm", "xLSTM", "xLSTMForCausalLM", "xLSTMConfig"
    prefix = "backbone."
    attention_kind = "mlstm"
    position_kind = "none"
    position_why = " (xLSTM has no positions: its recurrence orders the tokens)"
    features = frozenset({"model.head.softcap"})
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_heads": "attention.n_head",
        "norm_eps": "norm.eps",
        "eps": "attention.eps",
        "gate_soft_cap": "attention.gate_soft_cap",
        "chunk_size": "attention.scan_chunk",
        "output_logit_soft_cap": "head.softcap",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        d, (dk, dv), H = cfg.d_model, dims(cfg), cfg.attention.n_head
        widths = [w for w in (H * dk, H * dv) if int(d * factor(w, d)) != w]
        ff = d_ff(cfg)
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.attention.bias", (False,), " (with use_bias xLSTM's RMSNorms take a bias, archlab's none)"),
            *(
                [("model.attention.qk_head_dim", (None,), f" (xLSTM's widths are int(hidden_size·factor): {widths})")]
                if widths
                else []
            ),
            ("model.mlp.kind", ("swiglu",), " (xLSTMFeedForward: silu(proj_up_gate)·proj_up)"),
            ("model.mlp.bias", (False,), " (with use_bias the norms take a bias too)"),
            *(
                []
                if any(round_up(d * factor(ff, d), m) == ff for m in MULTIPLES)
                else [("model.mlp.d_ff", (None,), " (xLSTM's is rounded from hidden_size·ffn_proj_factor)")]
            ),
            NO_HEAD_BIAS,
            ("model.head.tied", (False,), " (xLSTMForCausalLM ties no weights, whatever tie_word_embeddings says)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.part_problems``, then the two soft caps, which xLSTMConfig holds as floats (never None)."""
        found = super().part_problems(cfg)
        for field, value, key in (
            ("model.attention.gate_soft_cap", cfg.attention.gate_soft_cap, "gate_soft_cap"),
            ("model.head.softcap", cfg.head.softcap, "output_logit_soft_cap"),
        ):
            if value is None:
                found.append(Problem(field, None, "a positive number", f" (xLSTMConfig's {key} is a float)"))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        d, (dk, dv), H, ff = cfg.d_model, dims(cfg), cfg.attention.n_head, d_ff(cfg)
        multiple = next(m for m in MULTIPLES if round_up(d * factor(ff, d), m) == ff)
        return dict(
            self.keys_to_hf(cfg),
            num_blocks=cfg.n_layer,
            embedding_dim=d,
            use_bias=False,
            add_out_norm=True,
            qk_dim_factor=factor(H * dk, d),
            v_dim_factor=factor(H * dv, d),
            ffn_proj_factor=factor(ff, d),
            ffn_round_up_to_multiple_of=multiple,
            weight_mode="single",
            tie_word_embeddings=False,
            mode="inference",
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.use_bias:
            refuse_hf(c, "use_bias", "false (it gives xLSTM's RMSNorms a bias, which archlab's have not)")
        if c.weight_mode != "single":
            why = "'single' ('fused' is not read: transformers 5.24 cannot build it, its _init_weights failing)"
            refuse_hf(c, "weight_mode", why)
        d, H = c.hidden_size, c.num_heads
        qk, v = int(d * c.qk_dim_factor), int(d * c.v_dim_factor)
        for name, width in (("qk_dim_factor", qk), ("v_dim_factor", v)):
            if width % H or width < H:
                refuse_hf(
                    c, name, f"one giving a positive multiple of num_heads={H} (int(hidden_size·factor) is {width})"
                )
        dv, dk = v // H, qk // H
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=MLSTMConfig(
                head_dim=None if dv == d // H and d % H == 0 else dv,
                qk_head_dim=None if dk == dv // 2 else dk,
            ),
            mlp=mlp_section("swiglu", d_ff=round_up(d * c.ffn_proj_factor, c.ffn_round_up_to_multiple_of), bias=False),
            head=HeadConfig(bias=False, tied=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.eps, cfg.attention.gate_soft_cap = float(c.eps), float(c.gate_soft_cap)
        cfg.head.softcap = float(c.output_logit_soft_cap)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, (dk, dv), H, ff = Tensors(cfg), dims(cfg), cfg.attention.n_head, d_ff(cfg)
        t.add("tok_emb", "backbone.embeddings")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"backbone.blocks.{i}"
            layer = f"{h}.mlstm_layer"
            t.add(f"{b}.attn_norm", f"{h}.norm_mlstm")
            rows = [f"{layer}.{n}" for n in ("q", "k", "v", "ogate_preact")]
            t.stacked(f"{b}.attn.in_proj", rows, False, (H * dk, H * dk, H * dv, H * dv))
            gates = tuple(f"{layer}.{n}gate_preact" for n in "if")
            t.maps.append(TensorMap(f"{b}.attn.gate_weight", tuple(f"{g}.weight" for g in gates), "stacked", (H, H)))
            t.maps.append(TensorMap(f"{b}.attn.gate_bias", tuple(f"{g}.bias" for g in gates), "stacked", (H, H)))
            t.maps.append(TensorMap(f"{b}.attn.norm_weight", (f"{layer}.multihead_norm.weight",)))
            t.add(f"{b}.attn.proj", f"{layer}.out_proj")
            t.add(f"{b}.mlp_norm", f"{h}.norm_ffn")
            t.stacked(f"{b}.mlp.gate_up", [f"{h}.ffn.proj_up_gate", f"{h}.ffn.proj_up"], False, (ff, ff))
            t.add(f"{b}.mlp.down", f"{h}.ffn.proj_down")
        t.add("final_norm", "backbone.out_norm")
        return t.head()


RECORDS: tuple[Family, ...] = (XLSTM(),)
