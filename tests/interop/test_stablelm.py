"""Hugging Face parity of StableLM (archlab/interop/families/stablelm.py): the 2-1.6B layout (partial RoPE,
q/k/v biases) and the 2-12B one (a parallel block, per-head QK LayerNorms without a shift, which
``model.attention.qk_norm_bias`` holds; only StableLM among the families).

Tiny random models give the same float32 logits in archlab and in transformers' eager implementation
(every parameter redrawn: biases and norm scales 0.5 + N(0, 0.3²), far from 0 and 1), from HF to archlab
and from archlab layouts to HF; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and
left-padded batched decoding equal HF ``generate``; a save_pretrained directory loads; what StableLM
cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, layout

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "stablelm-2-1.6b": (
        "StableLmForCausalLM",
        "StableLmConfig",
        dict(SMALL, num_key_value_heads=4, use_qkv_bias=True),
    ),
    "stablelm-2-12b": (
        "StableLmForCausalLM",
        "StableLmConfig",
        dict(SMALL, num_key_value_heads=2, use_parallel_residual=True, qk_layernorm=True, tie_word_embeddings=True),
    ),
}
STABLELM = ["model/mlp=swiglu", "model.mlp.bias=false", "model.attention.out_bias=false"]
STABLELM += ["model.position.rotary_fraction=0.25"]
# case -> archlab overrides of helpers.hf.layout's base that only StableLM holds
LAYOUTS = {
    "pre-norm-layernorm-gated-partial-rope": [*STABLELM],
    "parallel-gated-per-head-qk-layernorm": [
        *STABLELM,
        "model/block=parallel",
        "model.attention.n_kv_head=2",
        "model.attention.qkv_bias=false",
        "model.attention.qk_norm=head",
        "model.attention.qk_norm_per_head_scale=true",
        "model.attention.qk_norm_bias=false",
    ],
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        only=parity.ROUND_TRIP_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    small = from_hf(hf_model("stablelm-2-1.6b")).cfg
    assert (small.position.rotary_fraction, small.attention.qkv_bias, small.attention.out_bias) == (0.25, True, False)
    assert (small.block.kind, small.mlp.kind, small.attention.qk_norm) == ("pre", "swiglu", "none")
    cfg = from_hf(hf_model("stablelm-2-12b")).cfg
    big = cfg.attention
    assert (cfg.block.kind, cfg.block.shared_norm) == ("parallel", True)
    assert (big.qk_norm, big.qk_norm_per_head_scale, big.qk_norm_bias, cfg.norm.bias) == ("head", True, False, True)


@pytest.mark.parametrize("case", ["stablelm-2-12b"])
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt: the same ids and step logits as HF."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["stablelm-2-12b"])
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch: the same continuations and step logits as HF."""
    parity.check_padded_generation(hf_model(case, seed=6))


@pytest.mark.parametrize("case", ["stablelm-2-12b"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_archlab_layout_to_hf_to_archlab_is_bit_identical(case):
    """An archlab layout that only StableLM holds converts to its HF class with the same logits, and back
    with every tensor bit for bit."""
    parity.check_exports(layout(*LAYOUTS[case]), "StableLmForCausalLM", "stablelm", **ATTN)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ([*STABLELM, "model.attention.qk_norm=head"], "model.attention.qk_norm_per_head_scale"),
        (
            [*STABLELM, "model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true"],
            "model.attention.qk_norm_bias",
        ),
        ([*STABLELM, "model.attention.out_bias=true"], "model.attention.out_bias"),
        ([*STABLELM, "model/block=parallel", "model.block.shared_norm=false"], "model.block.shared_norm"),
    ],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    parity.check_family_refuses("stablelm", layout(*overrides), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("stablelm-2-12b", dict(hidden_dropout=0.1), "StableLmConfig.hidden_dropout"),
        (
            "stablelm-2-1.6b",
            dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
            "StableLmConfig.rope_parameters.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


def test_every_other_family_refuses_qk_norm_bias():
    """Only StableLM holds a QK-norm whose shift differs from the model's norms' (the FEATURES entry)."""
    cfg = layout("model.attention.qk_norm=head", "model.attention.qk_norm_bias=false")
    assert parity.families_holding(cfg, {"model.attention.qk_norm_bias"}) == {"stablelm"}
