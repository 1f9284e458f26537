"""Hugging Face parity of Llama 4, text (archlab/interop/families/llama4.py), a mixture-of-experts family whose
layers differ: RoPE layers chunked with the L2 QK-norm and NoPE layers with the query temperature (iRoPE),
MoE and dense layers interleaved, or each given layer by layer, read into ``model.layers`` kinds.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), vectors 0.5 + N(0, 0.3²); 12 tokens past
every chunk of 4 and past the temperature's floor of 4) give the same float32 logits in archlab and in
transformers' eager attention and experts, from HF to archlab and from the shrunk preset to HF; archlab ->
HF -> archlab gives back the config, the per-layer description and every tensor bit for bit; greedy
decoding (left-padded batches too) equals HF ``generate``; each per-layer part changes the logits; a
save_pretrained directory loads; what Llama 4 cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW, changed_cfg

from archlab import compose_model
from archlab.config import LayersConfig
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, **NO_TOKENS)
SMALL |= dict(num_experts_per_tok=2, intermediate_size=32)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # iRoPE: layers 0-2 RoPE, chunked, L2 QK-norm; layer 3 NoPE with the temperature; MoE on 1 and 3
    "llama4-irope-interleaved": (
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        dict(
            SMALL,
            num_hidden_layers=4,
            intermediate_size_mlp=48,
            interleave_moe_layer_step=2,
            attention_chunk_size=WINDOW,
            floor_scale=4,
            attn_scale=0.5,
            rope_parameters=dict(rope_type="default", rope_theta=100.0),
        ),
    ),
    # layer by layer: NoPE on layer 1, a chunked NoPE layer 2, no QK-norm, no temperature, MoE on 0 and 2,
    # llama3 RoPE scaling, top-1 routing, a tied head
    "llama4-listed-llama3": (
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        dict(
            SMALL,
            num_hidden_layers=3,
            intermediate_size_mlp=40,
            num_experts_per_tok=1,
            no_rope_layers=[1, 0, 0],
            layer_types=["chunked_attention", "full_attention", "chunked_attention"],
            moe_layers=[0, 2],
            attention_chunk_size=WINDOW,
            use_qk_norm=False,
            attn_temperature_tuning=False,
            attention_bias=True,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=100.0,
                factor=4.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
}
SCOUT = "llama4-scout-17b-16e"
TINY = ["model.vocab_size=96", "model.context_length=64", "model.d_model=64", "model.attention.n_head=4"]
TINY += ["model.attention.n_kv_head=2", "model.attention.head_dim=16", "model.mlp.routing.n_experts=4"]
# the preset shrunk, its routing, chunks and temperature kept
PRESET = [
    "model.n_layer=4",
    "model.mlp.expert_d_ff=32",
    "model.mlp.d_ff=48",
    "model.layers.kinds.rope.attention.chunk=4",
]
PRESET += [
    "model.layers.kinds.nope.attention.query_scale_length=4",
    "model.layers.kinds.nope.attention.query_scale_beta=0.5",
]
# Llama 4 Scout's layers with the first one dense (one SwiGLU of d_ff) instead of a MoE
SCOUT_DENSE_FIRST = LayersConfig(
    kinds={
        **parity.composed(f"model={SCOUT}").layers.kinds,
        "rope_dense": {**parity.composed(f"model={SCOUT}").layers.kinds["rope"], "mlp": {"kind": "swiglu"}},
    },
    first=["rope_dense"],
    pattern=["rope", "rope", "nope", "rope"],
)
# changed_cfg's field -> the value that takes the part away
PARTS = [
    ("kinds__rope__attention__chunk", None),  # the RoPE layers' chunks
    ("kinds__rope__attention__qk_norm", "none"),  # their L2 QK-norm
    ("kinds__nope__attention__query_scale_beta", None),  # the NoPE layer's temperature
    ("kinds__nope__position__kind", "rope"),  # its missing RoPE
]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def changed(**fields):
    """The Llama 4 Scout preset with ``fields`` set (``helpers.hf.changed_cfg``)."""
    return changed_cfg(parity.composed(f"model={SCOUT}"), **fields)


def test_from_hf_reads_each_layer_into_a_kind():
    irope = config_from_hf(parity.hf_config(HF_CASES, "llama4-irope-interleaved"))
    assert irope.layers.kinds == {
        "rope_dense": {"attention": {"chunk": WINDOW, "qk_norm": "l2"}, "mlp": {"kind": "swiglu"}},
        "rope": {"attention": {"chunk": WINDOW, "qk_norm": "l2"}},
        "nope": {
            "position": {"kind": "none"},
            "attention": {"query_scale_beta": 0.5, "query_scale_length": 4, "query_scale_offset": 1},
        },
    }
    assert (irope.layers.first, irope.layers.pattern) == ([], ["rope_dense", "rope", "rope_dense", "nope"])
    assert (irope.mlp.d_ff, irope.mlp.expert_d_ff, irope.mlp.routing.weight_input, irope.position.pairing) == (
        48,
        32,
        True,
        "interleaved",
    )
    listed = config_from_hf(parity.hf_config(HF_CASES, "llama4-listed-llama3"))
    assert listed.layers.kinds == {
        "rope": {"attention": {"chunk": WINDOW}},  # no QK-norm: use_qk_norm false
        "nope_dense": {"position": {"kind": "none"}, "mlp": {"kind": "swiglu"}},
        "nope_chunked": {"position": {"kind": "none"}, "attention": {"chunk": WINDOW}},
    }
    assert listed.layers.pattern == ["rope", "nope_dense", "nope_chunked"]
    assert (listed.position.scaling.kind, listed.attention.qkv_bias, listed.mlp.routing.top_k) == ("llama3", True, 1)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_logits_and_hf_to_archlab_to_hf_and_back(case):
    """archlab's logits equal HF's; the archlab model converts back to the same HF class with the same
    per-layer description and logits, and from there to an archlab model with the same config and
    bit-identical tensors."""
    parity.check_per_layer_round_trip(hf_model(case), HF_CASES[case][2], **EAGER)


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit, the same counts and the kinds from_hf names."""
    model, hf = parity.check_exports(compose_model([f"model={SCOUT}", *TINY, *PRESET]), "Llama4ForCausalLM", **EAGER)
    assert from_hf(hf).cfg.layers == model.cfg.layers


def test_each_per_layer_part_changes_the_logits():
    """The same weights with one part taken away (on a layer kind, or on every layer) give other logits:
    the parity above depends on each."""
    parity.check_each_part_changes_logits(from_hf(hf_model("llama4-irope-interleaved")), PARTS)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_generation_matches_hf_generate",)))


def test_save_pretrained_directories_round_trip(tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model("llama4-irope-interleaved", seed=7), tmp_path, **EAGER)


# a dense first layer as a kind exports alike
@pytest.mark.parametrize("fields", [{}, dict(layers=SCOUT_DENSE_FIRST)])
def test_the_layout_picks_the_family(fields):
    assert type(config_to_hf(changed(**fields))).__name__ == "Llama4TextConfig"


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(kinds__nope__attention__qk_norm="l2"), "model.layers.kinds.nope.attention.qk_norm"),
        (dict(kinds__rope__attention__qk_norm="head"), "model.layers.kinds.rope.attention.qk_norm"),
        (dict(kinds__rope__attention__query_scale_beta=0.1), "model.layers.kinds.rope.attention.query_scale_beta"),
        (dict(kinds__nope__attention__query_scale_offset=0), "model.layers.kinds.nope.attention.query_scale_offset"),
        (dict(kinds__nope__attention__chunk=16), "model.layers.kinds.nope.attention.chunk"),
        (dict(kinds__nope__attention__window=16), "model.layers.kinds.nope.attention.window"),
        (dict(kinds__nope__position__kind="alibi"), "model.layers.kinds.nope.position.kind"),
        (dict(mlp__n_shared_experts=2), "model.mlp.n_shared_experts"),
        (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        (dict(mlp__routing__weight_input=False), "model.mlp.routing.weight_input"),
        (dict(position__pairing="half"), "model.position.pairing"),
        (dict(kinds__nope__mlp__kind="geglu"), "model.layers.kinds.nope.mlp.kind"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    parity.check_refuses(lambda: config_to_hf(changed(**fields)), field, "Hugging Face")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(router_jitter_noise=0.1), "Llama4TextConfig.router_jitter_noise"),
        (dict(hidden_act="relu"), "Llama4TextConfig.hidden_act"),
        (dict(moe_layers=[]), "Llama4TextConfig.moe_layers"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    config = parity.hf_config(HF_CASES, "llama4-irope-interleaved", **changes)
    parity.check_refuses(lambda: config_from_hf(config), field)
