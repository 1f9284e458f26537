"""The Hugging Face families archlab converts, one record (a ``base.Family``) each, a module per group:
``gpt`` (GPT-2, GPT-J), ``neox`` (GPT-NeoX, Phi), ``llama`` (LLaMA and its relatives), ``moe`` (Mixtral,
Qwen3-MoE, DeepSeek), ``layered`` (dense families whose layers differ), ``layered_moe`` (gpt-oss, Llama 4,
AFMoE), ``step`` (Step-3.5), ``falcon``, ``starcoder2`` (StarCoder 2), ``stablelm``, ``mamba`` (Mamba-2),
``qwen3_next`` (Qwen3-Next), ``qwen3_5`` (Qwen3.5's text decoders), ``lara_mini`` (Lara-Mini), ``bamba``
(Bamba), ``granitemoehybrid`` (Granite 4.0's hybrids), ``nemotron_h`` (Nemotron-H's dense layouts). ``FAMILIES`` holds them all by ``model_type``; adding a family is a record in its module (its config
keys copied as they are in ``keys``, the rest computed in ``to_hf`` and ``from_hf``; its tensor names in
``tensors``), a line here, and its tests. Shared parts: ``base`` (the record, tensor maps, ``FEATURES``),
``rope`` and ``windows`` (RoPE and sliding windows both ways), ``dense`` (the table that routes a layout)."""

from __future__ import annotations

from archlab.interop.families.aliases import ALIASES
from archlab.interop.families.arcee import ARCEE
from archlab.interop.families.bamba import BAMBA
from archlab.interop.families.base import Family
from archlab.interop.families.bigcode import BIGCODE
from archlab.interop.families.biogpt import BIOGPT
from archlab.interop.families.bloom import BLOOM
from archlab.interop.families.codegen import CODEGEN
from archlab.interop.families.cohere import COHERE
from archlab.interop.families.cohere2_moe import COHERE2_MOE
from archlab.interop.families.dbrx import DBRX
from archlab.interop.families.dense import DENSE
from archlab.interop.families.diffllama import DIFFLLAMA
from archlab.interop.families.dots import DOTS
from archlab.interop.families.ernie import ERNIE
from archlab.interop.families.falcon import FALCON
from archlab.interop.families.glm4 import GLM4
from archlab.interop.families.glm4_moe import GLM4_MOE
from archlab.interop.families.global_nope_moe import GLOBAL_NOPE_MOE
from archlab.interop.families.gpt_neo import GPT_NEO
from archlab.interop.families.granite import GRANITE
from archlab.interop.families.granite_variants import GRANITE_VARIANTS
from archlab.interop.families.granitemoehybrid import GRANITEMOEHYBRID
from archlab.interop.families.hunyuan import HUNYUAN
from archlab.interop.families.lara_mini import LARA_MINI
from archlab.interop.families.layered import LAYERED
from archlab.interop.families.layered_moe import LAYERED_SPARSE
from archlab.interop.families.mamba import MAMBA
from archlab.interop.families.mellum import MELLUM
from archlab.interop.families.minicpm3 import MINICPM3
from archlab.interop.families.minimax import MINIMAX
from archlab.interop.families.ministral import MINISTRAL
from archlab.interop.families.mla import MLA
from archlab.interop.families.moe import SPARSE
from archlab.interop.families.mpt import MPT
from archlab.interop.families.nanochat import NANOCHAT
from archlab.interop.families.nemotron import NEMOTRON
from archlab.interop.families.nemotron_h import NEMOTRON_H
from archlab.interop.families.olmo import OLMO
from archlab.interop.families.openai_gpt import OPENAI_GPT
from archlab.interop.families.opt import OPT
from archlab.interop.families.persimmon import PERSIMMON
from archlab.interop.families.phi3 import PHI3
from archlab.interop.families.qwen3_5 import QWEN3_5
from archlab.interop.families.qwen3_next import QWEN3_NEXT
from archlab.interop.families.relatives import RELATIVES
from archlab.interop.families.sigmoid_moe import SIGMOID_MOE
from archlab.interop.families.softmax_moe import SOFTMAX_MOE
from archlab.interop.families.stablelm import STABLELM
from archlab.interop.families.starcoder2 import STARCODER2
from archlab.interop.families.step import STEP

# by Hugging Face model_type; a later table's record replaces an earlier one's (hf_layered's Gemma 2, Qwen2,
# Qwen3 hold layouts whose layers differ); ``hf.family_of`` tries them in this order
FAMILIES: dict[str, Family] = {
    **DENSE,
    **SPARSE,
    **LAYERED,
    **LAYERED_SPARSE,
    **STEP,
    **GLM4,
    **ERNIE,
    **HUNYUAN,
    **MINISTRAL,
    **FALCON,
    **STARCODER2,
    **STABLELM,
    **DOTS,
    **GLM4_MOE,
    **MINIMAX,
    **ARCEE,
    **NEMOTRON,
    **OPT,
    **BIGCODE,
    **BLOOM,
    **PHI3,
    **COHERE,
    **GRANITE,
    **OLMO,
    **SOFTMAX_MOE,
    **DBRX,
    **SIGMOID_MOE,
    **MLA,
    **ALIASES,
    **RELATIVES,
    **GPT_NEO,
    **CODEGEN,
    **MPT,
    **PERSIMMON,
    **OPENAI_GPT,
    **BIOGPT,
    **NANOCHAT,
    **GRANITE_VARIANTS,
    **GLOBAL_NOPE_MOE,
    **MINICPM3,
    **MELLUM,
    **COHERE2_MOE,
    **MAMBA,
    **QWEN3_NEXT,
    **QWEN3_5,
    **LARA_MINI,
    **BAMBA,
    **GRANITEMOEHYBRID,
    **NEMOTRON_H,
    **DIFFLLAMA,
}
