"""Hugging Face parity of Phi-3 (archlab/interop/families/phi3.py): LLaMA's layers rotating part of each
head, a sliding window, and LongRoPE, which switches to its long factors past an original context of 16
(with rope_parameters' attention_factor too: tests/test_rope.py checks the part itself).

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1; GQA and MQA; a window
of 4) give the same float32 logits in archlab and in transformers' eager implementation, on 12 tokens and
on 24 (past the switch), and in greedy decoding that crosses it (transformers re-encodes there, as
archlab does); archlab -> HF -> archlab is bit for bit; a save_pretrained directory loads; archlab
layouts export to Phi-3; what it cannot hold is refused, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, IDS, LLAMA, LONG_IDS, SMALL, TOL, WINDOW, logits, max_diff

from archlab import compose_model
from archlab.generate import generate
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SHORT, LONG = [1.0, 1.1, 1.3, 1.7], [1.5, 2.5, 4.0, 6.0]  # 4 pairs: 8 of 16 dims rotate
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
HF_CASES = {
    "phi3-window": (
        "Phi3ForCausalLM",
        "Phi3Config",
        dict(SMALL, num_key_value_heads=2, sliding_window=WINDOW, partial_rotary_factor=0.75),
    ),
    # no factor: max_position_embeddings / original = 4, attention factor sqrt(1 + ln 4 / ln 16)
    "phi3-longrope": (
        "Phi3ForCausalLM",
        "Phi3Config",
        dict(
            SMALL,
            num_key_value_heads=1,
            original_max_position_embeddings=16,
            rope_parameters=dict(LONGROPE, short_factor=SHORT, long_factor=LONG),
        ),
    ),
    "phi3-longrope-attention-factor": (
        "Phi3ForCausalLM",
        "Phi3Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            original_max_position_embeddings=16,
            rope_parameters=dict(LONGROPE, short_factor=SHORT, long_factor=LONG, factor=2.0, attention_factor=1.3),
        ),
    ),
}
LAYOUTS = {
    # LLaMA's layers rotating half of each head: no family before Phi-3 holds it
    "phi3-partial-rotary": [*LLAMA, "model.position.rotary_fraction=0.5"],
    "phi3-longrope": [
        *LLAMA,
        "model.position.scaling.kind=longrope",
        "model.position.scaling.original_context=16",
        "model.position.scaling.factor=4.0",
        f"model.position.scaling.short_factor={[*SHORT, *SHORT]}",
        f"model.position.scaling.long_factor={[*LONG, *LONG]}",
        "model.position.scaling.attention_factor=1.2",
        f"model.attention.window={WINDOW}",
    ],
}
# LongRoPE over the 8 dims phi3-partial-rotary turns
PARTIAL_LONGROPE = [
    "model.position.scaling.kind=longrope",
    "model.position.scaling.original_context=16",
    f"model.position.scaling.short_factor={SHORT}",
    f"model.position.scaling.long_factor={LONG}",
]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        ids=(IDS, LONG_IDS),
        only=parity.ROUND_TRIP_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    w = from_hf(hf_model("phi3-window")).cfg
    assert (w.attention.window, w.attention.n_kv_head, w.position.rotary_fraction, w.norm.kind) == (
        WINDOW,
        2,
        0.75,
        "rmsnorm",
    )
    p = from_hf(hf_model("phi3-longrope")).cfg.position.scaling
    assert (p.kind, p.original_context, p.factor, p.short_factor, p.long_factor, p.attention_factor) == (
        "longrope",
        16,
        4.0,
        SHORT,
        LONG,
        None,
    )
    p = from_hf(hf_model("phi3-longrope-attention-factor")).cfg.position.scaling
    assert (p.factor, p.attention_factor) == (2.0, 1.3)


@pytest.mark.parametrize("case", ["phi3-window"])
def test_greedy_generation_matches_hf_generate(case):
    """5 + 20 tokens past the window of 4: ids and every step's logits through the KV cache."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["phi3-longrope", "phi3-longrope-attention-factor"])
def test_greedy_generation_across_longrope_s_switch_matches_hf_generate(case):
    """5 + 20 tokens across the switch at 16: transformers' Phi-3 drops its cache there and re-encodes the
    sequence with the long factors, as archlab's generate does; the same ids, and at every step the logits
    archlab's generate decoded with equal those HF decoded with."""
    hf = hf_model(case, seed=4)
    ids, out = parity.hf_greedy(hf)
    model, seen = from_hf(hf), []
    hook = model.head.register_forward_hook(lambda m, i, o: seen.append(o[:, -1]))
    got = generate(model, ids, max_new_tokens=20)
    hook.remove()
    assert torch.equal(got, out.sequences)
    assert len(seen) == 20  # prefill, 10 cached steps, the re-encoding at 16 -> 17 tokens, 8 cached steps
    assert max_diff(torch.stack(seen, 1), torch.stack(out.logits, 1)) <= TOL


@pytest.mark.parametrize("case", ["phi3-window"])
def test_padded_batch_generation_matches_hf_generate(case):
    """Left-padded prompts of 7, 3 and 5 tokens. Not across LongRoPE's switch: transformers picks the
    factors for the whole batch by its longest row, archlab for each row by its own length."""
    parity.check_padded_generation(hf_model(case, seed=6))


@pytest.mark.parametrize("case", ["phi3-longrope"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_an_archlab_layout_exports_to_its_family_and_back_bit_for_bit(case):
    model, hf = parity.check_exports(compose_model(LAYOUTS[case]), "Phi3ForCausalLM", **ATTN)
    assert max_diff(logits(model, LONG_IDS), logits(hf, LONG_IDS)) <= TOL


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.qkv_bias=true"], "model.attention.qkv_bias"),
        (["model.attention.head_dim=32"], "model.attention.head_dim"),
        (["model.position.scaling.kind=linear", "model.position.scaling.factor=2.0"], "model.position.scaling.kind"),
        # PhiMoE's LongRoPE (transformers' PhimoeRotaryEmbedding): the short factors at every length, two mscales
        ([*PARTIAL_LONGROPE, "model.position.scaling.switch_factors=false"], "model.position.scaling.switch_factors"),
        (
            [*PARTIAL_LONGROPE, "model.position.scaling.long_attention_factor=1.4"],
            "model.position.scaling.long_attention_factor",
        ),
    ],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    cfg = compose_model([*LAYOUTS["phi3-partial-rotary"], *overrides])
    assert field in [p.field for p in FAMILIES["phi3"].problems(cfg)]
    parity.check_family_refuses("phi3", cfg, field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "phi3-window", hidden_act="relu")
    parity.check_refuses(lambda: config_from_hf(config), "Phi3Config.hidden_act")
