"""Hugging Face parity of LFM3 (archlab/interop/families/lfm3.py, model_type lfm3): gated short convolutions
beside sliding and full Qwen3 attention layers, each attention type with its own RoPE (proportional on the
full layers by default: archlab's ``turning_fraction``), a sigmoid gate per head, sandwich norms.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), norm scales and biases 0.5 + N(0, 0.3²))
give HF's float32 eager logits; archlab -> HF -> archlab is bit-identical; a save_pretrained directory reads
back; greedy generation, past the window of 4, and left-padded batches without convolution biases (see
test_lfm2.py for why) equal HF ``generate``; what the family cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS

from archlab import build_model, compose_model
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CONV, SLIDING, FULL = "conv", "sliding_attention", "full_attention"
BASE = dict(HF_SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=80, **NO_TOKENS)
HF_CASES = {
    # the class's own layout (conv, conv, full, conv, sliding), sandwich norms, gates, proportional RoPE 0.5
    "lfm3": ("Lfm3ForCausalLM", "Lfm3Config", dict(BASE, num_hidden_layers=5, sliding_window=4)),
    # no sandwich norms or gates, attention and convolution biases, a 3-wide kernel, proportional RoPE on the
    # sliding layers (a quarter turning) and plain RoPE on the full ones, an untied head
    "lfm3-plain": (
        "Lfm3ForCausalLM",
        "Lfm3Config",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_types=[FULL, CONV, SLIDING, CONV],
            sliding_window=4,
            use_sandwich_norm=False,
            use_attention_gate=False,
            attention_bias=True,
            conv_bias=True,
            conv_L_cache=3,
            rope_parameters={
                FULL: dict(rope_type="default", rope_theta=1e4),
                SLIDING: dict(rope_type="proportional", rope_theta=1e5, partial_rotary_factor=0.25),
            },
            tie_word_embeddings=False,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
BOTH_WAYS = ("test_the_family_converts_both_ways", "test_greedy_generation_matches_hf_generate")
globals().update(parity.family_tests(hf_model, HF_CASES, only=BOTH_WAYS))
UNBIASED = {case: v for case, v in HF_CASES.items() if not v[2].get("conv_bias")}
globals().update(parity.family_tests(hf_model, UNBIASED, only=("test_padded_batch_generation_matches_hf_generate",)))


def test_the_family_s_parts_read_from_the_config():
    """The sandwich block, the head gate, proportional RoPE as turning_fraction on the model's (full) layers,
    the sliding kind's window and RoPE; no field set that its part does not read."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "lfm3"))
    assert ignored(cfg) == []
    assert (cfg.block.kind, cfg.attention.gate, cfg.attention.qk_norm) == ("sandwich", "head", "head")
    assert (cfg.position.theta, cfg.position.turning_fraction) == (1e6, 0.5)
    assert (cfg.layers.first, cfg.layers.pattern) == ([], ["conv", "conv", "attention", "conv", "sliding"])
    assert cfg.layers.kinds["sliding"] == {
        "attention": {"window": 4},
        "position": {"theta": 10000.0, "turning_fraction": None},
    }
    plain = config_from_hf(parity.hf_config(HF_CASES, "lfm3-plain"))
    assert (plain.block.kind, plain.attention.gate, plain.position.turning_fraction) == ("pre", "none", None)
    assert plain.layers.kinds["sliding"]["position"] == {"theta": 1e5, "turning_fraction": 0.25}


def test_each_part_changes_the_logits():
    """The sliding window, and proportional RoPE at a base of 100 (at 10⁶ the still pairs would have turned
    less than 1e-5 over 12 positions: no test of them), each taken away, move the logits."""
    model = from_hf(hf_model("lfm3"))
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, kinds__sliding__attention__window=64))
    fast = build_model(parity.changed_cfg(model.cfg, position__theta=100.0), device="meta")
    fast.load_state_dict(model.state_dict(), assign=True)
    parity.check_changes_logits(fast.eval(), parity.changed_cfg(fast.cfg, position__turning_fraction=None))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(attention_bias=True), "Lfm3Config.attention_bias"),
        (dict(layer_types=[CONV, "chunked_attention", FULL, CONV, SLIDING]), "Lfm3Config.layer_types"),
        (
            dict(rope_parameters={FULL: dict(rope_type="proportional", rope_theta=1e6, factor=2.0), SLIDING: {}}),
            "Lfm3Config.rope_parameters.full_attention.factor",
        ),
        (
            dict(rope_parameters={FULL: {}, SLIDING: dict(rope_type="linear", rope_theta=1e4, factor=2.0)}),
            "Lfm3Config.rope_parameters.sliding_attention.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "lfm3", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(position__rotary_fraction=0.5), "model.position.rotary_fraction"),
        (dict(position__pairing="interleaved"), "model.position.pairing"),
        (dict(block__kind="post"), "model.block.kind"),
        (dict(attention__qkv_bias=True, attention__out_bias=True), "model.attention.qkv_bias"),
        (dict(kinds__sliding__attention__qk_norm="none"), "model.layers.kinds.sliding.attention.qk_norm"),
        (dict(kinds__attention__position__theta=5.0), "model.layers.kinds.attention.position.theta"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "lfm3")), **fields)
    assert [p.field for p in FAMILIES["lfm3"].problems(cfg)] == [field]


def test_an_lfm2_layout_exports_to_lfm2_which_lfm3_holds_too():
    """LFM3 without sandwich norms, gates, windows or proportional RoPE is LFM2's layout (MLP width explicit):
    it maps to LFM2, and LFM3's record holds it too."""
    config = parity.hf_config(
        HF_CASES,
        "lfm3-plain",
        layer_types=[FULL, CONV, FULL, CONV],
        attention_bias=False,
        conv_bias=False,
        rope_parameters={FULL: dict(rope_type="default", rope_theta=1e4), SLIDING: dict(rope_type="default")},
    )
    model = from_hf(parity.randomize(transformers.Lfm3ForCausalLM(config), 3))
    assert FAMILIES["lfm3"].problems(model.cfg) == []
    assert parity.hf_family(model.cfg) == "lfm2"


def test_the_class_defaults_load_as_the_preset_and_back():
    """Lfm3Config()'s defaults (LiquidAI/LFM3-1.7B) read into the lfm3-1.7b preset exactly, and the preset
    writes back their layer types, windows, RoPE per layer type and sizes."""
    published = transformers.Lfm3Config()
    cfg = config_from_hf(published)
    assert cfg == compose_model(["model=lfm3-1.7b"])
    back = config_to_hf(cfg)
    keys = ["layer_types", "rope_parameters", "sliding_window", "head_dim", "intermediate_size", "conv_L_cache"]
    keys += ["use_sandwich_norm", "use_attention_gate", "num_key_value_heads", "tie_word_embeddings", "vocab_size"]
    assert {k: getattr(back, k) for k in keys} == {k: getattr(published, k) for k in keys}


def test_the_preset_shrunk_converts_to_hf_and_back():
    """The preset at 6 layers and small widths (its layer kinds kept) gives HF's logits and comes back bit for
    bit."""
    shrunk = ["model.n_layer=6", "model.d_model=64", "model.vocab_size=96", "model.context_length=64"]
    shrunk += ["model.attention.head_dim=16", "model.mlp.d_ff=80", "model.layers.kinds.sliding.attention.window=4"]
    model, hf = parity.check_exports(compose_model(["model=lfm3-1.7b", *shrunk]), "Lfm3ForCausalLM", "lfm3", **ATTN)
    assert hf.config.layer_types == [CONV, CONV, FULL, CONV, SLIDING, CONV]
