"""Hugging Face parity of the records that reuse archlab's parts for more transformers families: the aliases
GPT-SW3 (GPT-2's class), EXAONE 3, InternLM3 and IQuest-Coder (LLaMA's class), and LLaMA's relatives
Helium, Seed-OSS, GLM v1, CWM, VaultGemma, Jais 2, HyperCLOVA X and Granite SWA.

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1) give the same float32
logits in archlab and in transformers' eager implementation, GQA or MQA throughout, windows of 4 under 12
tokens; archlab -> HF -> archlab is bit for bit; save_pretrained directories load (EXAONE's with its own
tensor names); an alias's layout exports to the family it aliases, and the alias's own record writes its
config class with the same logits; what a record cannot hold is refused, naming the field.
"""

from typing import Any

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS, TOL, WINDOW, V, changed_cfg, logits, max_diff

from archlab import ConfigError
from archlab.interop.hf import FAMILIES, archlab_state_to_hf, config_from_hf, from_hf, hf_family, load_hf_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, head_dim=16, **NO_TOKENS)
TYPES = ["sliding_attention", "full_attention"]
MULTIPLIERS = dict(embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3)
HF_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt-sw3": (
        "GPT2LMHeadModel",
        "GPT2Config",
        dict(model_type="gpt-sw3", vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4, **NO_TOKENS),
    ),
    "exaone": ("LlamaForCausalLM", "ExaoneConfig", dict(SMALL, num_key_value_heads=1)),
    "internlm3": (
        "LlamaForCausalLM",
        "InternLM3Config",
        dict(SMALL, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    ),
    "iquestcoder": (
        "LlamaForCausalLM",
        "IQuestCoderConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="linear", rope_theta=500000.0, factor=2.0),
        ),
    ),
    "helium": (
        "HeliumForCausalLM",
        "HeliumConfig",
        dict(SMALL, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    ),
    "seed_oss": (
        "SeedOssForCausalLM",
        "SeedOssConfig",
        dict(SMALL, num_key_value_heads=2, attention_out_bias=True, mlp_bias=True, residual_dropout=0.1),
    ),
    "glm": ("GlmForCausalLM", "GlmConfig", dict(SMALL, num_key_value_heads=2)),
    "cwm": (
        "CwmForCausalLM",
        "CwmConfig",
        dict(SMALL, num_key_value_heads=2, mlp_bias=True, sliding_window=WINDOW, layer_types=TYPES, bos_token_id=0),
    ),
    "vaultgemma": (
        "VaultGemmaForCausalLM",
        "VaultGemmaConfig",
        dict(
            SMALL,
            num_key_value_heads=1,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            sliding_window=WINDOW,
            layer_types=TYPES,
        ),
    ),
    "jais2": ("Jais2ForCausalLM", "Jais2Config", dict(SMALL, num_key_value_heads=2)),
    "hyperclovax": (
        "HyperCLOVAXForCausalLM",
        "HyperCLOVAXConfig",
        dict(SMALL, num_key_value_heads=2, head_dim=8, **MULTIPLIERS, logits_scaling=0.3, attention_bias=True),
    ),
    "granite_swa": (
        "GraniteSWAForCausalLM",
        "GraniteSWAConfig",
        dict(
            {k: v for k, v in SMALL.items() if k != "head_dim"},
            num_key_value_heads=1,
            **MULTIPLIERS,
            logits_scaling=8.0,
            sliding_window=WINDOW,
            layer_types=TYPES,
            layer_rope_theta=[5e4, 0],
        ),
    ),
}
# the family a layout read from an alias (a class of another family) exports to; CWM's layout (Ministral's
# sliding layers with LLaMA's MLP biases) is SmolLM3's, which comes first in FAMILIES
ROUTED = {"gpt-sw3": "gpt2", "exaone": "llama", "internlm3": "llama", "iquestcoder": "llama", "cwm": "smollm3"}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


def own_record(model, family: str):
    """The HF model that ``family``'s own record writes for archlab ``model``: its config class from
    ``to_hf`` (saying its model_type), its tensors by ``tensors``."""
    record = FAMILIES[family]
    config = getattr(transformers, record.config_class)(**{**NO_TOKENS, **record.to_hf(model.cfg)}, **ATTN)
    assert config.model_type == family
    hf = record.hf_class(transformers)(config).eval()
    result = hf.load_state_dict(archlab_state_to_hf(model.cfg, model.state_dict(), family=family), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    return hf


@pytest.mark.parametrize("case", list(HF_CASES))
def test_each_family_converts_both_ways(case, tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through the alias's own record where the layout maps to another family); a save_pretrained directory
    through load_hf_dir (and save_hf_dir back, where the layout maps to the same class)."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == ROUTED.get(case, case)
    if case not in ROUTED:
        parity.check_back_and_again(hf, model, **ATTN)
        parity.check_directory_round_trip(hf, tmp_path, **ATTN)
        return
    own = own_record(model, case)
    assert type(own) is type(hf) and max_diff(logits(own), logits(hf)) <= TOL
    again = from_hf(own)
    assert again.cfg == model.cfg
    parity.assert_same_tensors(model, again)
    hf.save_pretrained(tmp_path)  # EXAONE's: its own tensor names
    assert max_diff(logits(load_hf_dir(tmp_path).eval()), logits(hf)) <= TOL


@pytest.mark.parametrize("case", ["cwm", "vaultgemma", "granite_swa"])
def test_generation_matches_hf_generate(case):
    """Greedy and left-padded batch decoding past the window of 4 (Granite SWA: with sinks and a NoPE
    layer), every step's logits through the cache."""
    hf = hf_model(case, seed=4)
    parity.check_greedy_generation(hf)
    parity.check_padded_generation(hf)


def test_each_record_reads_its_family_s_parts():
    cases = ("helium", "seed_oss", "glm", "cwm", "vaultgemma", "jais2", "hyperclovax", "granite_swa")
    cfgs = {case: from_hf(hf_model(case)).cfg for case in cases}
    h, s, g = cfgs["helium"], cfgs["seed_oss"], cfgs["glm"]
    assert (h.position.pairing, h.attention.qkv_bias, h.attention.out_bias, h.mlp.bias) == (
        "interleaved",
        True,
        False,
        True,
    )
    assert (s.attention.qkv_bias, s.attention.out_bias, s.dropout, s.embedding_dropout) == (True, True, 0.1, 0.0)
    assert (g.block.kind, g.position.pairing, g.position.rotary_fraction, g.attention.out_bias) == (
        "pre",
        "interleaved",
        0.5,
        False,
    )
    c, v, j = cfgs["cwm"], cfgs["vaultgemma"], cfgs["jais2"]
    assert (c.position.scaling.kind, c.mlp.bias, c.layers.pattern) == ("llama3", True, ["local", "global"])
    assert (v.block.kind, v.norm.unit_offset, v.attention.softcap, v.head.softcap) == ("pre", True, 5.0, 3.0)
    assert (j.norm.kind, j.norm.bias, j.mlp.kind, j.mlp.bias, j.attention.out_bias) == (
        "layernorm",
        True,
        "relu2",
        True,
        True,
    )
    x, w = cfgs["hyperclovax"], cfgs["granite_swa"]
    assert (x.block.kind, x.attention.head_dim, x.attention.scale, x.head.logit_scale) == ("sandwich", 8, 0.3, 0.3)
    assert (w.attention.sinks, w.head.logit_scale, w.layers.pattern) == (True, 0.125, ["local", "global"])
    assert (w.position.theta, w.layers.kinds["global"]) == (5e4, {"position": {"kind": "none"}})


REFUSALS = [
    # (family, "hf": transformers config keys changed / "layout": archlab fields changed on its own layout, field)
    ("helium", "hf", dict(rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5)), "partial_rotary_factor"),
    ("jais2", "hf", dict(hidden_act="silu"), "Jais2Config.hidden_act"),
    ("cwm", "hf", dict(layer_types=["full_attention", "chunked_attention"]), "CwmConfig.layer_types"),
    ("glm", "hf", dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=2.0)), "rope_type"),
    ("granite_swa", "hf", dict(layer_rope_theta=[5e4, 1e4]), "GraniteSWAConfig.layer_rope_theta"),
    ("hyperclovax", "hf", dict(logits_scaling=-1.0), "HyperCLOVAXConfig.logits_scaling"),
    ("internlm3", "layout", dict(mlp__bias=False), "model.mlp.bias"),
    ("helium", "layout", dict(position__pairing="half"), "model.position.pairing"),
    ("helium", "layout", dict(attention__out_bias=True), "model.attention.out_bias"),
    ("seed_oss", "layout", dict(embedding_dropout=0.1), "model.embedding_dropout"),
    ("jais2", "layout", dict(norm__bias=False), "model.norm.bias"),
    ("vaultgemma", "layout", dict(block__kind="sandwich"), "model.block.kind"),
    ("cwm", "layout", dict(attention__qkv_bias=True), "model.attention.qkv_bias"),
    ("hyperclovax", "layout", dict(block__kind="post_sublayer"), "model.block.kind"),
    ("granite_swa", "layout", dict(attention__sinks=False), "model.attention.sinks"),
]


@pytest.mark.parametrize("family, where, change, field", REFUSALS)
def test_a_record_refuses_what_it_cannot_hold(family, where, change, field):
    """from_hf refuses a config value naming the HF field; the record's problems name an archlab field."""
    config_class, keys = HF_CASES[family][1:]
    if where == "hf":
        with pytest.raises(ConfigError, match=field):
            config_from_hf(getattr(transformers, config_class)(**{**keys, **change}))
        return
    cfg = config_from_hf(getattr(transformers, config_class)(**keys))
    assert not FAMILIES[family].problems(cfg)
    assert field in [p.field for p in FAMILIES[family].problems(changed_cfg(cfg, **change))]
