"""The transformers causal-LM families archlab does not convert, each with the first part it lacks.

``REFUSED`` holds the decoder-only language models by ``model_type``: ``missing`` names, in archlab's terms,
the first part of the family's transformers modeling code that no archlab part (``docs/models.md``) holds,
with the config field or module that shows it, so a refusal can say why rather than only that the
``model_type`` is unknown. A family archlab's parts could hold exactly but that has no record yet reads
``no archlab record yet (holdable: ...)``. Vision-language wrappers whose text decoder is a causal LM are
here too, naming what their text decoder lacks; ``WRAPPED`` holds those whose text config a record holds,
which ``from_hf`` and ``load_hf_dir`` read as that language model alone (``interop/wrapped.py``).
``NOT_DECODER`` holds the ``model_type``s whose causal-LM class is the decoder of an encoder-decoder or
masked-LM model, or a model that only runs with images, audio or another model's states: no decoder-only
record could hold them. Read from transformers 5.24's ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``."""

from __future__ import annotations

from typing import NamedTuple


class Refused(NamedTuple):
    """A transformers causal-LM family archlab does not convert, and why."""

    title: str  # "Qwen3-Next"
    model_class: str  # "Qwen3NextForCausalLM"
    missing: str  # what archlab lacks, in archlab's terms, naming the HF config field / module that shows it


REFUSED: dict[str, Refused] = {
    # linear-attention, state-space, recurrent and convolution mixers
    "zaya": Refused(
        "ZAYA",
        "ZayaForCausalLM",
        "compressed convolutional attention (`ZayaCCAProjection`, `cca_time0`): no archlab mixer",
    ),
    # sparse and compressed attention
    "minimax_m3_vl_text": Refused(
        "MiniMax-M3 (text)",
        "MiniMaxM3VLForCausalLM",
        "block-sparse attention picked by an indexer (`minimax_m3_sparse` layers, `index_topk_blocks`)",
    ),
    "doge": Refused(
        "Doge",
        "DogeForCausalLM",
        "dynamic-mask attention: a learned per-head key mask (`dt_proj`, `A`, `keep_window_size`)",
    ),
    # attention archlab's `causal` and `mla` do not compute
    "inkling_text": Refused(
        "Inkling",
        "InklingForCausalLM",
        "relative position logits conditioned on the hidden states (`d_rel`, `rel_extent`)",
    ),
    "inkling2_text": Refused(
        "Inkling 2",
        "Inkling2ForCausalLM",
        "short convolutions on keys and values (`k_proj.sconv`) and a relative position bias (`d_rel`)",
    ),
    "inkling2_loop_text": Refused(
        "Inkling 2 Loop",
        "Inkling2LoopForCausalLM",
        "layers run again in loops (`loop_num_passes`) over Inkling 2's convolved keys and relative position bias",
    ),
    "cpmant": Refused(
        "CPM-Ant",
        "CpmAntForCausalLM",
        "bucketed relative position bias (`position_bias_num_buckets`) and segment/prompt embeddings",
    ),
    "xlnet": Refused(
        "XLNet",
        "XLNetLMHeadModel",
        "two-stream permutation attention with relative positions and segment memory (`mem_len`)",
    ),
    "reformer": Refused(
        "Reformer",
        "ReformerModelWithLMHead",
        "LSH and chunked local attention in reversible layers (`attn_layers`)",
    ),
    "blt": Refused(
        "BLT (Byte Latent Transformer)",
        "BltForCausalLM",
        "entropy-patched bytes: local encoder and decoder with cross-attention (`patching_mode`, `cross_attn_k`)",
    ),
    # blocks, norms, embeddings and heads
    "gemma4_assistant": Refused(
        "Gemma 4 assistant (drafter)",
        "Gemma4AssistantForCausalLM",
        "a drafter fed the target model's hidden states and KV (`backbone_hidden_size`): not a standalone LM",
    ),
    "gemma4_unified_assistant": Refused(
        "Gemma 4 Unified assistant (drafter)",
        "Gemma4UnifiedAssistantForCausalLM",
        "a drafter fed the target model's hidden states and KV (`backbone_hidden_size`): not a standalone LM",
    ),
    "hrm_text": Refused(
        "HRM (text)",
        "HrmTextForCausalLM",
        "hierarchical recurrence: two layer stacks cycled (`H_cycles`, `L_cycles`)",
    ),
    "longcat_flash": Refused(
        "LongCat-Flash",
        "LongcatFlashForCausalLM",
        "a shortcut MoE (ScMoE): the first MLP's input through a MoE, added after the second MLA and MLP of the layer",
    ),
    # mixtures of experts
}


class Wrapped(NamedTuple):
    """A transformers wrapper (vision-language) whose language model archlab reads alone, as its text class."""

    title: str  # "Gemma 3 (vision-language)"
    model_class: str  # the wrapper's class: "Gemma3ForConditionalGeneration"
    text: str  # its text config's model_type, whose record reads the language model: "gemma3_text"


WRAPPED: dict[str, Wrapped] = {
    "apertus1p5": Wrapped("Apertus 1.5 (multimodal)", "Apertus1p5ForConditionalGeneration", "apertus1p5_text"),
    "aria": Wrapped("Aria (vision-language)", "AriaForConditionalGeneration", "aria_text"),
    "cohere_compass": Wrapped(
        "Cohere Compass (vision-language)", "CohereCompassForConditionalGeneration", "cohere_compass_text"
    ),
    "dots3_note": Wrapped("dots.3-note (multimodal)", "Dots3NoteForConditionalGeneration", "dots3_note_text"),
    "emu3": Wrapped("Emu3 (vision-language)", "Emu3ForConditionalGeneration", "emu3_text_model"),
    "gemma3": Wrapped("Gemma 3 (vision-language)", "Gemma3ForConditionalGeneration", "gemma3_text"),
    "gemma3n": Wrapped("Gemma 3n (multimodal)", "Gemma3nForConditionalGeneration", "gemma3n_text"),
    "gemma4": Wrapped("Gemma 4 (multimodal)", "Gemma4ForConditionalGeneration", "gemma4_text"),
    "gemma4_unified": Wrapped(
        "Gemma 4 Unified (vision-language)", "Gemma4UnifiedForConditionalGeneration", "gemma4_unified_text"
    ),
    "llama4": Wrapped("Llama 4 (vision-language)", "Llama4ForConditionalGeneration", "llama4_text"),
    "qwen3_5": Wrapped("Qwen3.5 (vision-language)", "Qwen3_5ForConditionalGeneration", "qwen3_5_text"),
    "qwen3_5_moe": Wrapped("Qwen3.5-MoE (vision-language)", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text"),
    "qwen4_exp": Wrapped("Qwen4-Exp (vision-language)", "Qwen4ExpForConditionalGeneration", "qwen4_exp_text"),
    "step3p7": Wrapped("Step-3.7 (vision-language)", "Step3p7ForConditionalGeneration", "step3p5"),
}


NOT_DECODER: frozenset[str] = frozenset(
    {
        # the causal-LM head of a masked-LM encoder
        "bert",
        "bert-generation",
        "big_bird",
        "camembert",
        "data2vec-text",
        "electra",
        "ernie",
        "megatron-bert",
        "rembert",
        "roberta",
        "roberta-prelayernorm",
        "roc_bert",
        "roformer",
        "xlm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
        # the decoder of an encoder-decoder
        "bart",
        "bigbird_pegasus",
        "blenderbot",
        "blenderbot-small",
        "marian",
        "mbart",
        "mvp",
        "pegasus",
        "plbart",
        "prophetnet",
        "trocr",
        "whisper",
        # runs only with images, audio or speech in it
        "fuyu",
        "git",
        "got_ocr2",
        "mllama",
        "moshi",
        "moss_transcribe_diarize",
        "musicgen",
        "musicgen_melody",
        "phi4_multimodal",
    }
)
