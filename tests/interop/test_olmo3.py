"""Hugging Face parity of OLMo 3 (archlab/interop/families/olmo3.py), a dense family whose layers differ: OLMo
2's layers, three local ones to a global one by default, each type with its own RoPE base and scaling (a
linear scaling on the global layers).

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1; GQA; sequences longer than every window of 4) gives the same float32 logits in archlab and
in transformers' eager implementation, from HF to archlab and from an archlab layout (olmo3-local-global,
shrunk) to HF; archlab -> HF -> archlab gives back every tensor bit for bit and the same layer_types; greedy
decoding, alone and in a left-padded batch, equals HF ``generate``; what the family cannot hold is refused,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WIDTHS, WINDOW

from archlab.config import ModelConfig
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
LAYERS = dict(SMALL, num_hidden_layers=4, num_key_value_heads=2)  # four layers, grouped heads
PER_TYPE_ROPE = {
    S: {"rope_type": "default", "rope_theta": 10000.0},
    F: {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0},
}
# case -> (model class, config class, config keys)
HF_CASES = {
    # three local layers, one global (OLMo 3's default layout), the global RoPE scaled
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config", dict(LAYERS, sliding_window=WINDOW, rope_parameters=PER_TYPE_ROPE)),
}
OLMO3 = ["model=olmo2-7b", "model/layers=local_global", "+model.layers.kinds.global.position.scaling.kind=linear"]
OLMO3 += ["+model.layers.kinds.global.position.scaling.factor=2.0"]
LOCAL_GLOBAL = [
    "model.n_layer=3",
    "model.layers.pattern=[local,global]",
    f"model.layers.kinds.local.attention.window={WINDOW}",
]
# the archlab layout of olmo3-local-global (overrides), shrunk
LAYOUT = [*OLMO3, *WIDTHS, *LOCAL_GLOBAL]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


def layout(**changes) -> ModelConfig:
    """The layout (Hydra composes it once: the slowest step of a refusal), its kinds and its own fields
    changed as ``helpers.hf.with_kinds`` does."""
    return parity.with_kinds(parity.composed(*LAYOUT), **changes)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_from_hf_gives_hf_logits_and_back",)))


def test_from_hf_reads_the_family_s_layers():
    local, glob = (WINDOW, "rope", 1e4, "none"), (None, "rope", 5e5, "linear")
    assert parity.layer_positions(config_from_hf(parity.hf_config(HF_CASES, "olmo3"))) == [local, local, local, glob]
    # a layout no pattern from the start gives: the first layers by first
    qwen_like = config_from_hf(parity.hf_config(HF_CASES, "olmo3", layer_types=[F, F, S, S]))
    assert (qwen_like.layers.first, qwen_like.layers.pattern) == (["global", "global"], ["local"])


@pytest.mark.parametrize("case", ["olmo3"])
def test_greedy_generation_matches_hf_generate(case):
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["olmo3"])
def test_padded_batch_generation_matches_hf_generate(case):
    parity.check_padded_generation(hf_model(case, seed=6))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout (olmo3-local-global) converts to Olmo3ForCausalLM with the same logits, and back to archlab
    with every tensor bit for bit and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "Olmo3ForCausalLM", **ATTN)
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize(
    "changes, field",
    [
        # a part that differs per layer beyond window and position
        (dict(local={"attention": {"n_kv_head": 4}}), "model.layers.kinds.local.attention.n_kv_head"),
        # NoPE where the family has RoPE
        (dict(global_={"position": {"kind": "none"}}), "model.layers.kinds.global.position.kind"),
    ],
)
def test_the_family_refuses_what_it_cannot_express(changes, field):
    """The family's record (its ``check``, which config_to_hf and archlab-export call) names the field: a
    layer kind's own where the kind sets it."""
    parity.check_family_refuses("olmo3", layout(**changes), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("olmo3", dict(layer_types=[S, F, "chunked_attention", F]), "Olmo3Config.layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)
