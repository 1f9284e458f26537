"""CodeGen (``CodeGenForCausalLM``): GPT-J's layers, q, k and v fused in ``qkv_proj`` as four shards, each its
slice of q, then of v, then of k (the ``qvk_sharded`` tensor layout)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem
from archlab.interop.families.gpt import GPTJ
from archlab.interop.families.tensors import TensorMap, Tensors

MP_NUM = 4  # CodeGenAttention's shards of qkv_proj, fixed in transformers


class CodeGen(GPTJ):
    """CodeGenForCausalLM: GPT-J's parallel block with one shared LayerNorm, interleaved partial RoPE (base
    10⁴), bias-free attention and a head bias; its one ``qkv_proj`` splits into 4 shards of d_model / 4 * 3
    rows, [q | v | k] each, so d_model must divide by 4. GPT-J's record converts the same layouts; this
    one reads and writes CodeGen's checkpoints."""

    model_type, title, model_class, config_class = "codegen", "CodeGen", "CodeGenForCausalLM", "CodeGenConfig"
    parts = "GPT-J's parts (parallel block, shared LayerNorm, interleaved partial RoPE), q/v/k fused in 4 shards"

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if cfg.d_model % MP_NUM:
            why = f" (qkv_proj is split in {MP_NUM} shards of q, v and k)"
            found.append(Problem("model.d_model", cfg.d_model, f"a multiple of {MP_NUM}", why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), n_ctx=cfg.context_length)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.add(f"{b}.attn.qkv", f"{h}.attn.qkv_proj", layout="qvk_sharded", sizes=(MP_NUM,))
            t.add(f"{b}.attn.proj", f"{h}.attn.out_proj")
            t.add(f"{b}.mlp.fc", f"{h}.mlp.fc_in", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.fc_out", True)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


RECORDS: tuple[Family, ...] = (CodeGen(),)
