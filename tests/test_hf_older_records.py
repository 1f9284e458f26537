"""GPT-Neo, CodeGen, MPT, Persimmon, GPT (OpenAI), BioGPT and nanochat against transformers.

One tiny random model per family (every weight redrawn: biases and norm scales far from 0 and 1) gives HF
eager's float32 logits; its archlab layout maps back to the family (or, where an earlier family holds the
same layout, this record still writes that class with HF's logits); archlab -> HF -> archlab gives back
every tensor bit for bit; a save_pretrained directory loads. Three families decode as HF ``generate``
does, and what a record cannot hold is refused naming the field.
"""

from __future__ import annotations

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, logits, max_diff

from archlab import ConfigError
from archlab.interop.hf import (
    FAMILIES,
    archlab_state_to_hf,
    config_from_hf,
    from_hf,
    hf_family,
    load_hf_dir,
)

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(vocab_size=96, hidden_size=64, max_position_embeddings=64, num_hidden_layers=2, num_attention_heads=4)
GPT = dict(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4)
# case -> (transformers model class, config class, config keys, the family archlab's layout maps back to)
HF_CASES = {
    # local layers of window 4 < the 12 tokens, alternating with global ones
    "gpt_neo": (
        "GPTNeoForCausalLM",
        "GPTNeoConfig",
        dict(
            HF,
            num_layers=2,
            num_heads=4,
            intermediate_size=96,
            window_size=4,
            attention_types=[[["local", "global"], 1]],
        ),
        "gpt_neo",
    ),
    # GPT-J's layout: GPT-J's record exports it; CodeGen's writes CodeGen's fused shards
    "codegen": ("CodeGenForCausalLM", "CodeGenConfig", dict(GPT, rotary_dim=8, n_inner=96), "gptj"),
    # 6 heads: ALiBi's slopes for a head count that is not a power of two
    "mpt": (
        "MptForCausalLM",
        "MptConfig",
        dict(
            vocab_size=96,
            max_seq_len=64,
            d_model=48,
            n_heads=6,
            n_layers=2,
            tie_word_embeddings=False,
            attn_config=dict(clip_qkv=0.6, softmax_scale=0.3),
        ),
        "mpt",
    ),
    "persimmon": ("PersimmonForCausalLM", "PersimmonConfig", dict(HF, intermediate_size=96), "persimmon"),
    "openai-gpt": ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig", GPT, "openai-gpt"),
    "biogpt": ("BioGptForCausalLM", "BioGptConfig", dict(HF, intermediate_size=96), "biogpt"),
    "nanochat": (
        "NanoChatForCausalLM",
        "NanoChatConfig",
        dict(HF, num_key_value_heads=2, intermediate_size=96, attention_bias=True),
        "nanochat",
    ),
}
GENERATION_CASES = ["gpt_neo", "mpt", "nanochat"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **dict(ATTN, **NO_TOKENS))


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_maps_back_and_loads_saved(case, tmp_path):
    """HF eager's logits; archlab -> HF (this record's class) -> archlab bit for bit; save_pretrained loads."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == HF_CASES[case][3]
    if HF_CASES[case][3] == case:
        parity.check_back_and_again(hf, model, **ATTN)
    else:  # this record alone, on a layout an earlier family exports
        family = FAMILIES[case]
        config = getattr(transformers, family.config_class)(**family.to_hf(model.cfg), **NO_TOKENS, **ATTN)
        back = family.hf_class(transformers)(config).eval()
        back.load_state_dict(archlab_state_to_hf(model.cfg, model.state_dict(), family=case), strict=False)
        assert max_diff(logits(back), logits(model)) <= TOL
        again = from_hf(back)
        assert again.cfg == model.cfg
        parity.assert_same_tensors(model, again)
    hf.save_pretrained(tmp_path)
    assert max_diff(logits(hf), logits(load_hf_dir(tmp_path).eval())) <= TOL


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_greedy_and_padded_generation_match_hf_generate(case):
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


# (case, HF config keys that from_hf refuses, or an archlab change the record's check refuses, the field named)
REFUSALS = [
    ("gpt_neo", dict(attention_types=[[["local", "sparse"], 1]]), None, "GPTNeoConfig.attention_types"),
    ("mpt", dict(attn_config=dict(alibi_bias_max=16)), None, "MptConfig.attn_config.alibi_bias_max"),
    ("mpt", dict(attn_config=dict(qk_ln=True)), None, "MptConfig.attn_config.qk_ln"),
    ("mpt", dict(no_bias=False), None, "MptConfig.no_bias"),
    ("mpt", dict(expansion_ratio=2), None, "MptConfig.expansion_ratio"),
    ("persimmon", dict(hidden_dropout=0.1), None, "PersimmonConfig.hidden_dropout"),
    ("openai-gpt", dict(afn="silu"), None, "OpenAIGPTConfig.afn"),
    ("biogpt", dict(activation_dropout=0.1), None, "BioGptConfig.activation_dropout"),
    ("biogpt", dict(layerdrop=0.1), None, "BioGptConfig.layerdrop"),
    ("nanochat", dict(hidden_act="silu"), None, "NanoChatConfig.hidden_act"),
    ("gpt_neo", None, dict(attention__scale=None), "model.attention.scale"),
    ("codegen", None, dict(d_model=66, attention__n_head=6), "model.d_model"),
    ("mpt", None, dict(norm__bias=True), "model.norm.bias"),
    ("mpt", None, dict(dropout=0.1, attention__dropout=0.1, embedding_dropout=0.0), "model.dropout"),
    ("persimmon", None, dict(attention__qk_norm="full"), "model.attention.qk_norm"),
    ("openai-gpt", None, dict(mlp__approximate="none"), "model.mlp.approximate"),
    ("biogpt", None, dict(norm__eps=1e-6), "model.norm.eps"),
    ("nanochat", None, dict(norm__affine=True), "model.norm.affine"),
]


@pytest.mark.parametrize("case, keys, change, field", REFUSALS)
def test_records_refuse_what_they_cannot_hold(case, keys, change, field):
    """from_hf refuses a config value naming the HF field; the record's check refuses an archlab layout."""
    _, config_class, base, _ = HF_CASES[case]
    with pytest.raises(ConfigError) as err:
        if keys is not None:
            config_from_hf(getattr(transformers, config_class)(**{**base, **keys}, **NO_TOKENS))
        else:
            cfg = config_from_hf(getattr(transformers, config_class)(**base, **NO_TOKENS))
            FAMILIES[case].check(parity.changed_cfg(cfg, **change))
    assert err.value.field == field
