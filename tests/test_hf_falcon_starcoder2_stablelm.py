"""Hugging Face parity of Falcon (the old decoder architecture, parallel with MQA and sequential; the new
one, GQA with two norms or one; Falcon-RW's ALiBi), StarCoder 2 (GQA, a sliding window, with and without
biases) and StableLM (the 2-1.6B layout: partial RoPE, q/k/v biases; the 2-12B layout: a parallel block,
per-head QK LayerNorms without a shift), and the field that 2-12B needs, ``model.attention.qk_norm_bias``.

Tiny random models of each give the same float32 logits in archlab and in transformers (every parameter
redrawn: biases and norm scales 0.5 + N(0, 0.3²), far from 0 and 1), from HF to archlab and from archlab
layouts to HF; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and left-padded batched
decoding equal HF ``generate``. Falcon-RW is compared with transformers' sdpa path, which adds its ALiBi
bias once, as the checkpoints were trained; its eager path adds it twice (shown below)."""

from typing import cast

import pytest
import torch
from helpers import hf as parity
from helpers.hf import CTX, HF_SIZES, NO_TOKENS, TOL, WINDOW, families_of_its_mixers, logits, max_diff, randomize
from helpers.parts import short_fit
from omegaconf import OmegaConf

from archlab import ConfigError, build_model, count_params
from archlab.config import MLP_OPTIONS, to_model_config
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf, hf_family
from archlab.nn.mixers.attention import CausalSelfAttention
from archlab.nn.norms import LayerNorm
from archlab.nn.validation import entries, ignored, validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
FALCON = dict(SMALL, ffn_hidden_size=96)
CODER = dict(SMALL, intermediate_size=96)
STABLE = dict(SMALL, intermediate_size=96)
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
    "starcoder2-gqa-window": (
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
        dict(CODER, num_key_value_heads=2, sliding_window=WINDOW),
    ),
    "starcoder2-gqa-no-bias": (
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
        dict(CODER, num_key_value_heads=2, use_bias=False, hidden_act="gelu", tie_word_embeddings=False),
    ),
    "stablelm-2-1.6b": (
        "StableLmForCausalLM",
        "StableLmConfig",
        dict(STABLE, num_key_value_heads=4, use_qkv_bias=True),
    ),
    "stablelm-2-12b": (
        "StableLmForCausalLM",
        "StableLmConfig",
        dict(STABLE, num_key_value_heads=2, use_parallel_residual=True, qk_layernorm=True, tie_word_embeddings=True),
    ),
}
EAGER, SDPA = dict(attn_implementation="eager"), dict(attn_implementation="sdpa")


def impl(case: str) -> dict:
    """transformers' eager attention; Falcon-RW's sdpa path, the one that adds its ALiBi bias once."""
    return SDPA if "alibi" in case else EAGER


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **impl(case))


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits(case):
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == hf.config.model_type  # the layout read maps back to the same family


def test_a_falcon_layout_another_family_holds_exports_there():
    """Falcon's sequential block with a key and value per head and biases is GPT-NeoX's pre-norm layout:
    ``family_of`` takes the family the layout routes to where that holds it."""
    keys = dict(FALCON, multi_query=False, parallel_attn=False, bias=True)
    hf = randomize(transformers.FalconForCausalLM(transformers.FalconConfig(**keys, **EAGER)), 1)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "gpt_neox"
    parity.check_to_hf_and_back(model, "GPTNeoXForCausalLM", attn_implementation="eager")


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


def test_from_hf_reads_each_family_s_parts():
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
    coder = cfgs["starcoder2-gqa-window"]
    assert (coder.norm.kind, coder.block.kind, coder.attention.window, coder.mlp.kind, coder.mlp.approximate) == (
        "layernorm",
        "pre",
        WINDOW,
        "gelu",
        "tanh",
    )
    plain = cfgs["starcoder2-gqa-no-bias"]
    assert (plain.attention.n_kv_head, plain.attention.qkv_bias, plain.mlp.bias, plain.attention.window) == (
        2,
        False,
        False,
        None,
    )
    small = cfgs["stablelm-2-1.6b"]
    assert (small.position.rotary_fraction, small.attention.qkv_bias, small.attention.out_bias) == (0.25, True, False)
    assert (small.block.kind, small.mlp.kind, small.attention.qk_norm) == ("pre", "swiglu", "none")
    big = cfgs["stablelm-2-12b"].attention
    assert (cfgs["stablelm-2-12b"].block.kind, cfgs["stablelm-2-12b"].block.shared_norm) == ("parallel", True)
    assert (big.qk_norm, big.qk_norm_per_head_scale, big.qk_norm_bias, cfgs["stablelm-2-12b"].norm.bias) == (
        "head",
        True,
        False,
        True,
    )


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors."""
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **impl(case))


GENERATION = ["falcon-7b-mqa-parallel", "falcon-40b-new-gqa", "falcon-rw-alibi", "starcoder2-gqa-window"]
GENERATION += ["stablelm-2-12b"]


@pytest.mark.parametrize("case", GENERATION)
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt, past the window of 4: the same ids and step logits as HF."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", GENERATION)
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch (ALiBi's key positions counted from each
    row's first token, as Falcon-RW's): the same continuations and step logits as HF."""
    parity.check_padded_generation(hf_model(case, seed=6))


@pytest.mark.parametrize("case", ["falcon-40b-new-gqa", "falcon-rw-alibi", "starcoder2-gqa-window", "stablelm-2-12b"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **impl(case))


# a tiny LayerNorm, pre-norm, RoPE, tanh-GELU layout with every bias and a tied head (ModelConfig's defaults)
BASE = dict(vocab_size=96, context_length=CTX, n_layer=2, d_model=64, position={"kind": "rope"})
BASE |= dict(attention={"n_head": 4}, mlp={"d_ff": 96, "approximate": "tanh"})


def layout(*overrides: str):
    """``BASE`` with ``overrides`` (``model.a.b=value``; ``model/mlp=swiglu`` sets the kind, as its option
    file, and its section keeps the fields swiglu has: GELU's approximate goes), validated; no Hydra
    composition, for speed."""
    dots = []
    for override in overrides:
        key, value = override.split("=", 1)
        if key.startswith("model/"):
            dots.append(f"{key.removeprefix('model/')}.kind={value}")
        else:
            dots.append(f"{key.removeprefix('model.')}={value}")
    data = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(BASE), OmegaConf.from_dotlist(dots)))
    data["mlp"] = MLP_OPTIONS.own_fields(data["mlp"], data["mlp"].get("kind", "gelu"))
    return validate(to_model_config(data))


NO_BIAS = ["model.attention.qkv_bias=false", "model.attention.out_bias=false", "model.mlp.bias=false"]
STABLELM = ["model/mlp=swiglu", "model.mlp.bias=false", "model.attention.out_bias=false"]
STABLELM += ["model.position.rotary_fraction=0.25"]
# case -> (archlab overrides, the HF class the layout maps to)
LAYOUTS = {
    # a parallel block with one norm and no biases: GPT-J wants MLP biases, Phi q/k/v biases
    "parallel-shared-norm-mqa-no-bias": (
        ["model/block=parallel", "model.attention.n_kv_head=1", *NO_BIAS],
        "FalconForCausalLM",
    ),
    # two norms and GQA: GPT-NeoX has a key and value per head; Falcon's new architecture
    "parallel-two-norms-gqa": (
        ["model/block=parallel", "model.block.shared_norm=false", "model.attention.n_kv_head=2"],
        "FalconForCausalLM",
    ),
    "parallel-shared-norm-gqa": (
        ["model/block=parallel", "model.attention.n_kv_head=2", *NO_BIAS],
        "FalconForCausalLM",
    ),
    "alibi-falcon-rw": (
        ["model/position=alibi", "model.position.alibi_scale=0.25", "model.position.alibi_rounding=bf16"],
        "FalconForCausalLM",
    ),
    "pre-norm-layernorm-gqa-window": (
        ["model.attention.n_kv_head=2", f"model.attention.window={WINDOW}"],
        "Starcoder2ForCausalLM",
    ),
    "pre-norm-layernorm-gated-partial-rope": ([*STABLELM], "StableLmForCausalLM"),
    "parallel-gated-per-head-qk-layernorm": (
        [
            *STABLELM,
            "model/block=parallel",
            "model.attention.n_kv_head=2",
            "model.attention.qkv_bias=false",
            "model.attention.qk_norm=head",
            "model.attention.qk_norm_per_head_scale=true",
            "model.attention.qk_norm_bias=false",
        ],
        "StableLmForCausalLM",
    ),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_archlab_layout_to_hf_to_archlab_is_bit_identical(case):
    """An archlab layout that only this family holds converts to its HF class with the same logits
    (Falcon-RW's ALiBi: transformers' sdpa path), and back with every tensor bit for bit."""
    overrides, expected_class = LAYOUTS[case]
    model = randomize(build_model(layout(*overrides)), seed=3)
    parity.check_to_hf_and_back(model, expected_class, **impl(case))


@pytest.mark.parametrize(
    "overrides, family, field",
    [
        (["model/block=parallel", "model.mlp.bias=false"], "falcon", "model.mlp.bias"),
        (["model.attention.n_kv_head=2"], "falcon", "model.attention.n_kv_head"),  # sequential: old arch
        (["model/position=alibi"], "falcon", "model.position.alibi_scale"),
        (["model/block=parallel", "model.attention.dropout=0.1"], "falcon", "model.attention.dropout"),
        (["model.position.rotary_dim=8"], "starcoder2", "model.position.rotary_dim"),
        (["model.attention.out_bias=false"], "starcoder2", "model.attention.out_bias"),
        (["model/block=parallel"], "starcoder2", "model.block.kind"),
        ([*STABLELM, "model.attention.qk_norm=head"], "stablelm", "model.attention.qk_norm_per_head_scale"),
        (
            [*STABLELM, "model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true"],
            "stablelm",
            "model.attention.qk_norm_bias",
        ),
        ([*STABLELM, "model.attention.out_bias=true"], "stablelm", "model.attention.out_bias"),
        (
            [*STABLELM, "model/block=parallel", "model.block.shared_norm=false"],
            "stablelm",
            "model.block.shared_norm",
        ),
    ],
)
def test_each_family_refuses_what_it_cannot_hold(overrides, family, field):
    with pytest.raises(ConfigError) as err:
        FAMILIES[family].check(layout(*overrides))
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


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
        ("starcoder2-gqa-window", dict(hidden_act="silu"), "Starcoder2Config.hidden_act"),
        ("stablelm-2-12b", dict(hidden_dropout=0.1), "StableLmConfig.hidden_dropout"),
        (
            "stablelm-2-1.6b",
            dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
            "StableLmConfig.rope_parameters.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(_hf_config(case, **changes))
    assert err.value.field == field


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
    rw = ["model/position=alibi", "model.position.alibi_scale=0.25", "model.position.alibi_rounding=bf16"]
    assert flags(*rw, "model.attention.n_kv_head=1", *NO_BIAS) == (False, True, False, None, True)


# ---------------------------------------------------------------- model.attention.qk_norm_bias

QK = ["model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true", "model/position=rope"]


def test_qk_norm_bias_false_drops_the_qk_norms_shift_alone():
    """qk_norm_bias=false: the QK-norms have no bias while every other LayerNorm keeps its own; H·hd + KV·hd
    fewer parameters per layer (per-head scale) or 2·hd (shared), in the closed form and the model built."""
    for per_head, removed in ((True, (4 + 2) * 16), (False, 2 * 16)):
        base = ["model.attention.n_kv_head=2", "model.attention.qk_norm=head"]
        base += [f"model.attention.qk_norm_per_head_scale={str(per_head).lower()}"]
        cfg, without = layout(*base), layout(*base, "model.attention.qk_norm_bias=false")
        model = build_model(without, device="meta")
        attn = cast(CausalSelfAttention, model.blocks[0].attn)
        q_norm, k_norm = cast(LayerNorm, attn.q_norm), cast(LayerNorm, attn.k_norm)
        assert (
            q_norm.bias is None and k_norm.bias is None and cast(LayerNorm, model.blocks[0].attn_norm).bias is not None
        )
        assert count_params(cfg)["total"] - count_params(without)["total"] == 2 * removed
        assert count_params(without)["total"] == sum(p.numel() for p in model.parameters())
        kept = layout(*base, "model.attention.qk_norm_bias=true")  # as model.norm.bias: the same count
        assert count_params(kept)["total"] == count_params(cfg)["total"]


def test_qk_norm_bias_equals_stablelm_s_per_head_layernorms():
    """The attention's QK-norm with qk_norm_bias=false equals transformers' StableLmLayerNormPerHead
    (bias=False, as StableLM 2 builds it) on every head; with the bias kept (null, beside model.norm.bias)
    it adds the shift, and the output moves."""
    from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead

    cfg = layout(*QK, "model.attention.qk_norm_bias=false")
    model = build_model(cfg)
    randomize(model, seed=5)
    q_norm = cast(LayerNorm, cast(CausalSelfAttention, model.blocks[0].attn).q_norm)
    hf = StableLmLayerNormPerHead(16, 4, eps=cfg.norm.eps)
    with torch.no_grad():
        for h, norm in enumerate(hf.norms):
            cast(torch.nn.LayerNorm, norm).weight.copy_(cast(torch.nn.LayerNorm, q_norm).weight.view(4, 16)[h])
    x = torch.randn(2, 4, 7, 16, generator=torch.Generator().manual_seed(0))  # [B, H, T, hd], as StableLM's
    torch.testing.assert_close(q_norm.per_head(x.transpose(1, 2)).transpose(1, 2), hf(x))
    with_bias = randomize(build_model(layout(*QK)), seed=5)
    without = build_model(cfg, device="meta")
    state = {k: v for k, v in with_bias.state_dict().items() if not k.endswith(("q_norm.bias", "k_norm.bias"))}
    without.load_state_dict(state, assign=True)
    assert max_diff(logits(with_bias), logits(without.eval())) > 1e-3


@pytest.mark.parametrize(
    "overrides, allowed",
    [
        (["model.attention.qk_norm_bias=false"], "null unless model.attention.qk_norm is head or full"),
        (["model.attention.qk_norm=l2", "model.attention.qk_norm_bias=false"], "qk_norm=l2"),
        (["model.attention.qk_norm=head", "model/norm=rmsnorm", "model.attention.qk_norm_bias=false"], "rmsnorm"),
    ],
)
def test_qk_norm_bias_refusals_name_the_field(overrides, allowed):
    with pytest.raises(ConfigError) as err:
        layout(*overrides)
    assert err.value.field == "model.attention.qk_norm_bias" and allowed in str(err.value)


def test_qk_norm_bias_is_read_described_and_trains():
    cfg = layout(*QK, "model.attention.qk_norm_bias=false")
    assert ignored(cfg) == []
    assert "qk-norm bias false" in entries(cfg).attention.describe(cfg)
    torch.manual_seed(0)
    model = build_model(parity.changed_cfg(cfg, n_layer=1, context_length=16))
    losses = short_fit(model, cfg.vocab_size, 16)
    assert losses[-1] < 0.9 * losses[0]


def test_every_other_family_refuses_qk_norm_bias():
    """Only StableLM holds a QK-norm whose shift differs from the model's norms' (the FEATURES entry)."""
    cfg = layout("model.attention.qk_norm=head", "model.attention.qk_norm_bias=false")
    families = families_of_its_mixers(cfg)
    holding = {
        n for n, f in families.items() if "model.attention.qk_norm_bias" not in {p.field for p in f.problems(cfg)}
    }
    assert holding == {"stablelm"}
