"""The table of transformers causal-LM families archlab does not convert (archlab/interop/families/refused.py)
against transformers' own ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: every key is a real ``model_type`` with
the class named there, the converted, refused and not-decoder sets are disjoint and together cover the
whole mapping (a family a new transformers adds fails here until it is classified), every reason is
one short line, and the wrappers read as their language model (``WRAPPED``) are exactly transformers'
vision-language classes whose text config a record holds. No model is built."""

import pytest

from archlab.interop.families import FAMILIES, refusals
from archlab.interop.families.refused import NOT_DECODER, REFUSED, WRAPPED

transformers = pytest.importorskip("transformers")
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

# the model_types archlab converts or is adding records for; FAMILIES joins them as records land
CONVERTED = frozenset(
    "gpt2 gptj gpt_neox phi llama mistral qwen2 qwen3 gemma gemma2 olmo2 mixtral qwen3_moe deepseek_v2 deepseek_v3 "
    "gemma3_text smollm3 cohere2 exaone4 olmo3 gpt_oss llama4_text afmoe step3p5 opt falcon bloom gpt_bigcode "
    "starcoder2 stablelm phi3 cohere granite olmo glm4 ernie4_5 hunyuan_v1_dense ministral ministral3 dots1 "
    "glm4_moe minimax_m2 arcee nemotron".split()
) | frozenset(FAMILIES)

MAPPING = dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
MAX_REASON = 120


def test_every_key_is_a_causal_lm_model_type_with_its_class():
    unknown = sorted((set(REFUSED) | NOT_DECODER) - set(MAPPING))
    assert not unknown, f"not in transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {unknown}"
    wrong = {k: (r.model_class, MAPPING[k]) for k, r in REFUSED.items() if r.model_class != MAPPING[k]}
    assert not wrong, f"model_class differs from transformers' mapping (ours, theirs): {wrong}"


def test_converted_refused_and_not_decoder_are_disjoint():
    assert not set(REFUSED) & NOT_DECODER, sorted(set(REFUSED) & NOT_DECODER)
    assert not NOT_DECODER & CONVERTED, sorted(NOT_DECODER & CONVERTED)
    # a family that gains a record leaves the refusals, whatever REFUSED still says
    assert not set(refusals()) & set(FAMILIES)
    assert set(refusals()) == set(REFUSED) - set(FAMILIES)


def test_the_three_sets_cover_the_mapping():
    unclassified = sorted(set(MAPPING) - CONVERTED - set(REFUSED) - NOT_DECODER - set(WRAPPED))
    assert not unclassified, (
        f"transformers has causal-LM model_types archlab has not classified: {unclassified}; add each to "
        "REFUSED (with what archlab lacks) or NOT_DECODER in archlab/interop/families/refused.py"
    )


def test_reasons_are_one_short_line():
    for model_type, r in REFUSED.items():
        assert r.title.strip() and r.model_class.strip(), model_type
        assert r.missing.strip(), f"{model_type}: empty reason"
        assert "\n" not in r.missing and len(r.missing) <= MAX_REASON, f"{model_type}: {len(r.missing)} chars"
        if r.missing.startswith("no archlab record yet"):
            assert "(holdable: " in r.missing and r.missing.endswith(")"), model_type


def text_model_type(model_type: str) -> str | None:
    """The model_type of the text config transformers' config class of ``model_type`` declares, if any."""
    sub = getattr(transformers.CONFIG_MAPPING[model_type], "sub_configs", None) or {}
    return getattr(sub.get("text_config"), "model_type", None)


def test_wrapped_are_the_vision_language_classes_whose_text_config_a_record_holds():
    """Every vision-language class of transformers whose declared text config a record holds is read as its
    language model, under its own class name, through that text config's record; none is also refused."""
    held = {t for t in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if text_model_type(t) in FAMILIES} - set(FAMILIES)
    assert set(WRAPPED) == held
    for model_type, w in WRAPPED.items():
        assert w.model_class == MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type], model_type
        assert w.text == text_model_type(model_type), model_type
    assert not set(WRAPPED) & set(REFUSED)
