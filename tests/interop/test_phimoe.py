"""Hugging Face parity of PhiMoE (archlab/interop/families/phimoe.py): Mixtral's layout with LayerNorms, one
``attention_bias`` flag, a head bias, and SparseMixer's top-2 routing (``routing.sparsemixer_eps``).

Tiny random models (every parameter redrawn, router logits spread so that the 2ε mask cuts some experts and
keeps others) give HF eager's float32 logits and map back to the family; every token's experts and weights
are HF's router's; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and left-padded
generation equal HF ``generate``; a save_pretrained directory (each expert saved apart) loads; the SparseMixer
weights move the logits against plain top-2; what the record cannot hold is refused both ways. LongRoPE as
transformers' PhiMoE computes it (the short factors at every length, short_mscale / long_mscale switching at
an original context of 16): the logits on 12 and 24 tokens, the round trip (a saved directory too), greedy
decoding across the switch, and Phi-3's rule (long factors past 16) and one mscale both moving the logits
past it. Left-padded generation across the switch is not compared: transformers picks the mscale for the
whole batch by its longest row, archlab for each row by its own length (docs/interop.md)."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, IDS, LONG_IDS, NO_TOKENS, TOL, logits, max_diff

from archlab import build_model
from archlab.generate import generate
from archlab.interop.hf import config_from_hf, from_hf
from archlab.nn.moe import sparsemixer

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
HF |= dict(intermediate_size=32, num_local_experts=6, num_experts_per_tok=2, router_jitter_noise=0.3)
CLASSES = ("PhimoeForCausalLM", "PhimoeConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "phimoe": (*CLASSES, HF),
    "phimoe-biases-window": (
        *CLASSES,
        dict(HF, attention_bias=True, lm_head_bias=True, sliding_window=4, router_jitter_noise=0.05),
    ),
}
# LongRoPE past an original context of 16 (8 pairs: a head of 16 dims), the two mscales apart; Phi-3.5-MoE's
# published config has a rope_scaling of this shape (its factor, max / original, is unread by PhiMoE)
SHORT, LONG = [1.0, 1.1, 1.3, 1.7, 2.0, 2.2, 2.5, 3.0], [1.5, 2.5, 4.0, 6.0, 8.0, 9.0, 11.0, 13.0]
LONGROPE = dict(rope_type="longrope", rope_theta=10000.0, short_factor=SHORT, long_factor=LONG)
LONGROPE |= dict(short_mscale=1.1, long_mscale=1.4, original_max_position_embeddings=16)
LONGROPE_CASES = {"phimoe-longrope": (*CLASSES, dict(HF, rope_parameters=LONGROPE))}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case({**HF_CASES, **LONGROPE_CASES}, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=EAGER,
        only=(*parity.MAPPED_TESTS, "test_padded_batch_generation_matches_hf_generate"),
    )
)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_every_token_s_experts_and_weights_are_hf_s(case):
    parity.check_routed_as_hf(hf_model(case), router="router")


def test_sparsemixer_equals_transformers_function_and_its_mask_cuts():
    """archlab's SparseMixer equals transformers' ``sparsemixer`` in eval (ε 0.01 and 0.3) on random logits,
    and its weights differ from the plain softmax's at the same experts (the mask drops far experts)."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as hf_sparsemixer

    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 2
    for eps in (0.01, 0.3):
        weights, indices = sparsemixer(logits, 2, eps)
        hf_weights, hf_indices = hf_sparsemixer(logits, eps, training=False)
        assert torch.equal(indices, hf_indices)
        torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    assert (weights != logits.softmax(-1).gather(-1, indices)).any()


def test_sparsemixer_moves_the_logits_against_plain_top_2():
    model = from_hf(hf_model("phimoe"))
    plain = parity.changed_cfg(model.cfg, mlp__routing__sparsemixer_eps=None)
    parity.check_changes_logits(model, plain)


def test_config_from_hf_refuses_other_than_two_experts():
    c = parity.hf_config(HF_CASES, "phimoe", num_experts_per_tok=3)
    parity.check_refuses(lambda: config_from_hf(c), "PhimoeConfig.num_experts_per_tok")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(mlp__routing__sparsemixer_eps=None), "model.mlp.routing.sparsemixer_eps"),
        (dict(mlp__routing__top_k=3), "model.mlp.routing.top_k"),
        (dict(norm__bias=False), "model.norm.bias"),
        (dict(attention__out_bias=False), "model.attention.out_bias"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model("phimoe-biases-window")).cfg, **change)
    parity.check_family_refuses("phimoe", cfg, field)


def test_longrope_gives_hf_logits_below_and_past_the_original_context_and_round_trips():
    """12 and 24 tokens (past the original 16): transformers' logits; the scaling read is the short factors
    at every length with short_mscale / long_mscale; archlab -> HF -> archlab bit for bit."""
    hf = hf_model("phimoe-longrope", seed=2)
    model = parity.check_from_hf(hf, ids=(IDS, LONG_IDS))
    s = model.cfg.position.scaling
    assert (s.kind, s.original_context, s.short_factor, s.long_factor) == ("longrope", 16, SHORT, LONG)
    assert (s.switch_factors, s.attention_factor, s.long_attention_factor) == (False, 1.1, 1.4)
    back = parity.check_back_and_again(hf, model, **EAGER)
    assert (back.config.rope_parameters["short_mscale"], back.config.rope_parameters["long_mscale"]) == (1.1, 1.4)


def test_longrope_save_pretrained_directory_round_trips(tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the mscales travel in config.json."""
    parity.check_directory_round_trip(hf_model("phimoe-longrope", seed=7), tmp_path, **EAGER)


def test_longrope_greedy_generation_across_the_switch_matches_hf_generate():
    """5 + 20 tokens across 16: transformers' PhiMoE drops its cache there and re-encodes with long_mscale,
    as archlab's generate does; the same ids, and at every step the logits each decoded with."""
    hf = hf_model("phimoe-longrope", seed=4)
    ids, out = parity.hf_greedy(hf)
    model, seen = from_hf(hf), []
    hook = model.head.register_forward_hook(lambda m, i, o: seen.append(o[:, -1]))
    got = generate(model, ids, max_new_tokens=20)
    hook.remove()
    assert torch.equal(got, out.sequences)
    assert len(seen) == 20  # prefill, 10 cached steps, the re-encoding at 16 -> 17 tokens, 8 cached steps
    assert max_diff(torch.stack(seen, 1), torch.stack(out.logits, 1)) <= TOL


def test_phi3_s_factor_switch_and_one_mscale_move_the_logits_past_the_original_context_alone():
    """Phi-3's LongRoPE rule (the long factors past 16) and long_mscale dropped (short_mscale throughout)
    leave 12 tokens' logits and move 24 tokens': PhiMoE's record is neither."""
    model = from_hf(hf_model("phimoe-longrope"))
    for change in (dict(switch_factors=True), dict(long_attention_factor=None)):
        fields = {f"position__scaling__{k}": v for k, v in change.items()}
        other = build_model(parity.changed_cfg(model.cfg, **fields), device="meta")
        other.load_state_dict(model.state_dict(), assign=True)
        assert max_diff(logits(other.eval(), IDS), logits(model, IDS)) <= TOL
        assert max_diff(logits(other, LONG_IDS), logits(model, LONG_IDS)) > 1e-3, change


def test_the_record_refuses_phi3_s_longrope():
    """LongRoPE switching to its long factors past the original context (Phi-3's) is refused, naming the field
    (Phi-3's record refuses PhiMoE's: tests/interop/test_phi3.py)."""
    switching = parity.changed_cfg(from_hf(hf_model("phimoe-longrope")).cfg, position__scaling__switch_factors=True)
    parity.check_family_refuses("phimoe", switching, "model.position.scaling.switch_factors")
