"""Hugging Face parity of Phi-3, Cohere (Command R), Granite and OLMo 1, and the two parts they brought:
``model.norm.affine`` (OLMo's LayerNorm that learns nothing) and ``model.position.scaling.attention_factor``
(rope_parameters' attention_factor of LongRoPE and YaRN).

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1) give the same float32
logits in archlab and in transformers' eager implementation, GQA throughout and Phi-3's window of 4; Phi-3's
LongRoPE switches to its long factors past an original context of 16, in the logits of 24 tokens and in
greedy decoding that crosses it (transformers re-encodes there, as archlab does). archlab -> HF -> archlab
is bit for bit; save_pretrained directories load; an archlab layout exports to the family holding it;
what a family cannot hold is refused, naming the field.
"""

import math
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS, TOL, WINDOW, V, families_of_its_mixers, logits, max_diff, randomize
from helpers.parts import short_fit, tiny

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.generate import generate
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf, hf_family
from archlab.nn.rope import RoPE, RoPERotation

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
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
    "cohere": (
        "CohereForCausalLM",
        "CohereConfig",
        dict(SMALL, num_key_value_heads=2, use_qk_norm=True, logit_scale=0.3, attention_bias=True),
    ),
    "granite": (
        "GraniteForCausalLM",
        "GraniteConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            embedding_multiplier=3.0,
            residual_multiplier=0.4,
            attention_multiplier=0.3,
            logits_scaling=8.0,
            attention_bias=True,
            mlp_bias=True,
        ),
    ),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(SMALL, num_key_value_heads=2, clip_qkv=0.8, attention_bias=True)),
}
LONG_IDS = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(3))  # past LongRoPE's 16


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits(case):
    """12 tokens and 24 (Phi-3's long factors past 16); the layout read maps back to the same family."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert max_diff(logits(hf, LONG_IDS), logits(model, LONG_IDS)) <= TOL
    assert hf_family(model.cfg) == hf.config.model_type


def test_from_hf_reads_each_family_s_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    w = cfgs["phi3-window"]
    assert (w.attention.window, w.attention.n_kv_head, w.position.rotary_fraction, w.norm.kind) == (
        WINDOW,
        2,
        0.75,
        "rmsnorm",
    )
    p = cfgs["phi3-longrope"].position.scaling
    assert (p.kind, p.original_context, p.factor, p.short_factor, p.long_factor, p.attention_factor) == (
        "longrope",
        16,
        4.0,
        SHORT,
        LONG,
        None,
    )
    p = cfgs["phi3-longrope-attention-factor"].position.scaling
    assert (p.factor, p.attention_factor) == (2.0, 1.3)
    c = cfgs["cohere"]
    assert (c.block.kind, c.norm.bias, c.position.pairing, c.head.logit_scale) == (
        "parallel",
        False,
        "interleaved",
        0.3,
    )
    assert (c.attention.qk_norm, c.attention.qk_norm_per_head_scale, c.attention.out_bias) == ("head", True, True)
    g = cfgs["granite"]
    assert (g.embedding_multiplier, g.block.residual_multiplier, g.attention.scale, g.head.logit_scale) == (
        3.0,
        0.4,
        0.3,
        0.125,
    )
    o = cfgs["olmo"]
    assert (o.norm.kind, o.norm.affine, o.norm.eps, o.attention.clip_qkv) == ("layernorm", False, 1e-5, 0.8)
    assert count_params(o)["norms"] == count_params(o)["final_norm"] == 0


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **ATTN)


@pytest.mark.parametrize("case", ["phi3-window", "cohere", "granite", "olmo"])
def test_greedy_generation_matches_hf_generate(case):
    """5 + 20 tokens past the window of 4: ids and every step's logits through the KV cache."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["phi3-longrope", "phi3-longrope-attention-factor"])
def test_greedy_generation_across_longrope_s_switch_matches_hf_generate(case):
    """5 + 20 tokens across the switch at 16: transformers' Phi-3 drops its cache there and re-encodes the
    sequence with the long factors, as archlab's generate does; the same ids, and at every step the logits
    archlab's generate decoded with equal those HF decoded with."""
    hf = hf_model(case, seed=4)
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(5))
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=20,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
    )
    model, seen = from_hf(hf), []
    hook = model.head.register_forward_hook(lambda m, i, o: seen.append(o[:, -1]))
    got = generate(model, ids, max_new_tokens=20)
    hook.remove()
    assert torch.equal(got, out.sequences)
    assert len(seen) == 20  # prefill, 10 cached steps, the re-encoding at 16 -> 17 tokens, 8 cached steps
    assert max_diff(torch.stack(seen, 1), torch.stack(out.logits, 1)) <= TOL


@pytest.mark.parametrize("case", ["phi3-window", "cohere", "granite", "olmo"])
def test_padded_batch_generation_matches_hf_generate(case):
    """Left-padded prompts of 7, 3 and 5 tokens. Not across LongRoPE's switch: transformers picks the
    factors for the whole batch by its longest row, archlab for each row by its own length."""
    parity.check_padded_generation(hf_model(case, seed=6))


@pytest.mark.parametrize("case", ["phi3-longrope", "cohere", "granite", "olmo"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, attn_implementation="eager")


TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.mlp.d_ff=96"]
GQA = ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
LLAMA = ["model=llama2-7b", *TINY, *GQA]
LAYOUTS = {
    # LLaMA's layers rotating half of each head: no family before Phi-3 holds it
    "phi3-partial-rotary": ([*LLAMA, "model.position.rotary_fraction=0.5"], "Phi3ForCausalLM"),
    "phi3-longrope": (
        [
            *LLAMA,
            "model.position.scaling.kind=longrope",
            "model.position.scaling.original_context=16",
            "model.position.scaling.factor=4.0",
            f"model.position.scaling.short_factor={[*SHORT, *SHORT]}",
            f"model.position.scaling.long_factor={[*LONG, *LONG]}",
            "model.position.scaling.attention_factor=1.2",
            f"model.attention.window={WINDOW}",
        ],
        "Phi3ForCausalLM",
    ),
    "cohere": (
        [
            "model=gptj-6b",
            *TINY,
            *GQA,
            "model.position.rotary_dim=null",
            "model.norm.bias=false",
            "model/mlp=swiglu",
            "model.mlp.bias=false",
            "model.head.bias=false",
            "model.head.logit_scale=0.0625",
            "model.attention.qk_norm=head",
            "model.attention.qk_norm_per_head_scale=true",
        ],
        "CohereForCausalLM",
    ),
    "granite": (
        [
            *LLAMA,
            "model.embedding_multiplier=12.0",
            "model.block.residual_multiplier=0.22",
            "model.attention.scale=0.0078125",
            "model.head.logit_scale=0.125",
        ],
        "GraniteForCausalLM",
    ),
    "olmo": (
        [*LLAMA, "model/norm=layernorm", "model.norm.affine=false", "model.attention.clip_qkv=0.5"],
        "OlmoForCausalLM",
    ),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_an_archlab_layout_exports_to_its_family_and_back_bit_for_bit(case):
    overrides, expected_class = LAYOUTS[case]
    model = randomize(build_model(compose_model(overrides)), seed=3)
    hf, _ = parity.check_to_hf_and_back(model, expected_class, attn_implementation="eager")
    assert max_diff(logits(model, LONG_IDS), logits(hf, LONG_IDS)) <= TOL


@pytest.mark.parametrize(
    "case, overrides, field",
    [
        ("phi3-partial-rotary", ["model.attention.qkv_bias=true"], "model.attention.qkv_bias"),
        ("phi3-partial-rotary", ["model.attention.head_dim=32"], "model.attention.head_dim"),
        (
            "phi3-partial-rotary",
            ["model.position.scaling.kind=linear", "model.position.scaling.factor=2.0"],
            "model.position.scaling.kind",
        ),
        ("cohere", ["model.attention.qk_norm_per_head_scale=false"], "model.attention.qk_norm_per_head_scale"),
        ("cohere", ["model.position.pairing=half"], "model.position.pairing"),
        ("granite", ["model.head.logit_scale=0.030927835051546393"], "model.head.logit_scale"),  # 1/(1/s) != s
        ("olmo", ["model.norm.eps=1e-6"], "model.norm.eps"),
        ("olmo", ["model.norm.affine=true"], "model.norm.affine"),
    ],
)
def test_each_family_refuses_what_it_cannot_hold(case, overrides, field):
    cfg = compose_model([*LAYOUTS[case][0], *overrides])
    family = FAMILIES[LAYOUTS[case][1].removesuffix("ForCausalLM").lower()]
    assert field in [p.field for p in family.problems(cfg)]
    with pytest.raises(ConfigError) as err:
        family.check(cfg)
    assert err.value.field == field


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("phi3-window", dict(hidden_act="relu"), "Phi3Config.hidden_act"),
        ("cohere", dict(logit_scale=0.0), "CohereConfig.logit_scale"),
        ("granite", dict(logits_scaling=49.0), "GraniteConfig.logits_scaling"),  # 1/(1/49) != 49
        (
            "olmo",
            dict(
                rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "partial_rotary_factor": 0.5}
            ),
            "OlmoConfig.rope_parameters.partial_rotary_factor",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    _, config_class, keys = HF_CASES[case]
    with pytest.raises(ConfigError) as err:
        config_from_hf(getattr(transformers, config_class)(**{**keys, **changes}))
    assert err.value.field == field


def test_granite_s_logits_scaling_round_trips_as_its_reciprocal():
    """logits_scaling L is held as logit_scale 1/L and written back as 1/(1/L) == L."""
    cfg = config_from_hf(transformers.GraniteConfig(**HF_CASES["granite"][2]))
    assert config_to_hf(cfg).logits_scaling == 8.0
    cfg = config_from_hf(transformers.GraniteConfig(**{**HF_CASES["granite"][2], "logits_scaling": 3.0}))
    assert (cfg.head.logit_scale, config_to_hf(cfg).logits_scaling) == (1 / 3.0, 3.0)


# ---------------------------------------------------------------- model.norm.affine


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_a_norm_without_affine_is_the_normalisation_alone(kind):
    """No parameters; LayerNorm is (x - mean) / sqrt(var + eps) (transformers' OlmoLayerNorm), RMSNorm
    x / sqrt(mean(x²) + eps), per head too (QK-norm); counted as 0 parameters."""
    from transformers.models.olmo.modeling_olmo import OlmoLayerNorm

    cfg = tiny(norm={"kind": kind, "eps": 1e-5, "affine": False}, attention={"qk_norm": "head"})
    model = build_model(cfg)
    block: Any = model.blocks[0]
    norm = block.attn_norm
    assert list(norm.parameters()) == [] and list(block.attn.q_norm.parameters()) == []
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(0)) * 2 + 0.7
    if kind == "layernorm":
        want = OlmoLayerNorm(32)(x)
    else:
        want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), want, rtol=0, atol=1e-6)
    heads = x.unflatten(-1, (4, 8))
    torch.testing.assert_close(norm.per_head(heads), F.layer_norm(heads, (8,)) if kind == "layernorm" else
                               heads / torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-5), rtol=0, atol=1e-6)  # fmt: skip
    counts, affine = (
        count_params(cfg),
        count_params(tiny(norm={"kind": kind, "eps": 1e-5}, attention={"qk_norm": "head"})),
    )
    assert counts["norms"] == counts["final_norm"] == 0
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    per = 2 if kind == "layernorm" else 1  # scale (and shift): 2 layers of 2 norms of 32, the final one, 2 QK of 8
    assert affine["total"] - counts["total"] == per * (2 * 2 * 32 + 32 + 2 * 2 * 8)
    losses = short_fit(model, 48, 16)
    assert losses[-1] < losses[0] - 0.3


def test_norm_affine_validation():
    with pytest.raises(ConfigError) as err:
        build_model(tiny(norm={"kind": "rmsnorm", "affine": False, "unit_offset": True}))
    assert err.value.field == "model.norm.unit_offset"
    cfg = tiny()
    cfg.norm.affine = "no"  # type: ignore[assignment]
    with pytest.raises(ConfigError) as err:
        build_model(cfg)
    assert err.value.field == "model.norm.affine"
    # OPT (no elementwise affine) and nanochat (weightless RMSNorms) hold it too
    cfg = tiny(norm={"kind": "layernorm", "affine": False}, position={"kind": "rope"})
    others = [f for n, f in families_of_its_mixers(cfg).items() if n not in ("olmo", "opt", "nanochat")]
    assert all("model.norm.affine" in [p.field for p in f.problems(cfg)] for f in others)


# ---------------------------------------------------------------- model.position.scaling.attention_factor


def test_attention_factor_replaces_longrope_s_and_yarn_s():
    """cos and sin times the given factor, short and long alike: transformers' Phi3RotaryEmbedding with
    rope_parameters' attention_factor; YaRN's cos and sin are its own factor's instead of the derived one."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    c = transformers.Phi3Config(**HF_CASES["phi3-longrope-attention-factor"][2])
    hf = Phi3RotaryEmbedding(c)
    cfg = from_hf(hf_model("phi3-longrope-attention-factor")).cfg
    rope = RoPE(cfg)
    for T in (16, 20):
        cos, sin = hf(torch.zeros(1), torch.arange(T)[None])
        r = cast(RoPERotation, rope.rotary(torch.arange(T), torch.float32))
        torch.testing.assert_close(r.cos[:, 0], cos[0, :, :4], rtol=0, atol=1e-6)
        torch.testing.assert_close(r.sin[:, 0], sin[0, :, :4], rtol=0, atol=1e-6)
    assert math.isclose(float(cos[0, 0, 0]), 1.3, rel_tol=1e-6)
    yarn = dict(kind="rope", scaling=dict(kind="yarn", factor=4.0, original_context=16))
    plain = cast(RoPERotation, RoPE(tiny(position=yarn)).rotary(torch.arange(8), torch.float32))
    given = cast(
        RoPERotation,
        RoPE(tiny(position=dict(yarn, scaling=dict(yarn["scaling"], attention_factor=2.0)))).rotary(
            torch.arange(8), torch.float32
        ),
    )
    torch.testing.assert_close(given.cos * (0.1 * math.log(4.0) + 1), plain.cos * 2.0, rtol=1e-6, atol=0)


def test_attention_factor_validation():
    for position, field in [
        (dict(kind="rope", scaling=dict(attention_factor=1.5)), "model.position.scaling.attention_factor"),  # no scaling
        (dict(kind="rope", scaling=dict(kind="yarn", factor=4.0, original_context=16, attention_factor=-1.0)),
         "model.position.scaling.attention_factor"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as err:
            build_model(tiny(position=position))
        assert err.value.field == field
