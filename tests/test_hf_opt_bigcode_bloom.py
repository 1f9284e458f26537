"""OPT, GPTBigCode and BLOOM against transformers, and the part OPT-350m needs, ``model.embedding_dim``.

Tiny random models of each family (every weight redrawn: biases and norm scales far from 0 and 1) give
HF eager's float32 logits; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and
left-padded batched decoding equal HF ``generate``; save_pretrained directories load; archlab layouts
(post-norm, MQA with learned positions, ALiBi with an embedding norm, a narrower embedding) export to
these classes; what a family cannot hold is refused naming the field. ``model.embedding_dim`` is checked
against hand-written expressions, its closed-form count, its validation and a short fit.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, families_of_its_mixers, logits, max_diff, randomize
from helpers.parts import short_fit, tiny

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.accounting import check_build
from archlab.build import compose
from archlab.cli.check import run
from archlab.interop.hf import FAMILIES, archlab_state_to_hf, config_from_hf, from_hf, hf_family
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
OPT_SMALL = dict(SMALL, max_position_embeddings=64, ffn_dim=96)
BIGCODE_SMALL = dict(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4, n_inner=96, **NO_TOKENS)
BLOOM_SMALL = dict(vocab_size=96, hidden_size=64, n_layer=2, n_head=4, **NO_TOKENS)
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
    "bigcode-mqa": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", BIGCODE_SMALL, "gpt_bigcode"),
    "bigcode-mha-unscaled-gelu-fast": (
        "GPTBigCodeForCausalLM",
        "GPTBigCodeConfig",
        dict(BIGCODE_SMALL, multi_query=False, scale_attn_weights=False, activation_function="gelu_fast"),
        "gpt_bigcode",
    ),
    "bloom": ("BloomForCausalLM", "BloomConfig", BLOOM_SMALL, "bloom"),
    # 6 heads: ALiBi's slopes for a head count that is not a power of two
    "bloom-6-heads-untied": (
        "BloomForCausalLM",
        "BloomConfig",
        dict(BLOOM_SMALL, hidden_size=48, n_head=6, tie_word_embeddings=False),
        "bloom",
    ),
}
GENERATION_CASES = ["opt-350m-layout", "bigcode-mqa", "bloom-6-heads-untied"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_maps_back(case):
    """HF eager's logits, and archlab -> HF (the class the layout maps to) -> archlab bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == HF_CASES[case][3]
    if HF_CASES[case][3] == hf.config.model_type:
        parity.check_back_and_again(hf, model, **ATTN)


def test_opt_record_writes_a_layout_gpt2_also_holds():
    """The OPT record alone converts the pre-norm, biased layout (which exports as GPT-2) to OPT: HF's logits."""
    hf = hf_model("opt-pre", seed=2)
    model = from_hf(hf)
    opt = FAMILIES["opt"]
    back = transformers.OPTForCausalLM(transformers.OPTConfig(**opt.to_hf(model.cfg), **NO_TOKENS, **ATTN)).eval()
    back.load_state_dict(archlab_state_to_hf(model.cfg, model.state_dict(), family="opt"), strict=False)
    assert max_diff(logits(back), logits(model)) <= TOL
    assert config_from_hf(back.config) == model.cfg


def test_from_hf_reads_each_family_s_parts():
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
    mqa, mha = cfgs["bigcode-mqa"].attention, cfgs["bigcode-mha-unscaled-gelu-fast"].attention
    assert (mqa.n_kv_head, mqa.scale, mha.n_kv_head, mha.scale) == (1, None, None, 1.0)
    assert cfgs["bigcode-mqa"].mlp.approximate == "tanh"
    bloom = cfgs["bloom"]
    assert (bloom.position.kind, bloom.embedding_norm, bloom.mlp.d_ff, bloom.context_length) == (
        "alibi",
        True,
        256,
        2048,
    )


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_greedy_and_padded_generation_match_hf_generate(case):
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


@pytest.mark.parametrize("case", ["opt-350m-layout", "bigcode-mqa", "bloom"])
def test_save_pretrained_directory_loads_and_saves_again(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=5), tmp_path, attn_implementation="eager")


NANO = ["model=nano", "model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.d_model=64"]
# archlab layouts no earlier family held -> the class they export to
LAYOUT_CASES = {
    "post-norm": ([*NANO, "model/block=post"], "OPTForCausalLM"),
    "post-norm-no-biases-relu": (
        [
            *NANO,
            "model/block=post",
            "model/mlp=relu",
            "model.attention.qkv_bias=false",
            "model.attention.out_bias=false",
            "model.mlp.bias=false",
        ],
        "OPTForCausalLM",
    ),
    "narrower-embeddings": ([*NANO, "model.embedding_dim=48", "model.head.tied=false"], "OPTForCausalLM"),
    "mqa": ([*NANO, "model/attention=mqa"], "GPTBigCodeForCausalLM"),
    "alibi-embedding-norm": ([*NANO, "model/position=alibi", "model.embedding_norm=true"], "BloomForCausalLM"),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_archlab_layout_exports_to_the_family_and_back_bit_for_bit(case):
    overrides, expected_class = LAYOUT_CASES[case]
    model = randomize(build_model(compose_model(overrides)), seed=3)
    parity.check_to_hf_and_back(model, expected_class, attn_implementation="eager")


@pytest.mark.parametrize(
    "overrides, field",
    [
        ([*NANO, "model/block=post", "model.mlp.bias=false"], "model.mlp.bias"),  # one enable_bias
        ([*NANO, "model/block=post", "model/position=rope"], "model.block.kind"),
        (
            [*NANO, "model/attention=gqa", "model.attention.n_head=4", "model.attention.n_kv_head=2"],
            "model.attention.n_kv_head",
        ),
        ([*NANO, "model/attention=mqa", "model.attention.scale=0.5"], "model.attention.scale"),
        ([*NANO, "model/position=alibi"], "model.embedding_norm"),
        ([*NANO, "model/position=alibi", "model.embedding_norm=true", "model.mlp.d_ff=96"], "model.mlp.d_ff"),
        (
            [*NANO, "model/position=alibi", "model.embedding_norm=true", "model.mlp.approximate=none"],
            "model.mlp.approximate",
        ),
        ([*NANO, "model.embedding_dim=48", "model.dropout=0.1", "model.norm.eps=1e-6"], "model.norm.eps"),
    ],
)
def test_layouts_these_families_cannot_hold_are_refused_naming_the_field(overrides, field):
    from archlab.interop.hf import config_to_hf

    with pytest.raises(ConfigError) as err:
        config_to_hf(compose_model(overrides))
    assert err.value.field == field and "Hugging Face" in str(err.value)


@pytest.mark.parametrize(
    "config_class, keys, field",
    [
        ("OPTConfig", dict(OPT_SMALL, layerdrop=0.1), "OPTConfig.layerdrop"),
        ("OPTConfig", dict(OPT_SMALL, _remove_final_layer_norm=True), "OPTConfig._remove_final_layer_norm"),
        ("OPTConfig", dict(OPT_SMALL, activation_function="quick_gelu"), "OPTConfig.activation_function"),
        ("GPTBigCodeConfig", dict(BIGCODE_SMALL, add_cross_attention=True), "GPTBigCodeConfig.add_cross_attention"),
        (
            "GPTBigCodeConfig",
            dict(BIGCODE_SMALL, activation_function="quick_gelu"),
            "GPTBigCodeConfig.activation_function",
        ),
        (
            "BloomConfig",
            dict(BLOOM_SMALL, apply_residual_connection_post_layernorm=True),
            "BloomConfig.apply_residual_connection_post_layernorm",
        ),
    ],
)
def test_hf_settings_archlab_cannot_hold_are_refused_naming_the_key(config_class, keys, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(getattr(transformers, config_class)(**keys))
    assert err.value.field == field


def test_numerics_only_settings_are_read_as_the_same_model():
    """GPTBigCode's softmax-in-fp32 flags (stored, unread by transformers' attention) and BLOOM's
    tensor-parallel slicing (the same sums in slices) leave the layout as it is."""
    base = config_from_hf(transformers.GPTBigCodeConfig(**BIGCODE_SMALL))
    flags = dict(attention_softmax_in_fp32=False, scale_attention_softmax_in_fp32=False)
    assert config_from_hf(transformers.GPTBigCodeConfig(**BIGCODE_SMALL, **flags)) == base
    bloom = config_from_hf(transformers.BloomConfig(**BLOOM_SMALL))
    assert config_from_hf(transformers.BloomConfig(**BLOOM_SMALL, pretraining_tp=2, slow_but_exact=True)) == bloom


# ---------------------------------------------------------------- model.embedding_dim


def test_every_other_family_refuses_embedding_dim():
    cfg = validate(tiny(embedding_dim=16))
    for name, family in families_of_its_mixers(cfg).items():
        fields = {p.field for p in family.problems(cfg)}
        assert ("model.embedding_dim" in fields) == (name != "opt"), name


def test_embedding_dim_projects_in_before_the_blocks_and_out_before_the_head():
    """The first block reads project_in(E[idx]) + the position row; the logits are the head's of
    project_out(final_norm(last block's output)), each written out here."""
    cfg = tiny(embedding_dim=20, position={"kind": "learned"}, head={"tied": True})
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64).eval()
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.setdefault("first", args[0]))
    model.blocks[-1].register_forward_hook(lambda m, args, out: seen.setdefault("last", out))
    idx = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(idx)
    assert model.project_in is not None and model.project_out is not None and model.final_norm is not None
    E, W_in, W_out = model.tok_emb.weight, model.project_in.weight, model.project_out.weight
    assert E.shape == (48, 20) and W_in.shape == (32, 20) and W_out.shape == (20, 32)
    table = model.position.get_submodule("table").get_parameter("weight")
    torch.testing.assert_close(seen["first"], E[idx] @ W_in.T + table[:10])
    hidden = F.rms_norm(seen["last"], (32,), model.final_norm.get_parameter("weight"), 1e-3)
    torch.testing.assert_close(out, hidden @ W_out.T @ E.T)


def test_embedding_dim_is_counted_in_closed_form_and_validated():
    V, d, e = 48, 32, 20
    for tied in (True, False):
        cfg = tiny(embedding_dim=e, head={"tied": tied})
        counts, plain = count_params(cfg), count_params(tiny(head={"tied": tied}))
        assert counts["token_embedding"] == V * e and counts["embedding_projection"] == 2 * e * d
        assert counts["head"] == (0 if tied else V * e) and plain["embedding_projection"] == 0
        assert counts["total"] - plain["total"] == (V * e - V * d) * (1 if tied else 2) + 2 * e * d
        check_build(cfg, build_model(cfg, device="meta"))
    for bad in (0, -3, 2.5, True, "16", 32):  # 32 = d_model: no projection to add
        with pytest.raises(ConfigError) as err:
            validate(dataclasses.replace(tiny(), embedding_dim=bad))
        assert err.value.field == "model.embedding_dim"


def test_archlab_check_counts_gpt2_with_narrower_embeddings_in_closed_form(capsys):
    """GPT-2 small (124,439,808) with token embeddings of 256: the table shrinks to 50257·256 and the
    projections add 2·256·768. OPT holds the projections; it drops no embeddings, so GPT-2's embedding
    dropout goes (model.embedding_dropout=0.0) for it to hold the rest."""
    overrides = ["model=gpt2", "model.embedding_dim=256", "model.embedding_dropout=0.0", "format=json"]
    assert run(compose("check", overrides), overrides) == 0
    result = json.loads(capsys.readouterr().out)
    total = 124_439_808 - 50257 * 768 + 50257 * 256 + 2 * 256 * 768
    assert result["analytic"]["total"] == result["built"]["total"] == total
    assert result["analytic"]["embedding_projection"] == 2 * 256 * 768
    assert result["hf_export"]["exports_to"] == "OPTForCausalLM"


def test_embedding_dim_trains_and_decodes_through_the_cache():
    cfg = tiny(embedding_dim=20, head={"tied": False})
    torch.manual_seed(0)
    model = build_model(cfg)
    losses = short_fit(model, cfg.vocab_size, 16)
    assert losses[-1] < losses[0]
    assert model.project_in is not None and model.project_out is not None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        steps = [model(idx[:, :5], cache)] + [model(idx[:, t : t + 1], cache) for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
