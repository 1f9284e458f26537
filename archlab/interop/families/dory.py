"""NVIDIA's Dory (``DoryForCausalLM``): nGPT blocks (``model/block=ngpt``: L2-normed states moved toward each
normed sublayer by learned rates), unit queries and keys scaled by s_qk, an output gate with s_gate and an
L2-normed output, the s_u/s_v MLP with its product L2-normed, learned logit scales (s_z), local and global
layers each with their own RoPE, and a middle section of layers looped with the input injected at each pass
(``model.layers.loop`` with ``inject``)."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import (
    BlockConfig,
    HeadConfig,
    LayersConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.config.loop import looped
from archlab.config.model import LoopConfig
from archlab.interop.families.base import LAYERS, NO_HEAD_BIAS, Family, Problem, Rule
from archlab.interop.families.layered import Layer, LayeredFamily, per_type_rope, rope_per_type_to_hf
from archlab.interop.families.llama import LLAMA_KEYS, _LlamaStyle
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, sliding_to_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.ngpt import NGPTAttentionConfig
from archlab.nn.mlp import d_ff
from archlab.nn.ngpt_mlp import NGPTMLPConfig

EPS = 1e-6  # DoryL2Norm's, fixed (no config key)
PAIRED = re.compile(r"layers\.(\d+)\.(mixer|attn_alpha|mlp_alpha)(?=\.|$)")  # a released checkpoint's layer halves


class Dory(LayeredFamily, _LlamaStyle):
    """DoryForCausalLM: every layer an nGPT block whose norms are weightless L2 norms (eps 1e-6), its rates
    ``lambda_1``/``lambda_2`` stored at initializer_range and used × ngpt_alpha_init / initializer_range (and by
    their magnitude); attention with unit q and k per head, q × (sqk·√hd/initializer_range)² after RoPE, scores
    × hd^-0.5, the output gated by sigmoid(gate_proj(x)·(s_gate·d^¼/initializer_range)²) and L2-normed before
    o_proj; the MLP's gate and up × suv·√d, their SiLU product L2-normed before down_proj; logits ×
    logit_scale/initializer_range; sliding layers by ``layer_types`` with RoPE per layer type; layers
    ``n_input_layers`` to ``n_input_layers + n_recurrent_layers`` run ``n_recurrent_loops`` times, each pass from
    norm(h) + norm(e) (e the state entering the first), each pass with its own KV cache (``per_loop``)."""

    parts = "nGPT blocks and parts (L2 norms, learned rates and scales), gated attention, local/global RoPE, a loop"

    model_type, title, model_class, config_class = "dory", "Dory", "DoryForCausalLM", "DoryConfig"
    block = "ngpt"
    norms: dict[str, str] = {}  # weightless
    attention_kind = "ngpt"
    head_kinds = ("ngpt",)
    features = frozenset({"model.attention.window", "model.attention.scale", "model.attention.gate"}) | LAYERS
    rope_per_type = True
    keys = dict(LLAMA_KEYS)
    # the names of Dory's checkpoints, which transformers renames when loading and writes back when saving
    renames = {"backbone.embeddings.": "model.embed_tokens.", "backbone.": "model."}
    checks = (Family.full_rotary,)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        d, hd, r = cfg.d_model, head_dim(cfg), cfg.init_std
        why = f" (Dory's scaled parameters: stored at initializer_range={r})"
        return [
            ("model.norm.kind", ("l2",), ""),
            ("model.norm.eps", (EPS,), " (DoryL2Norm's, fixed)"),
            ("model.block.kind", ("ngpt",), ""),
            ("model.block.alpha_scale", (r,), why),
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qkv_bias", (False,), " (its gate_proj has no bias; attention_bias is refused)"),
            ("model.attention.out_bias", (False,), ""),
            ("model.attention.gate", ("elementwise",), " (gate_proj, one gate per head dim)"),
            ("model.attention.scale", (hd**-0.5,), " (scores × head_dim^-0.5)"),
            ("model.attention.qk_scale_init", (hd**0.5,), " (sqk's used value starts at √head_dim)"),
            ("model.attention.qk_scale_scale", (r,), why),
            ("model.attention.gate_scale_init", (d**0.25,), " (s_gate's used value starts at d_model^¼)"),
            ("model.attention.gate_scale_scale", (r,), why),
            ("model.attention.out_norm", (True,), " (attn_sub_norm)"),
            ("model.mlp.kind", ("ngpt",), ""),
            ("model.mlp.up_scale_init", (d**0.5,), " (suv_up × √d_model)"),
            ("model.mlp.up_scale_scale", (1.0,), ""),
            ("model.mlp.gate_scale_init", (None, d**0.5), " (suv_gate × √d_model)"),
            ("model.mlp.gate_scale_scale", (1.0,), ""),
            ("model.mlp.hidden_norm", (True,), " (ffn_sub_norm)"),
            ("model.head.scale_init", (1.0,), ""),
            ("model.head.scale_scale", (r,), why),
            NO_HEAD_BIAS,
        ]

    def problems(self, cfg: ModelConfig) -> list[Problem]:
        """Family's, but a loop: Dory's loops inject the input at each pass."""
        found = self.mixer_problems(cfg) or self.part_problems(cfg)
        if looped(cfg) and not cfg.layers.loop.inject:
            found.append(Problem("model.layers.loop.inject", False, "true", " (each pass starts from the input)"))
        return found

    # ---- Hugging Face -> archlab

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        ropes = per_type_rope(c, types, config_head_dim(c))
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t]) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        if c.recurrent_kv_cache_mode != "per_loop":
            refuse_hf(
                c, "recurrent_kv_cache_mode", "per_loop (a KV cache per pass; last_loop's shared cache is not held)"
            )
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "silu (archlab's ngpt MLP)")
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's gate would take the bias Dory's gate_proj has not)")
        hd, d, r = config_head_dim(c), c.hidden_size, c.initializer_range
        attention = NGPTAttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=hd,
            dropout=float(c.attention_dropout),
            scale=hd**-0.5,
            qk_scale_init=hd**0.5,
            qk_scale_scale=r,
            gate="elementwise",
            gate_scale_init=d**0.25,
            gate_scale_scale=r,
            out_norm=True,
        )
        mlp = NGPTMLPConfig(
            d_ff=c.intermediate_size,
            bias=bool(c.mlp_bias),
            up_scale_init=d**0.5,
            gate_scale_init=d**0.5,
            hidden_norm=True,
        )
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="l2", eps=EPS),
            block=BlockConfig(kind="ngpt", alpha_init=c.ngpt_alpha_init, alpha_scale=r),
            attention=attention,
            mlp=mlp,
            head=HeadConfig(kind="ngpt", bias=False, scale_scale=r),
        )
        return self.keys_from_hf(c, cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        n, start, inside, passes = c.num_hidden_layers, c.n_input_layers, c.n_recurrent_layers, c.n_recurrent_loops
        if inside and passes > 1:
            end = None if start + inside == n else start + inside
            loop = LoopConfig(start=start, end=end, passes=passes, inject=True)
            cfg.layers = LayersConfig(cfg.layers.kinds, cfg.layers.first, cfg.layers.pattern, loop=loop)
        return cfg

    # ---- archlab -> Hugging Face

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        return {
            **self.keys_to_hf(rep),
            "intermediate_size": d_ff(rep),
            "num_key_value_heads": n_kv_head(rep),
            "head_dim": head_dim(rep),
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": rep.attention.dropout,
            "mlp_bias": rep.mlp.bias,
            "ngpt_alpha_init": rep.block.alpha_init,
            "recurrent_kv_cache_mode": "per_loop",
        }

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        """The layer types, windows and RoPE per type, and the loop: its layers as the recurrent section (with
        no loop, every layer an input layer and no recurrent one)."""
        inside = looped(cfg)
        loop = (
            dict(n_input_layers=cfg.n_layer, n_recurrent_layers=0, n_output_layers=0, n_recurrent_loops=1)
            if not inside
            else dict(
                n_input_layers=inside.start,
                n_recurrent_layers=len(inside),
                n_output_layers=cfg.n_layer - inside.stop,
                n_recurrent_loops=cfg.layers.loop.passes,
            )
        )
        return dict(**sliding_to_hf(cfg, lcs), rope_parameters=rope_per_type_to_hf(lcs), **loop)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A checkpoint's tensors by the model's names (after ``renames``): the gate's ``g_proj`` is
        ``gate_proj``; a released checkpoint's layers in pairs (``layers.2i`` attention, ``layers.2i+1`` the
        MLP, each ``mixer``; ``attn_alpha``, ``mlp_alpha``) are one layer each (transformers' ``LayerPairCollapse``)."""

        def renamed(name: str) -> str:
            if (match := PAIRED.search(name)) is not None:
                index, part = int(match[1]), match[2]
                part = {"attn_alpha": "lambda_1", "mlp_alpha": "lambda_2"}.get(part, ("self_attn", "mlp")[index % 2])
                name = f"{name[: match.start()]}layers.{index // 2}.{part}{name[match.end() :]}"
            return name.replace(".self_attn.g_proj.", ".self_attn.gate_proj.")

        return {renamed(k): v for k, v in state.items()}

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers():
            a, ha, m, hm = f"{b}.attn", f"{h}.self_attn", f"{b}.mlp", f"{h}.mlp"
            t.qkv(f"{a}.qkv", ha, False)
            t.add(f"{a}.gate", f"{ha}.gate_proj")
            t.add(f"{a}.proj", f"{ha}.o_proj")
            t.gate_up(f"{m}.gate_up", hm, lc.mlp.bias)
            t.add(f"{m}.down", f"{hm}.down_proj", lc.mlp.bias)
            vectors = {
                f"{a}.qk_scale": f"{ha}.sqk",
                f"{a}.gate_scale": f"{ha}.s_gate",
                f"{m}.up_scale": f"{hm}.suv_up",
                f"{m}.gate_scale": f"{hm}.suv_gate",
                f"{b}.attn_alpha": f"{h}.lambda_1",
                f"{b}.mlp_alpha": f"{h}.lambda_2",
            }
            t.maps += [TensorMap(f"{ours}.weight", (theirs,)) for ours, theirs in vectors.items()]
        t.maps.append(TensorMap("head.s_z.weight", ("lm_head.logit_scale",)))
        return t.head()


RECORDS: tuple[Family, ...] = (Dory(),)
