"""Hugging Face parity of Cohere Compass's text decoder (archlab/interop/families/cohere_compass.py): Cohere2's
parallel layers with half-paired RoPE per layer type or none, the multimodal RoPE sections (``mrope_section``)
idle on text, a logit scale folded into the final norm.

Tiny random models (every parameter redrawn; GQA; sequences longer than the window of 4) give HF eager's
float32 logits and map back to the family; archlab -> HF -> archlab gives back every tensor bit for bit;
greedy and left-padded generation equal HF ``generate`` (2-D position_ids, every M-RoPE axis the same); a
save_pretrained directory loads; the RoPE of each type is held (RoPE on both types with two bases, or a
NoPE full type); what the family cannot hold is refused both ways."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WINDOW

from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
HF = dict(SMALL, num_hidden_layers=3, num_key_value_heads=2, sliding_window=WINDOW, layer_types=[S, S, F])
CLASSES = ("CohereCompassForCausalLM", "CohereCompassTextConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "compass-global-nope": (*CLASSES, dict(HF, rope_parameters={S: ROPE, F: None}, logit_scale=0.25)),
    "compass-rope-both-biases-untied": (
        *CLASSES,
        dict(
            HF,
            rope_parameters={S: ROPE, F: dict(ROPE, rope_theta=50000.0)},
            attention_bias=True,
            tie_word_embeddings=False,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=ATTN,
        only=(*parity.MAPPED_TESTS, "test_padded_batch_generation_matches_hf_generate"),
    )
)


def test_from_hf_reads_each_type_s_rope():
    cfg = from_hf(hf_model("compass-global-nope")).cfg
    assert [lc.position.kind for lc in layer_configs(cfg)] == ["rope", "rope", "none"]
    assert cfg.position.pairing == "half"
    both = layer_configs(from_hf(hf_model("compass-rope-both-biases-untied")).cfg)
    assert [lc.position.theta for lc in both] == [10000.0, 10000.0, 50000.0]


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    c = parity.hf_config(HF_CASES, "compass-global-nope", logit_scale=0.3)
    parity.check_refuses(lambda: config_from_hf(c), "CohereCompassTextConfig.logit_scale")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(position__pairing="interleaved"), "model.position.pairing"),
        (dict(block__shared_norm=False), "model.block.shared_norm"),
        (dict(kinds__local__position={"kind": "none"}), "model.layers.kinds.local.position.kind"),  # no RoPE left
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model("compass-global-nope")).cfg, **change)
    parity.check_family_refuses("cohere_compass_text", cfg, field)
