"""Hugging Face parity of OPT (archlab/interop/families/opt.py): pre- and post-norm, with or without biases
and norm parameters, and the part OPT-350m needs, ``model.embedding_dim`` (embeddings narrower or wider
than d_model, projected in and out: tests/test_model.py checks the part itself), which only OPT holds.

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1) give HF eager's float32
logits; archlab -> HF -> archlab gives back every tensor bit for bit (a pre-norm OPT with biases is GPT-2's
layout, which exports as GPT-2: OPT's record still writes it); greedy and left-padded batched decoding
equal HF ``generate``; a save_pretrained directory loads; archlab layouts (post-norm, a narrower
embedding) export to OPT; what it cannot hold is refused naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, families_of_its_mixers, logits, max_diff
from helpers.parts import tiny

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

OPT_SMALL = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
OPT_SMALL |= dict(max_position_embeddings=64, ffn_dim=96)
# case -> (transformers model class, config class, config keys, the family archlab's layout maps back to)
HF_CASES = {
    # a pre-norm OPT with biases is GPT-2's layout, which GPT-2 holds exactly (its embedding dropout too)
    "opt-pre": ("OPTForCausalLM", "OPTConfig", OPT_SMALL, "gpt2"),
    "opt-pre-no-bias-untied": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(OPT_SMALL, enable_bias=False, tie_word_embeddings=False),
        "opt",
    ),
    "opt-post-no-norm-parameters": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(OPT_SMALL, do_layer_norm_before=False, layer_norm_elementwise_affine=False),
        "opt",
    ),
    "opt-post-gelu": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(OPT_SMALL, do_layer_norm_before=False, activation_function="gelu"),
        "opt",
    ),
    # opt-350m's layout: post-norm, no final norm, embeddings of 32 projected in and out of 64
    "opt-350m-layout": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(OPT_SMALL, do_layer_norm_before=False, word_embed_proj_dim=32),
        "opt",
    ),
    "opt-pre-wider-embeddings-untied": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(OPT_SMALL, word_embed_proj_dim=80, tie_word_embeddings=False),
        "opt",
    ),
}
NANO = ["model=nano", "model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.d_model=64"]
# archlab layouts no earlier family held -> the class they export to
LAYOUT_CASES = {
    "post-norm": [*NANO, "model/block=post"],
    "post-norm-no-biases-relu": [
        *NANO,
        "model/block=post",
        "model/mlp=relu",
        "model.attention.qkv_bias=false",
        "model.attention.out_bias=false",
        "model.mlp.bias=false",
    ],
    "narrower-embeddings": [*NANO, "model.embedding_dim=48", "model.head.tied=false"],
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_maps_back(case):
    """HF eager's logits, and archlab -> HF (the class the layout maps to) -> archlab bit for bit."""
    hf = hf_model(case)
    model = parity.check_from_hf(hf, HF_CASES[case][3])
    if HF_CASES[case][3] == hf.config.model_type:
        parity.check_back_and_again(hf, model, **ATTN)


def test_opt_record_writes_a_layout_gpt2_also_holds():
    """The OPT record alone converts the pre-norm, biased layout (which exports as GPT-2) to OPT: HF's logits."""
    model = from_hf(hf_model("opt-pre", seed=2))
    back = parity.record_to_hf(model, "opt", **ATTN)
    assert max_diff(logits(back), logits(model)) <= TOL
    assert config_from_hf(back.config) == model.cfg


def test_from_hf_reads_the_family_s_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    post, proj = cfgs["opt-post-gelu"], cfgs["opt-350m-layout"]
    assert (post.block.kind, post.mlp.kind, post.mlp.approximate, post.norm.eps) == ("post", "gelu", "none", 1e-5)
    assert (proj.embedding_dim, proj.d_model, cfgs["opt-pre"].embedding_dim) == (32, 64, None)
    assert (cfgs["opt-post-no-norm-parameters"].norm.affine, post.norm.affine) == (False, True)
    no_bias = cfgs["opt-pre-no-bias-untied"]
    assert (no_bias.attention.qkv_bias, no_bias.attention.out_bias, no_bias.mlp.bias, no_bias.head.tied) == (
        False,
        False,
        False,
        False,
    )


@pytest.mark.parametrize("case", ["opt-350m-layout"])
def test_greedy_and_padded_generation_match_hf_generate(case):
    parity.check_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["opt-350m-layout"])
def test_save_pretrained_directory_loads_and_saves_again(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=5), tmp_path, **ATTN)


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_archlab_layout_exports_to_the_family_and_back_bit_for_bit(case):
    parity.check_exports(compose_model(LAYOUT_CASES[case]), "OPTForCausalLM", **ATTN)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ([*NANO, "model/block=post", "model.mlp.bias=false"], "model.mlp.bias"),  # one enable_bias
        ([*NANO, "model/block=post", "model/position=rope"], "model.block.kind"),  # post-norm: learned positions
        ([*NANO, "model.embedding_dim=48", "model.dropout=0.1", "model.norm.eps=1e-6"], "model.norm.eps"),
    ],
)
def test_layouts_the_family_cannot_hold_are_refused_naming_the_field(overrides, field):
    parity.check_refuses(lambda: config_to_hf(compose_model(overrides)), field, "Hugging Face")


@pytest.mark.parametrize(
    "keys, field",
    [
        (dict(OPT_SMALL, layerdrop=0.1), "OPTConfig.layerdrop"),
        (dict(OPT_SMALL, _remove_final_layer_norm=True), "OPTConfig._remove_final_layer_norm"),
        (dict(OPT_SMALL, activation_function="quick_gelu"), "OPTConfig.activation_function"),
    ],
)
def test_hf_settings_archlab_cannot_hold_are_refused_naming_the_key(keys, field):
    parity.check_refuses(lambda: config_from_hf(transformers.OPTConfig(**keys)), field)


def test_every_other_family_refuses_embedding_dim():
    cfg = validate(tiny(embedding_dim=16))
    for name, family in families_of_its_mixers(cfg).items():
        fields = {p.field for p in family.problems(cfg)}
        assert ("model.embedding_dim" in fields) == (name != "opt"), name
