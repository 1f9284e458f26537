"""The language model of a vision-language checkpoint (archlab/interop/wrapped.py): ``from_hf`` and
``load_hf_dir`` on transformers' wrappers whose text config a record holds (Gemma 3, Qwen3.5, Qwen3.5-MoE,
Llama 4, Emu3, Aria, Step-3.7, Gemma 4, Cohere Compass, Apertus 1.5, dots.3-note, Qwen4-Exp; LLaVA, which takes any text config, with a LLaMA's) read the language model alone,
say in one logged line what they leave out (the vision tower, the projector, Emu3's VQ-VAE, dots.3-note's audio tower), and export it as the
text-only class.

Tiny wrappers built here, every parameter redrawn (vision tower included): archlab's float32 logits equal the
wrapper's own on text-only input within 1e-4 (Llama 4's forward needs an image in transformers 5.24, so its
``language_model``'s; Gemma 3's wrapper leaves its text config's final_logit_softcapping unapplied, and so
does archlab); a save_pretrained directory of the wrapper (its checkpoint names: Gemma 3's
``language_model.model.*``, Step-3.7's MoE as ``moe.*``, the others' as in memory) loads the same; ``to_hf``
gives the text-only class (Qwen3.5-MoE's layout exports as Qwen3-Next, which holds the same model, or with
``family=`` as Qwen3.5-MoE's own) with the same logits, read back bit for bit, and ``save_hf_dir`` writes a directory ``from_pretrained`` loads as that
class."""

import json
import logging
from typing import Any

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, NO_TOKENS, TOL, logits, max_diff, randomize

from archlab.interop.families import FAMILIES
from archlab.interop.families.step_lm import causal_lm_class
from archlab.interop.hf import from_hf, load_hf_dir, save_hf_dir, to_hf
from archlab.interop.wrapped import language_model_state
from interop.test_dots3_note import KEYS as DOTS3_TEXT
from interop.test_qwen4_exp import HF_CASES as QWEN4_CASES

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TEXT = dict(
    vocab_size=96,
    max_position_embeddings=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    **NO_TOKENS,
)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
QWEN_TEXT = dict(
    TEXT,
    layer_types=["linear_attention", "full_attention"],
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    rope_parameters=dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.25, mrope_section=[1, 1, 0]),
)
QWEN_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
# a tiny VQ image encoder: Emu3's VQ-VAE and Apertus 1.5's vision tokenizer take the same sizes
VQ = dict(
    embed_dim=8,
    codebook_size=16,
    base_channels=32,
    channel_multiplier=[1],
    num_res_blocks=1,
    attn_resolutions=[],
    latent_channels=4,
)
QWEN4_TEXT = QWEN4_CASES["qwen4-exp"][2]
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32)
# case -> (config class, its keys, the text-only class it exports as, the parts left out)
CASES = {
    "gemma3": (
        "Gemma3Config",
        dict(
            text_config=dict(TEXT, sliding_window=4, query_pre_attn_scalar=24, final_logit_softcapping=5.0),
            vision_config=dict(VISION, image_size=32, patch_size=8),
            mm_tokens_per_image=4,
        ),
        "Gemma3ForCausalLM",
        "model.multi_modal_projector, model.vision_tower",
    ),
    # Gemma 4's text config (sliding and full layers, per-layer inputs) beside a vision tower
    "gemma4": (
        "Gemma4Config",
        dict(
            text_config=dict(
                TEXT,
                sliding_window=4,
                num_hidden_layers=2,
                layer_types=["sliding_attention", "full_attention"],
                pad_token_id=0,  # the wrapper puts it in place of image tokens
                global_head_dim=16,
                hidden_size_per_layer_input=8,
                vocab_size_per_layer_input=TEXT["vocab_size"],
                final_logit_softcapping=5.0,
            ),
            vision_config=dict(VISION, patch_size=8, position_embedding_size=64, pooling_kernel_size=2),
        ),
        "Gemma4ForCausalLM",
        "model.embed_vision, model.vision_tower",
    ),
    # Gemma 4 Unified's: no per-layer inputs
    "gemma4_unified": (
        "Gemma4UnifiedConfig",
        dict(
            text_config=dict(
                TEXT,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                pad_token_id=0,
                global_head_dim=16,
            ),
            vision_config=dict(VISION, patch_size=8, mm_embed_dim=32, mm_posemb_size=16, output_proj_dims=32),
        ),
        "Gemma4ForCausalLM",
        "model.embed_vision",
    ),
    "qwen3_5": (
        "Qwen3_5Config",
        dict(text_config=dict(QWEN_TEXT, intermediate_size=24), vision_config=QWEN_VISION),
        "Qwen3_5ForCausalLM",
        "model.visual",
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeConfig",
        dict(text_config=dict(QWEN_TEXT, **MOE), vision_config=QWEN_VISION),
        "Qwen3NextForCausalLM",
        "model.visual",
    ),
    # Qwen4-Exp's text config (tests/interop/test_qwen4_exp.py's: gated streams, qsa, n-gram inputs) beside
    # Qwen3.5's vision tower
    "qwen4_exp": (
        "Qwen4ExpConfig",
        dict(text_config=QWEN4_TEXT, vision_config=QWEN_VISION),
        "Qwen4ExpForCausalLM",
        "model.visual",
    ),
    "llama4": (
        "Llama4Config",
        dict(
            text_config=dict(TEXT, intermediate_size_mlp=96, num_local_experts=2, interleave_moe_layer_step=2),
            vision_config=dict(
                VISION,
                image_size=32,
                patch_size=8,
                vision_output_dim=32,
                projector_input_dim=32,
                projector_output_dim=32,
            ),
        ),
        "Llama4ForCausalLM",
        "multi_modal_projector, vision_model",
    ),
    "aria": (
        "AriaConfig",
        dict(
            text_config=dict(
                TEXT, head_dim=8, intermediate_size=32, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2
            ),
            vision_config=dict(VISION, image_size=28, patch_size=14),
            projector_patch_to_query_dict={4: 2},
        ),
        "AriaTextForCausalLM",
        "model.multi_modal_projector, model.vision_tower",
    ),
    "step3p7": (
        "Step3p7Config",
        dict(
            text_config=dict(
                TEXT,
                intermediate_size=48,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=16,
                share_expert_dim=16,
                sliding_window=4,
                num_hidden_layers=3,
                layer_types=["full_attention", "sliding_attention", "full_attention"],
                mlp_layer_types=["dense", "sparse", "sparse"],
                swiglu_limits=[0, 0.5, 0],
                pad_token_id=1,
            ),
            vision_config=dict(VISION, intermediate_size=32, image_size=28),
        ),
        "Step3p5ForCausalLM",  # archlab's: transformers 5.24 has no causal-LM class for Step-3.5
        "model.multi_modal_projector, model.vision_model",
    ),
    "cohere_compass": (
        "CohereCompassConfig",
        dict(
            text_config=dict(
                TEXT,
                num_hidden_layers=2,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [4, 2, 2]},
                    "full_attention": None,
                },
                logit_scale=0.5,
            ),
            vision_config=dict(
                depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=8
            ),
        ),
        "CohereCompassForCausalLM",
        "model.visual",
    ),
    "emu3": (
        "Emu3Config",
        dict(
            text_config=dict(TEXT, bos_token_id=0, pad_token_id=0, attention_bias=True, mlp_bias=True),
            vq_config=dict(VQ, temporal_downsample_factor=1),
            vocabulary_map={"<image>": 0},
        ),
        "Emu3ForCausalLM",
        "model.vqmodel",
    ),
    # Apertus 1.5: image and audio codes as vocabulary ids, read by tokenizers the language model never runs;
    # its head pruned to the first 60 ids
    "apertus1p5": (
        "Apertus1p5Config",
        dict(
            text_config=dict(TEXT, output_vocab_size=60, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
            vision_config=VQ,
            audio_config=dict(
                model_type="wavtokenizer_encoder",
                num_filters=4,
                upsampling_ratios=[2],
                hidden_size=8,
                codebook_size=16,
                codebook_dim=8,
                num_lstm_layers=1,
                decoder_hidden_size=8,
                decoder_intermediate_size=8,
                decoder_num_layers=1,
                decoder_attention_num_groups=1,
            ),
            image_token_id=61,
            audio_token_id=62,
            image_token_offset=64,
            audio_token_offset=80,
        ),
        "Apertus1p5TextForCausalLM",
        "model.audio_tokenizer, model.vision_tokenizer",
    ),
    # dots.3-note's language model (tests/interop/test_dots3_note.py's: full, sliding and indexed layers) beside
    # its vision and audio towers
    "dots3_note": (
        "Dots3NoteConfig",
        dict(
            text_config=DOTS3_TEXT,
            vision_config=dict(VISION, adapter_in_dim=32, adapter_out_dim=64, mlp_layer_types=["dense"], patch_size=14),
            audio_config=dict(
                VISION, adapter_input_size=32, adapter_out_dim=64, downsample_hidden_size=16, feature_size=16
            ),
        ),
        "Dots3NoteForCausalLM",
        "model.audio_tower, model.vision_tower",
    ),
    # a wrapper that takes any text config: LLaVA's, a LLaMA here
    "llava": (
        "LlavaConfig",
        dict(
            text_config=dict(TEXT, model_type="llama"),
            vision_config=dict(VISION, model_type="clip_vision_model", image_size=28, patch_size=14, projection_dim=32),
        ),
        "LlamaForCausalLM",
        "model.multi_modal_projector, model.vision_tower",
    ),
}


def wrapper(case: str, seed: int = 1) -> Any:
    """The vision-language model of ``case``, every parameter redrawn."""
    config = getattr(transformers, CASES[case][0])(**CASES[case][1], **EAGER)
    return randomize(transformers.AutoModelForImageTextToText.from_config(config), seed)


def reference(hf):
    """What gives the language model's logits on text alone: the wrapper itself, but Llama 4's
    ``language_model`` (its wrapper's forward fails without an image in transformers 5.24)."""
    return hf.language_model if type(hf).__name__ == "Llama4ForConditionalGeneration" else hf


def said(caplog) -> str:
    """The one line archlab logged."""
    lines = [r.getMessage() for r in caplog.records if r.name == "archlab.interop"]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_from_hf_reads_the_language_model_and_exports_the_text_class(case, caplog):
    """The wrapper's logits; one line naming the wrapper and what it leaves out; to_hf gives the text-only
    class with the same logits, which reads back bit for bit."""
    hf = wrapper(case)
    with caplog.at_level(logging.WARNING, logger="archlab.interop"):
        model = from_hf(hf)
    assert max_diff(logits(reference(hf)), logits(model)) <= TOL
    line = said(caplog)
    assert line.startswith(type(hf).__name__) and line.endswith(f"({CASES[case][3]})"), line
    back = to_hf(model, **EAGER).eval()
    assert type(back).__name__ == CASES[case][2]
    assert max_diff(logits(back), logits(reference(hf))) <= TOL
    parity.assert_same_tensors(model, from_hf(back))


def test_qwen3_5_moe_s_language_model_exports_as_its_own_text_class_by_family():
    """Qwen3.5-MoE's layout is Qwen3-Next's, which it exports as by default; ``family=`` names its own
    text-only class (Qwen3_5MoeForCausalLM), with the wrapper's logits, read back bit for bit."""
    hf = wrapper("qwen3_5_moe", seed=1)
    model = from_hf(hf)
    back = to_hf(model, "qwen3_5_moe_text", **EAGER).eval()
    assert type(back).__name__ == "Qwen3_5MoeForCausalLM"
    assert max_diff(logits(back), logits(reference(hf))) <= TOL
    parity.assert_same_tensors(model, from_hf(back))


@pytest.mark.parametrize(
    "case",
    ["gemma3", "gemma4", "qwen3_5_moe", "qwen4_exp", "llama4", "emu3", "step3p7", "cohere_compass", "dots3_note"],
)
def test_a_save_pretrained_directory_loads_and_saves_as_the_text_class(case, tmp_path, caplog):
    """save_pretrained of the wrapper (Gemma 3's names ``language_model.model.*``, Step-3.7's MoE as
    ``moe.*``) -> load_hf_dir (the same logits, one line) -> save_hf_dir -> the text-only class's
    from_pretrained (archlab's for Step-3.5): the same logits."""
    hf = wrapper(case, seed=2)
    hf.save_pretrained(tmp_path / "wrapper")
    with caplog.at_level(logging.WARNING, logger="archlab.interop"):
        model = load_hf_dir(tmp_path / "wrapper").eval()
    assert max_diff(logits(reference(hf)), logits(model)) <= TOL
    assert said(caplog).startswith(type(hf).__name__)
    save_hf_dir(model, tmp_path / "text", **EAGER)
    loader = causal_lm_class() if case == "step3p7" else getattr(transformers, CASES[case][2])
    back = loader.from_pretrained(tmp_path / "text", **EAGER).eval()
    assert type(back).__name__ == CASES[case][2]
    assert max_diff(logits(back), logits(reference(hf))) <= TOL


def test_a_qwen3_5_wrapper_s_mtp_modules_load_with_its_language_model(tmp_path, caplog):
    """Qwen3.5's published checkpoints are the wrapper's, with its MTP module at the top level (``mtp.*``,
    ``text_config.mtp_num_hidden_layers``), which transformers holds nowhere: load_hf_dir reads it into
    archlab's module beside the language model (the wrapper's logits; the module's tensors as written, and
    drafting as greedy decoding), leaving out the vision tower alone."""
    from safetensors.torch import load_file, save_file

    from archlab import build_model
    from archlab.generate import generate
    from archlab.interop.hf import mtp_state_to_hf
    from archlab.nn.mtp import with_depth
    from archlab.speculative import speculate

    hf = wrapper("qwen3_5", seed=4)
    hf.save_pretrained(tmp_path)
    source = randomize(build_model(with_depth(from_hf(hf).cfg, 1)), 6)  # its module random; the rest unused
    modules = mtp_state_to_hf(source.cfg, source.state_dict())
    file = tmp_path / "model.safetensors"
    save_file({**load_file(str(file)), **modules}, str(file), metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="archlab.interop"):
        model = load_hf_dir(tmp_path).eval()
    assert said(caplog).endswith("(model.visual)")
    assert model.cfg.head.mtp.depth == 1 and max_diff(logits(hf), logits(model)) <= TOL
    held = {k: v for k, v in source.state_dict().items() if k.startswith("mtp.")}
    assert held and all(torch.equal(model.state_dict()[k], v) for k, v in held.items())
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(speculate(model, prompt, 6).ids, generate(model, prompt, 6, temperature=0.0))


def test_a_second_embedding_of_the_language_model_s_name_is_refused():
    """A wrapper whose state holds the language model's embedding name under two prefixes: which is the
    language model is not guessed, the error names both."""
    hf = wrapper("gemma3")
    state = {**hf.state_dict(), "model.vision_tower.embed_tokens.weight": torch.zeros(4, 4)}
    with pytest.raises(ValueError, match="model.language_model.', 'model.vision_tower.'"):
        language_model_state(FAMILIES["gemma3_text"], from_hf(hf).cfg, state, "Gemma3ForConditionalGeneration")
