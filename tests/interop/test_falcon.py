"""Hugging Face parity of Falcon (archlab/interop/families/falcon.py): the old decoder architecture
(parallel with MQA, or sequential), the new one (GQA with two norms or one) and Falcon-RW's ALiBi.

Tiny random models give the same float32 logits in archlab and in transformers (every parameter redrawn:
biases and norm scales 0.5 + N(0, 0.3²), far from 0 and 1), from HF to archlab and from archlab layouts to
HF; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and left-padded batched decoding
equal HF ``generate``; save_pretrained directories load; what Falcon cannot hold is refused both ways,
naming the field. Falcon-RW is compared with transformers' sdpa path, which adds its ALiBi bias once, as
the checkpoints were trained; its eager path adds it twice (shown below)."""

import pytest
from helpers import hf as parity
from helpers.hf import HF_SIZES, NO_TOKENS, TOL, layout, logits, max_diff, randomize

from archlab import build_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

FALCON = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, ffn_hidden_size=96, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "falcon-7b-mqa-parallel": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=True, bias=False)),
    "falcon-mqa-sequential-untied": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, multi_query=True, parallel_attn=False, bias=True, tie_word_embeddings=False, activation="relu"),
    ),
    "falcon-mha-parallel-bias": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=False, bias=True)),
    "falcon-40b-new-gqa": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2, bias=True),
    ),
    "falcon-new-gqa-one-norm": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
    ),
    "falcon-rw-alibi": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, alibi=True, multi_query=False, parallel_attn=False, bias=True),
    ),
}
EAGER, SDPA = dict(attn_implementation="eager"), dict(attn_implementation="sdpa")
GENERATION = ["falcon-7b-mqa-parallel", "falcon-40b-new-gqa", "falcon-rw-alibi"]
NO_BIAS = ["model.attention.qkv_bias=false", "model.attention.out_bias=false", "model.mlp.bias=false"]
ALIBI_RW = ["model/position=alibi", "model.position.alibi_scale=0.25", "model.position.alibi_rounding=bf16"]
# case -> archlab overrides of helpers.hf.layout's base that only Falcon holds
LAYOUTS = {
    # a parallel block with one norm and no biases: GPT-J wants MLP biases, Phi q/k/v biases
    "parallel-shared-norm-mqa-no-bias": ["model/block=parallel", "model.attention.n_kv_head=1", *NO_BIAS],
    # two norms and GQA: GPT-NeoX has a key and value per head; Falcon's new architecture
    "parallel-two-norms-gqa": ["model/block=parallel", "model.block.shared_norm=false", "model.attention.n_kv_head=2"],
    "parallel-shared-norm-gqa": ["model/block=parallel", "model.attention.n_kv_head=2", *NO_BIAS],
    "alibi-falcon-rw": ALIBI_RW,
}


def impl(case: str) -> dict:
    """transformers' eager attention; Falcon-RW's sdpa path, the one that adds its ALiBi bias once."""
    return SDPA if "alibi" in case else EAGER


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **impl(case))


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_from_hf_gives_hf_logits",)))


def test_a_falcon_layout_another_family_holds_exports_there():
    """Falcon's sequential block with a key and value per head and biases is GPT-NeoX's pre-norm layout:
    ``family_of`` takes the family the layout routes to where that holds it."""
    keys = dict(FALCON, multi_query=False, parallel_attn=False, bias=True)
    hf = randomize(transformers.FalconForCausalLM(transformers.FalconConfig(**keys, **EAGER)), 1)
    model = parity.check_from_hf(hf, "gpt_neox")
    parity.check_to_hf_and_back(model, "GPTNeoXForCausalLM", **EAGER)


def test_falcon_rw_eager_path_adds_the_alibi_bias_twice():
    """transformers' eager FalconAttention adds the bias to the scores before their 1/sqrt(head_dim) and
    again in the mask: archlab with twice Falcon-RW's slope multiplier gives its logits, the layout read
    (the bias once, as the sdpa path and the original modelling_RW.py) does not."""
    hf = parity.hf_case(HF_CASES, "falcon-rw-alibi", 1, **EAGER)
    model = from_hf(hf)
    cfg = model.cfg
    assert (cfg.position.alibi_scale, cfg.position.alibi_rounding) == (0.25, "bf16")  # heads of 16
    twice = parity.changed_cfg(cfg, position__alibi_scale=0.5)
    doubled = build_model(twice, device="meta")
    doubled.load_state_dict(model.state_dict(), assign=True)
    assert max_diff(logits(hf), logits(doubled.eval())) <= TOL
    assert max_diff(logits(hf), logits(model)) > 1e-3


def test_from_hf_reads_the_family_s_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}

    def parts(case):
        c = cfgs[case]
        return (c.block.kind, c.block.shared_norm, c.attention.n_kv_head, c.attention.qkv_bias, c.mlp.bias)

    assert parts("falcon-7b-mqa-parallel") == ("parallel", True, 1, False, False)
    assert parts("falcon-mqa-sequential-untied") == ("pre", True, 1, True, True)
    assert parts("falcon-mha-parallel-bias") == ("parallel", True, 4, True, True)
    assert parts("falcon-40b-new-gqa") == ("parallel", False, 2, True, True)
    assert parts("falcon-new-gqa-one-norm") == ("parallel", True, 2, False, False)
    assert (cfgs["falcon-mqa-sequential-untied"].mlp.kind, cfgs["falcon-mqa-sequential-untied"].head.tied) == (
        "relu",
        False,
    )
    rw = cfgs["falcon-rw-alibi"]
    assert (rw.position.kind, rw.position.alibi_scale, rw.position.alibi_rounding) == ("alibi", 0.25, "bf16")


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors."""
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **impl(case))


@pytest.mark.parametrize("case", GENERATION)
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt: the same ids and step logits as HF."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", GENERATION)
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch (ALiBi's key positions counted from each
    row's first token, as Falcon-RW's): the same continuations and step logits as HF."""
    parity.check_padded_generation(hf_model(case, seed=6))


@pytest.mark.parametrize("case", ["falcon-40b-new-gqa", "falcon-rw-alibi"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **impl(case))


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_archlab_layout_to_hf_to_archlab_is_bit_identical(case):
    """An archlab layout that only Falcon holds converts to its HF class with the same logits (Falcon-RW's
    ALiBi: transformers' sdpa path), and back with every tensor bit for bit."""
    parity.check_exports(layout(*LAYOUTS[case]), "FalconForCausalLM", "falcon", **impl(case))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model/block=parallel", "model.mlp.bias=false"], "model.mlp.bias"),
        (["model.attention.n_kv_head=2"], "model.attention.n_kv_head"),  # sequential: old arch
        (["model/position=alibi"], "model.position.alibi_scale"),
        (["model/block=parallel", "model.attention.dropout=0.1"], "model.attention.dropout"),
    ],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    parity.check_family_refuses("falcon", layout(*overrides), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("falcon-7b-mqa-parallel", dict(hidden_dropout=0.1), "FalconConfig.hidden_dropout"),
        ("falcon-rw-alibi", dict(attention_dropout=0.1), "FalconConfig.attention_dropout"),
        ("falcon-40b-new-gqa", dict(parallel_attn=False), "FalconConfig.parallel_attn"),
        ("falcon-mha-parallel-bias", dict(num_kv_heads=2), "FalconConfig.num_kv_heads"),
        ("falcon-mha-parallel-bias", dict(num_ln_in_parallel_attn=2), "FalconConfig.num_ln_in_parallel_attn"),
        ("falcon-7b-mqa-parallel", dict(activation="silu"), "FalconConfig.activation"),
        (
            "falcon-7b-mqa-parallel",
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
            "FalconConfig.rope_parameters.partial_rotary_factor",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


def test_falcon_writes_each_architecture_s_flags():
    """The old architecture for MHA and MQA (multi_query), the new one for GQA or two norms."""

    def flags(*overrides):
        c = config_to_hf(layout(*overrides))
        return (c.new_decoder_architecture, c.multi_query, c.parallel_attn, c.num_ln_in_parallel_attn, c.alibi)

    assert flags("model/block=parallel", "model.attention.n_kv_head=1", *NO_BIAS) == (False, True, True, None, False)
    assert flags("model/block=parallel", "model.attention.n_kv_head=2", *NO_BIAS) == (True, False, True, 1, False)
    assert flags("model/block=parallel", "model.block.shared_norm=false", "model.attention.n_kv_head=2") == (
        True,
        False,
        True,
        2,
        False,
    )
    assert flags(*ALIBI_RW, "model.attention.n_kv_head=1", *NO_BIAS) == (False, True, False, None, True)
