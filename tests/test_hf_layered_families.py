"""Hugging Face parity of the dense families whose layers differ (archlab/interop/families/layered.py): Gemma 3
(text), SmolLM3, Cohere2, EXAONE 4 and OLMo 3.

Tiny random models of each, every parameter redrawn (matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²), far from 0 and 1), give the same float32 logits in archlab and in transformers' eager
implementation, from HF to archlab and from archlab layouts (the shipped presets and layer layouts, shrunk)
to HF; archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding, alone and in a
left-padded batch, equals HF ``generate``. Sequences are longer than every window (4), heads are grouped
(GQA), and each family's layers differ as its config lets them: windows by layer_types, RoPE parameters
per layer type (Gemma 3, OLMo 3, a linear scaling on the global layers), NoPE layers (SmolLM3 by
no_rope_layers, apart from its windows; Cohere2's and EXAONE 4's global layers). Cohere2's logit_scale
(0.25) is folded into the final norm. The shipped presets' configs are compared with the published ones
(tests/helpers/published.py LAYOUT_CONFIGS).
"""

import copy
import functools

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS, TOL, WINDOW, logits, max_diff, randomize
from helpers.published import LAYOUT_CONFIGS, PUBLISHED

from archlab import ConfigError, ModelConfig, build_model, compose_model, count_params
from archlab.config.layers import layer_configs
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf, hf_family, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
SMALL = dict(
    HF_SIZES, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS
)
PER_TYPE_ROPE = {
    S: {"rope_type": "default", "rope_theta": 10000.0},
    F: {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0},
}
# case -> (model class, config class, config keys)
HF_CASES = {
    # local, global, local: a (1 + w) QK-norm per head, RoPE bases and scaling per type, capped final logits
    "gemma3": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            SMALL,
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            final_logit_softcapping=5.0,
            rope_parameters=PER_TYPE_ROPE,
        ),
    ),
    # NoPE every 2nd layer, q/k/v/o and MLP biases
    "smollm3": (
        "SmolLM3ForCausalLM",
        "SmolLM3Config",
        dict(SMALL, no_rope_layer_interval=2, attention_bias=True, mlp_bias=True),
    ),
    # windows and NoPE apart: four kinds of layer
    "smollm3-windows": (
        "SmolLM3ForCausalLM",
        "SmolLM3Config",
        dict(
            SMALL, no_rope_layers=[1, 0, 1, 0], use_sliding_window=True, sliding_window=WINDOW, layer_types=[S, S, F, F]
        ),
    ),
    # two local layers with interleaved RoPE, a global NoPE one; biases; logits times 0.25
    "cohere2": (
        "Cohere2ForCausalLM",
        "Cohere2Config",
        dict(
            SMALL,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            sliding_window_pattern=3,
            logit_scale=0.25,
            attention_bias=True,
        ),
    ),
    # local RoPE / global NoPE in turn, explicit head_dim, Llama 3.1 RoPE scaling
    "exaone4": (
        "Exaone4ForCausalLM",
        "Exaone4Config",
        dict(
            SMALL,
            head_dim=24,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    # no window: every layer global with RoPE (layer_types given: Exaone4Config(sliding_window=None) alone
    # divides by zero)
    "exaone4-no-window": (
        "Exaone4ForCausalLM",
        "Exaone4Config",
        dict(SMALL, num_hidden_layers=2, sliding_window=None, layer_types=[F, F]),
    ),
    # three local layers, one global (OLMo 3's default layout), the global RoPE scaled
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config", dict(SMALL, sliding_window=WINDOW, rope_parameters=PER_TYPE_ROPE)),
}


def hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back(case):
    """HF -> archlab: the same logits, and the layout maps back to the family; archlab -> HF: the same class
    and logits; -> archlab again: the same config and bit-identical tensors."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == hf.config.model_type
    back = parity.check_back_and_again(hf, model, **ATTN)
    assert back.config.layer_types == hf.config.layer_types


def _layers(case: str) -> list[tuple]:
    """Each layer's (window, position kind, RoPE base, scaling) as archlab reads the HF config (NoPE: no
    base, no scaling)."""
    cfg = config_from_hf(hf_config(case))
    return [(c.attention.window, c.position.kind, *_rope(c.position)) for c in layer_configs(cfg)]


def _rope(position) -> tuple:
    """A layer's RoPE base and scaling kind; (None, None) without RoPE."""
    return (position.theta, position.scaling.kind) if position.kind == "rope" else (None, None)


def test_from_hf_reads_each_family_s_layers():
    W = WINDOW
    local, glob = (W, "rope", 1e4, "none"), (None, "rope", 5e5, "linear")
    assert _layers("gemma3") == [local, glob, local]
    assert _layers("olmo3") == [local, local, local, glob]
    assert [x[:2] for x in _layers("smollm3")] == [(None, "rope"), (None, "none")] * 2
    assert [x[:2] for x in _layers("smollm3-windows")] == [(W, "rope"), (W, "none"), (None, "rope"), (None, "none")]
    assert [x[:2] for x in _layers("cohere2")] == [(W, "rope"), (W, "rope"), (None, "none")]
    assert [x[:2] for x in _layers("exaone4")] == [(W, "rope"), (None, "none")] * 2
    assert [x[:2] for x in _layers("exaone4-no-window")] == [(None, "rope")] * 2
    # the layouts, in the shipped layouts' names
    gemma3 = config_from_hf(hf_config("gemma3"))
    assert (gemma3.layers.first, gemma3.layers.pattern) == ([], ["local", "global"])
    assert gemma3.layers.kinds["local"]["attention"] == {"window": W}
    assert (gemma3.attention.qk_norm, gemma3.block.kind, gemma3.norm.unit_offset, gemma3.head.softcap) == (
        "head",
        "sandwich",
        True,
        5.0,
    )
    smol = config_from_hf(hf_config("smollm3"))
    assert smol.layers.kinds == {"rope": {}, "nope": {"position": {"kind": "none"}}}
    assert (smol.attention.qkv_bias, smol.mlp.bias) == (True, True)
    cohere = config_from_hf(hf_config("cohere2"))
    assert cohere.layers.kinds == {"local": {"attention": {"window": W}}, "global": {"position": {"kind": "none"}}}
    assert (cohere.block.kind, cohere.norm.kind, cohere.norm.bias, cohere.position.pairing) == (
        "parallel",
        "layernorm",
        False,
        "interleaved",
    )
    exaone = config_from_hf(hf_config("exaone4"))
    assert (exaone.block.kind, exaone.attention.qk_norm, exaone.attention.head_dim, exaone.position.scaling.kind) == (
        "post_sublayer",
        "head",
        24,
        "llama3",
    )
    # a layout no pattern from the start gives: the first layers by first
    qwen_like = config_from_hf(hf_config("olmo3", layer_types=[F, F, S, S]))
    assert (qwen_like.layers.first, qwen_like.layers.pattern) == (["global", "global"], ["local"])


def test_cohere2_logit_scale_folds_into_the_final_norm_bit_for_bit():
    """logit_scale 0.25 is a power of two: in transformers' own Cohere2, scaling the logits by it and
    scaling the final norm's weight by it instead give the same logits to the last bit, which is what
    archlab's final norm holds; the model exports with logit_scale 1."""
    hf = hf_model("cohere2", seed=8)
    model = from_hf(hf)
    assert torch.equal(model.final_norm.weight, hf.model.norm.weight * 0.25)
    folded = transformers.Cohere2ForCausalLM(hf_config("cohere2", logit_scale=1.0, attn_implementation="eager"))
    folded.load_state_dict({**hf.state_dict(), "model.norm.weight": hf.model.norm.weight * 0.25})
    assert torch.equal(logits(hf), logits(folded.eval()))
    assert to_hf(model).config.logit_scale == 1.0


@pytest.mark.parametrize("case", ["gemma3", "smollm3", "cohere2", "exaone4-no-window", "olmo3"])
def test_greedy_generation_matches_hf_generate(case):
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["gemma3", "smollm3-windows", "cohere2", "exaone4", "olmo3"])
def test_padded_batch_generation_matches_hf_generate(case):
    parity.check_padded_generation(hf_model(case, seed=6))


TINY = ["model.vocab_size=96", "model.context_length=64", "model.d_model=64", "model.attention.n_head=4"]
TINY += ["model.mlp.d_ff=96", "model.attention.n_kv_head=2"]
LOCAL_GLOBAL = ["model.n_layer=3", "model.layers.pattern=[local,global]"]
LOCAL_GLOBAL += [f"model.layers.kinds.local.attention.window={WINDOW}"]
IROPE = ["model.n_layer=4", "model/layers=irope", f"model.layers.kinds.local.attention.window={WINDOW}"]
COHERE = ["model=nano", "model/position=rope", "model.position.pairing=interleaved", "model/block=parallel"]
COHERE += ["model.norm.bias=false", "model/mlp=swiglu", "model.mlp.bias=false", "model.attention.qkv_bias=false"]
COHERE += ["model.attention.out_bias=false", "model.position.theta=50000.0"]
EXAONE = ["model=olmo2-7b", "model.attention.qk_norm=head", "model.attention.head_dim=24"]
OLMO3 = ["model=olmo2-7b", "model/layers=local_global", "+model.layers.kinds.global.position.scaling.kind=linear"]
OLMO3 += ["+model.layers.kinds.global.position.scaling.factor=2.0"]
# layout -> (overrides: the shipped presets and layer layouts, shrunk, and the layouts of the families no
# preset has), the HF class it maps to
LAYOUTS = {
    "gemma3-1b": (["model=gemma3-1b", *TINY, *LOCAL_GLOBAL, "model.attention.head_dim=16"], "Gemma3ForCausalLM"),
    "smollm3-3b": (["model=smollm3-3b", *TINY, "model.n_layer=4"], "SmolLM3ForCausalLM"),
    "cohere2-irope": ([*COHERE, *TINY, *IROPE], "Cohere2ForCausalLM"),
    "exaone4-irope": ([*EXAONE, *TINY, *IROPE], "Exaone4ForCausalLM"),
    "olmo3-local-global": ([*OLMO3, *TINY, *LOCAL_GLOBAL], "Olmo3ForCausalLM"),
}


@functools.cache
def _composed(layout: str) -> ModelConfig:
    return compose_model(LAYOUTS[layout][0])


def layout(name: str, **kinds: dict) -> ModelConfig:
    """A copy of a composed layout (Hydra composes each once: it is this file's slowest step), its kinds
    and its own fields changed: ``kinds`` maps a kind to {family: {field: value}} merged into it (or, naming
    a kind, replacing its section), ``model``
    to fields of the model's own, ``first``/``pattern`` replace the layers'."""
    cfg = copy.deepcopy(_composed(name))
    for kind, families in kinds.items():
        if kind in ("first", "pattern"):
            setattr(cfg.layers, kind, families)
            continue
        for family, fields in families.items():
            if kind == "model":
                for k, v in fields.items():
                    setattr(getattr(cfg, family), k, v)
            elif "kind" in fields:  # another option: its fields replace the kind's
                cfg.layers.kinds.setdefault(kind, {})[family] = dict(fields)
            else:
                cfg.layers.kinds.setdefault(kind, {}).setdefault(family, {}).update(fields)
    return cfg


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_archlab_to_hf_to_archlab_is_bit_identical(name):
    model = randomize(build_model(layout(name)), seed=3)
    _, back = parity.check_to_hf_and_back(model, LAYOUTS[name][1], **ATTN)

    def layers(cfg):  # each layer's window and position scheme as the model runs them
        return [(c.attention.window, c.position) for c in layer_configs(cfg)]

    assert layers(back.cfg) == layers(model.cfg)


@pytest.mark.parametrize("preset", ["gemma3-1b", "gemma3-27b", "smollm3-3b"])
def test_preset_converts_to_the_published_config(preset):
    """config_to_hf of the preset gives the published config's layer types, windows and RoPE per layer,
    and the published config reads back into a layout with the preset's count and the same HF config."""
    _, config_class, keys, _ = LAYOUT_CONFIGS[preset]
    published = getattr(transformers, config_class)(**keys)
    ours = config_to_hf(compose_model([f"model={preset}"]))
    assert type(ours) is type(published)
    compared = ["layer_types", "sliding_window", "rope_parameters", "head_dim", "num_key_value_heads"]
    compared += ["hidden_size", "intermediate_size", "num_hidden_layers", "query_pre_attn_scalar", "no_rope_layers"]
    differ = {k: (getattr(published, k), getattr(ours, k)) for k in compared if hasattr(published, k)}
    assert {k: v for k, v in differ.items() if v[0] != v[1]} == {}
    cfg = config_from_hf(published)
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    assert config_to_hf(cfg).to_dict() == ours.to_dict()


@pytest.mark.parametrize(
    "name, changes, field",
    [
        # parts that differ per layer beyond window and position
        (
            "olmo3-local-global",
            dict(local={"attention": {"n_kv_head": 4}}),
            "model.layers.kinds.local.attention.n_kv_head",
        ),
        ("cohere2-irope", dict(global_={"mlp": {"d_ff": 48}}), "model.layers.kinds.global.mlp.d_ff"),
        # two window sizes
        ("exaone4-irope", dict(global_={"attention": {"window": 8}}), "model.layers.kinds.global.attention.window"),
        # RoPE that differs where the family has one set (SmolLM3), or within a layer type (Gemma 3)
        (
            "smollm3-3b",
            dict(nope={"position": {"kind": "rope", "theta": 1e3}}),
            "model.layers.kinds.nope.position.theta",
        ),
        (
            "gemma3-1b",
            dict(pattern=["local", "other", "global"], other={"attention": {"window": WINDOW}}),
            "model.position.theta",
        ),
        # NoPE where the family has RoPE, and each family's rule on which layers have RoPE
        ("olmo3-local-global", dict(global_={"position": {"kind": "none"}}), "model.layers.kinds.global.position.kind"),
        ("gemma3-1b", dict(global_={"position": {"kind": "none"}}), "model.layers.kinds.global.position.kind"),
        ("cohere2-irope", dict(local={"position": {"kind": "none"}}), "model.layers.kinds.local.position.kind"),
        ("exaone4-irope", dict(global_={"position": {"kind": "rope"}}), "model.layers.kinds.global.position.kind"),
        # each family's own parts
        ("gemma3-1b", dict(model={"attention": {"softcap": 50.0}}), "model.attention.softcap"),
        ("gemma3-1b", dict(model={"attention": {"qk_norm": "none"}}), "model.attention.qk_norm"),
        ("cohere2-irope", dict(model={"attention": {"head_dim": 32}}), "model.attention.head_dim"),
        ("cohere2-irope", dict(model={"norm": {"bias": True}}), "model.norm.bias"),
        ("exaone4-irope", dict(model={"attention": {"qkv_bias": True, "out_bias": True}}), "model.attention.qkv_bias"),
        ("smollm3-3b", dict(model={"attention": {"qk_norm": "head"}}), "model.attention.qk_norm"),
    ],
)
def test_each_family_refuses_what_it_cannot_express(name, changes, field):
    """The layout's family (its record's ``check``, which config_to_hf and archlab-export call) names the
    field: a layer kind's own where the kind sets it."""
    changes = {k.rstrip("_"): v for k, v in changes.items()}  # global_: global is a Python keyword
    family = FAMILIES[hf_family(_composed(name))]
    with pytest.raises(ConfigError) as err:
        family.check(layout(name, **changes))
    assert err.value.field == field
    assert f"Hugging Face {family.title}" in str(err.value)


def test_config_to_hf_names_what_the_nearest_family_lacks():
    with pytest.raises(ConfigError) as err:
        config_to_hf(layout("cohere2-irope", local={"position": {"kind": "none"}}))
    assert err.value.field == "model.layers.kinds.local.position.kind"


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("gemma3", dict(attn_logit_softcapping=50.0), "Gemma3TextConfig.attn_logit_softcapping"),
        (
            "gemma3",
            dict(
                rope_parameters={
                    S: {"rope_type": "default", "rope_theta": 1e4},
                    F: {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0},
                }
            ),
            "Gemma3TextConfig.rope_parameters.full_attention.rope_type",
        ),
        ("cohere2", dict(logit_scale=0.3), "Cohere2Config.logit_scale"),
        (
            "smollm3",
            dict(use_sliding_window=False, sliding_window=WINDOW, layer_types=[S, F, F, F]),
            "SmolLM3Config.use_sliding_window",
        ),
        ("olmo3", dict(layer_types=[S, F, "chunked_attention", F]), "Olmo3Config.layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(hf_config(case, **changes))
    assert err.value.field == field


@pytest.mark.parametrize("case", ["gemma3", "cohere2"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout (Cohere2's
    logit_scale folded on loading from files too)."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
